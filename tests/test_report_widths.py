"""Every kind of report page at a phone's width and at a desktop's: at 390 px the page is 390 px wide
(``document.documentElement.scrollWidth``; wide figures and tables scroll in their own boxes, side-by-side
boxes wrap under each other), and at 1,200 px it keeps its layout (as wide as the window, side-by-side
boxes beside each other). Each page is written by the command line on a tiny model, as a user's would be."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_edge_circuits import PAIRS_TSV

from conftest import CHROMIUM_ARGS, invoke_cli, save_tiny, watched_page

TEXT = "The cat sat on the mat. When Mary and John went to the store, John gave a drink to Mary."
SENTENCES = ["The cat sat on the mat and looked at the dog.", "When Mary and John went to the store, John gave a "
             "drink to Mary.", "A quick brown fox jumps over the lazy dog.", "It was happy to see the sun again.",
             "The committee approved the budget after a long debate.", "She read the letter twice before she "
             "answered it."]

#: Report kind -> the command line that writes it (``{bert}``, ``{gpt2}``, ``{vit}``, ``{whisper}``, ``{pairs}``,
#: ``{corpus}``, ``{image}``, ``{clip}``, ``{a}``, ``{b}``: the files made by :func:`pages`).
COMMANDS = {
    "analyze-encoder": ("analyze", "--model", "{bert}", "--corpus", "{corpus}"),
    "analyze-decoder": ("analyze", "--model", "{gpt2}", "--corpus", "{corpus}"),
    "why": ("why", "--model", "{gpt2}", "--text", TEXT, "--head", "L1H1"),
    "circuit": ("circuit", "--model", "{gpt2}", "--pairs", "{pairs}", "--method", "eap", "--shares", "0.1,0.5",
                "--seeds", "2"),
    "patch": ("patch", "--model", "{gpt2}", "--pairs", "{pairs}"),
    "path": ("path", "--model", "{gpt2}", "--pairs", "{pairs}", "--senders", "L0H1,L0H2", "--receivers",
             "logits,L1H0.q"),
    "effects": ("effects", "--model", "{bert}", "--corpus", "{corpus}", "-n", "6"),
    "prune": ("prune", "--model", "{bert}", "--corpus", "{corpus}", "--steps", "2"),
    "compare": ("compare", "{a}", "{b}"),
    "images": ("analyze", "--model", "{vit}", "--image", "{image}"),
    "speech": ("analyze", "--model", "{whisper}", "--audio", "{clip}", "--generate", "6"),
}


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """Report kind -> its index.html, each written by ``probe`` on a tiny model."""
    from speech_models import save_whisper, write_tone
    from test_images import picture
    from vision_models import save_vision

    root = tmp_path_factory.mktemp("widths")
    files = {"bert": save_tiny("bert", root / "bert"), "gpt2": save_tiny("gpt2", root / "gpt2"),
             "vit": save_vision("vit", root / "vit"), "whisper": save_whisper(root / "whisper"),
             "pairs": root / "pairs.tsv", "corpus": root / "corpus.txt", "image": root / "a.png",
             "clip": write_tone(root / "a.wav", 1.0), "a": root / "analyze-encoder", "b": root / "a-again"}
    files["pairs"].write_text(PAIRS_TSV, encoding="utf-8")
    files["corpus"].write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    picture(48, 32).save(files["image"])
    out = {}
    for kind, command in COMMANDS.items():
        if kind == "compare":
            again = invoke_cli("analyze", "--model", files["bert"], "--corpus", files["corpus"], "--limit", 4,
                               "--out", files["b"], "--no-progress")
            assert again.exit_code == 0, again.output
        args = [a.format(**files) for a in command]
        result = invoke_cli(*args, "--out", root / kind, *(() if kind == "compare" else ("--no-progress",)))
        assert result.exit_code == 0, (kind, result.output)
        out[kind] = root / kind / "index.html"
    return out


#: The elements wider than the window that no scrolling box holds (tag, class, right edge in px).
WIDE = """w => [...document.querySelectorAll('body *')].filter(e => {
    if (e.getBoundingClientRect().right <= w + 1) return false;
    for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if (o === 'auto' || o === 'scroll' || o === 'hidden') return false;
    }
    return true;
  }).slice(0, 8).map(e => `${e.tagName}.${e.className} ${Math.round(e.getBoundingClientRect().right)}`)"""


def _drawn(page) -> None:
    page.wait_for_load_state("load")
    page.wait_for_timeout(200)  # the inline scripts draw at load; a page without figures sets no flag


@pytest.mark.parametrize("kind", list(COMMANDS))
def test_every_report_kind_is_as_wide_as_a_phone(pages, chromium, kind, tmp_path):
    """At 390 px: the page is 390 px wide (before, the smollm2, why and circuit pages were 519 px, the
    side-by-side "highest induction" and "highest duplicate" tables overlapping, and the compare page 695
    px); no console message. At 1,200 px: 1,200 px wide, as before."""
    path = tmp_path / "index.html"
    shutil.copy(pages[kind], path)
    for width in (390, 1200):
        with watched_page(chromium, path, viewport=(width, 800)) as (page, messages, requests):
            _drawn(page)
            wide = page.evaluate(WIDE, width)  # what sticks out, to say where in a failure
            assert page.evaluate("document.documentElement.scrollWidth") == width, (kind, width, wide)
            assert messages == [], messages
            assert [u for u in requests if not u.startswith(("data:", "file:"))] == []


def test_side_by_side_tables_wrap_at_phone_width_and_stand_beside_each_other_at_desktop_width(pages, chromium):
    """The decoder page's "highest induction" and "highest duplicate" tables: at 390 px one under the other,
    neither overlapping the other nor the window's edge; at 1,200 px side by side, as before."""
    for width, beside in ((390, False), (1200, True)):
        with watched_page(chromium, pages["analyze-decoder"], viewport=(width, 800)) as (page, _, _):
            _drawn(page)
            boxes = page.evaluate("""() => [...document.querySelectorAll('h3')]
                .filter(h => h.textContent.startsWith('highest '))
                .map(h => { const r = h.parentElement.getBoundingClientRect();
                            return [h.textContent, r.left, r.right, r.top, r.bottom]; })""")
            assert [b[0] for b in boxes] == ["highest induction", "highest duplicate"], boxes
            (_, l1, r1, t1, b1), (_, l2, r2, t2, b2) = boxes
            assert r1 <= width and r2 <= width
            overlap = min(r1, r2) > max(l1, l2) and min(b1, b2) > max(t1, t2)
            assert not overlap, boxes
            assert (abs(t1 - t2) < 1) == beside, boxes  # same top: beside each other


