"""The live page at a phone's width, as a new user meets it: what each box says can be read whole."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
from test_live import TOKEN, Served  # noqa: E402

from conftest import CHROMIUM_ARGS, tiny_model  # noqa: E402
from probe.live.session import LiveSession  # noqa: E402


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_the_corrupted_texts_placeholder_shows_whole_at_phone_width(chromium, kind):
    """The corrupted text's box says what it does (a decoder: "turns on activation patching") or why it is off (a
    bare encoder: "no patching on this model"): at 390 px and at 1,200 px the whole placeholder is in view (the
    box's scrollHeight, which counts the placeholder in Chromium, within its clientHeight). Before, at 390 px the
    one-line box showed the first of its two lines (scrollHeight 46 px in a 28 px box on minilm)."""
    sync_api, executable = chromium
    session = LiveSession(tiny_model(kind))
    with Served(session) as base, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            for width in (390, 1200):
                page = browser.new_page(viewport={"width": width, "height": 900})
                messages = []
                page.on("console", lambda m, out=messages: out.append(f"{m.type}: {m.text}"))
                page.goto(f"{base}/?token={TOKEN}")
                page.wait_for_selector(".probe-live[data-ready='1']", timeout=60_000)
                box = page.evaluate("""() => { const t = document.querySelector('textarea.pl-corrupt');
                    return {text: t.placeholder, scroll: t.scrollHeight, client: t.clientHeight}; }""")
                assert box["text"].startswith("Corrupted text"), box
                assert box["scroll"] <= box["client"], (width, box)
                assert page.evaluate("document.documentElement.scrollWidth") == width
                assert messages == [], messages
                page.close()
        finally:
            browser.close()
