"""Head view at 512 tokens in headless Chromium: time to first draw, redraw after a hover, page size.

    python benchmarks/bench_view.py                 # minilm and smollm2, 512 tokens
    python benchmarks/bench_view.py --models minilm --tokens 1024 --heads 1

For each model: ``probe.show(lm, text)`` on a text of the sample sentences cut to N tokens (the view
keeps the layers that fit in MAX_VALUES numbers), saved as a page, opened in headless Chromium
(Playwright). Printed, measured in the page with performance.now():
- first draw: from navigation start to the end of the first draw (HTML parse, JSON parse, DOM
  build, first draw), and the view's own part (its script's start to the first draw);
- redraw after a hover: the synchronous draw that a mousemove onto a new token triggers (lines,
  labels of the visible rows, the heatmap strip), median and max over 40 hovers spread over the
  text, with one head and with every head of the layer overlaid; also in word mode;
- redraw after a scroll, and the page's size.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def long_text(lm, tokens: int) -> str:
    from probe.text.corpus import sample_texts

    text = " ".join(sample_texts())
    while len(lm.tokenizer(text, verbose=False)["input_ids"]) < tokens:
        text = text + " " + text
    return text


def hovers(page, v: str, n: int, count: int = 40) -> list[float]:
    out = []
    for k in range(count):
        i = (k * 37 + 3) % n
        pt = page.evaluate(f"{v}.point('q', {i})")
        page.mouse.move(pt["x"], pt["y"])
        st = page.evaluate(f"{v}.state()")
        assert st["focus"] == {"side": "q", "i": i}, st
        out.append(page.evaluate(f"{v}.timings.lastDrawMs"))
    return out


def measure(path: Path, heads: int) -> dict:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            requests, errors = [], []
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
            t = time.perf_counter()
            page.goto(path.as_uri())
            page.wait_for_selector(".probe-hv[data-draws]")
            wall = (time.perf_counter() - t) * 1000
            v = "document.querySelector('.probe-hv').probeView"
            timings = page.evaluate(f"{v}.timings")
            n = page.evaluate(f"{v}.data.n")
            page.evaluate(f"{v}.setHeads([0])")
            one = hovers(page, v, n)
            page.evaluate(f"{v}.setHeads([...Array({heads}).keys()])")
            many = hovers(page, v, n)
            t = time.perf_counter()
            page.evaluate(f"{v}.setMode('words')")
            words_switch = (time.perf_counter() - t) * 1000
            units = page.evaluate(f"{v}.state().units")
            words = hovers(page, v, units, 20)
            scroll = page.evaluate(f"""(() => {{ const r = document.querySelector('.probe-hv .hv-scroll');
                const t = performance.now(); r.scrollTop = r.scrollTop + 900; {v}.redraw();
                return performance.now() - t; }})()""")
            return {"n": n, "wall_ms": wall, **timings, "one": one, "many": many, "words_switch_ms": words_switch,
                    "words": words, "scroll_ms": scroll, "requests": requests, "errors": errors}
        finally:
            browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="minilm,smollm2")
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        raise SystemExit("no Chromium on PATH (apt-get install chromium)")
    from probe import load_model, show

    tmp = Path(tempfile.mkdtemp())
    for name in args.models.split(","):
        lm = load_model(name)
        text = long_text(lm, args.tokens)
        t = time.perf_counter()
        view = show(lm, text, max_length=args.tokens)
        build = time.perf_counter() - t
        page = view.save(tmp / f"{name}.html")
        r = measure(page, lm.geometry.n_heads)
        med = statistics.median
        print(f"{name}: {r['n']} tokens, layers {view.data['layers']} of {lm.geometry.n_layers}, "
              f"{view.data['values']:,} values; page {page.stat().st_size / 1e6:.2f} MB; show() {build:.2f} s")
        print(f"  first draw: {r['firstDrawAt']:.0f} ms after navigation start (view's script "
              f"{r['firstDrawMs']:.0f} ms, of which mount {r['mountMs']:.0f} ms); goto -> drawn {r['wall_ms']:.0f} ms")
        print(f"  redraw after hover, 1 head: median {med(r['one']):.1f} ms, max {max(r['one']):.1f} ms; "
              f"{lm.geometry.n_heads} heads overlaid: median {med(r['many']):.1f} ms, max {max(r['many']):.1f} ms")
        print(f"  word mode: switch {r['words_switch_ms']:.0f} ms (aggregates {lm.geometry.n_heads} heads), "
              f"hover median {med(r['words']):.1f} ms; redraw after scroll {r['scroll_ms']:.1f} ms")
        print(f"  requests {r['requests'] == [page.as_uri()]} (only the page itself), console errors {r['errors']}")


if __name__ == "__main__":
    main()