def test_step_view_table_keeps_its_columns_beside_the_strip_at_phone_width(chromium, tmp_path):
    """An encoder report's attention steps at 390 px: the table is as wide as its columns (its right edge at
    its last header's) and the heat strip starts right of it, the step view's box scrolling both together.
    Before, the phone rule that makes every report table a scroll box let the table shrink beside the strip
    to 164 of its 578 px on minilm: probability and the value norms sat in a box of their own, three columns
    wide."""
    folder = save_tiny("bert", tmp_path / "bert")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    result = invoke_cli("analyze", "--model", folder, "--corpus", corpus, "--out", tmp_path / "run", "--no-progress")
    assert result.exit_code == 0, result.output
    for width in (390, 1200):
        with watched_page(chromium, tmp_path / "run" / "index.html", viewport=(width, 800)) as (page, messages, _):
            _drawn(page)
            views = page.evaluate("""() => [...document.querySelectorAll('.probe-sv')].map(sv => {
                const t = sv.querySelector('.sv-scroll table'), c = sv.querySelector('.sv-scroll canvas');
                const ths = t.querySelectorAll('th'), last = ths[ths.length - 1].getBoundingClientRect();
                const box = sv.querySelector('.sv-scroll');
                return {right: t.getBoundingClientRect().right, lastTh: last.right, width: t.clientWidth,
                        scroll: t.scrollWidth, strip: c.getBoundingClientRect().left,
                        boxScroll: box.scrollWidth, boxWidth: box.clientWidth};
            })""")
            assert views, "the report has no step view"
            for v in views:
                assert v["scroll"] <= v["width"] + 1, (width, v)  # no columns hidden in the table's own scroll
                assert abs(v["right"] - v["lastTh"]) <= 1, (width, v)
                assert v["strip"] >= v["right"], (width, v)
                if width == 390:
                    assert v["boxScroll"] > v["boxWidth"], v  # the box scrolls the table and the strip
            assert page.evaluate("document.documentElement.scrollWidth") == width
            assert messages == [], messages


def test_a_chart_title_wider_than_its_chart_wraps(chromium):
    """A bar chart's title wider than its plot breaks at spaces into lines each within the plot's width, and the
    chart grows by a line's height (14 px) for each line more. Before, at 390 px ``probe why``'s "score of each top
    key by (query source x key source)" ran off the canvas at "key sour"."""
    from probe.report import static_text

    long = "score of each top key by (query source x key source) on a phone's narrow page"
    sync_api, executable = chromium
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 390, "height": 800})
            page.set_content("<div style='width: 300px'><canvas id='c'></canvas></div><div id='tip'></div>"
                             f"<script>{static_text('charts.js')}</script>")
            draw = """t => { const c = document.getElementById('c');
                window.probeCharts.bars(c, {kind: 'bars', mode: 'stack', title: t, categories: ['a', 'b'],
                    series: [{name: 's', color: '#2c6fbb', values: [1, 2]}], vmax: 2}, document.getElementById('tip'));
                return c.clientHeight; }"""
            short_h, long_h = page.evaluate(draw, "short"), page.evaluate(draw, long)
            plot_w = 300 - 62 - 10  # the bars' plot: the box's width less the left and right margins
            lines = page.evaluate("""([t, w]) => { const ctx = document.createElement('canvas').getContext('2d');
                const ls = window.probeCharts.titleLines(ctx, t, w); ctx.font = 'bold 12px sans-serif';
                return ls.map(l => [l, ctx.measureText(l).width]); }""", [long, plot_w])
        finally:
            browser.close()
    assert len(lines) >= 2 and " ".join(line for line, _ in lines) == long, lines
    assert all(width <= plot_w for _, width in lines), lines
    assert long_h - short_h == 14 * (len(lines) - 1), (short_h, long_h, lines)


@pytest.mark.browser
@pytest.mark.parametrize("chart", ["bars", "scatter"])
def test_a_chart_legend_is_as_tall_as_the_rows_it_is_drawn_in(chromium, chart):
    """A chart's legend takes the height of the rows it wraps into at the width it is drawn at (the plot's): the
    chart with nine named series is taller than with one by 16 px a row more, the rows counted here by breaking
    the names at the plot's width with the canvas's own text widths. Before, the legend was measured 12 px (bars)
    or 40 px (scatter) wider than drawn: on ``probe why``'s page "other pairs" wrapped to a third row that had no
    room and was drawn over the top of the bars."""
    from probe.report import static_text

    names = ["L20H0 x MLP11", "L20H0 x MLP18", "L20H0 x MLP20", "MLP22 x MLP15", "L20H0 x MLP10", "MLP20 x MLP18",
             "MLP20 x MLP11", "MLP20 x L22H1", "other pairs"]
    box, margins = 540, {"bars": 62 + 10, "scatter": 44 + 12}[chart]
    sync_api, executable = chromium
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 800})
            page.set_content(f"<div style='width: {box}px'><canvas id='c'></canvas></div><div id='tip'></div>"
                             f"<script>{static_text('charts.js')}</script>")
            draw = """([kind, names]) => { const c = document.getElementById('c'), tip = document.getElementById('tip');
                if (kind === 'bars') window.probeCharts.bars(c, {kind, mode: 'stack', title: 't', categories: ['a'],
                    series: names.map(n => ({name: n, color: '#2c6fbb', values: [1]})), vmax: 9}, tip);
                else window.probeCharts.scatter(c, {kind, title: 't', xs: [0, 1], ys: [0, 1], colors: ['#111', '#222'],
                    legend: names.map(n => [n, '#2c6fbb'])}, tip);
                return c.clientHeight; }"""
            one, nine = page.evaluate(draw, [chart, names[:1]]), page.evaluate(draw, [chart, names])
            widths = page.evaluate("""names => { const ctx = document.createElement('canvas').getContext('2d');
                ctx.font = '11px sans-serif'; return names.map(n => 16 + ctx.measureText(n).width + 12); }""", names)
        finally:
            browser.close()
    plot_w, rows, x = box - margins, 1, 0.0
    for w in widths:
        if x + w > plot_w and x > 0:
            rows, x = rows + 1, 0.0
        x += w
    assert rows >= 2, widths
    assert nine - one == 16 * (rows - 1), (one, nine, rows, widths)
