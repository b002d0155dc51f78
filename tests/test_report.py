"""The run folder and its HTML report: self-contained, escaped, fast to write, and drawn right in a
real browser (headless Chromium through Playwright; skipped with the reason where either is missing)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import probe
from conftest import CHROMIUM_ARGS, browser_or_skip, tiny_model, watched_page
from probe.report import CSP, MAX_HEATMAP_TOKENS, write_run
from probe.runs.analysis import analyze

NASTY = "Look: <script>alert(1)</script> & <b>bold</b> $x^2$ </script><script>alert(2)</script> text."
TEXTS = ["The cat sat on the mat, and then it slept.", NASTY, "Short one."]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    lm = tiny_model("bert")
    res = analyze(lm, TEXTS, n_examples=3)
    return write_run(res, lm.tokenizer, tmp_path_factory.mktemp("report") / "run", timings={"model_load_s": 0.5}), res


def _data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="probe-data">(.*?)</script>', html, re.S)
    assert m, "no data block"
    return json.loads(m.group(1))


def test_files_and_timings(run_dir):
    path, res = run_dir
    assert sorted(p.name for p in path.iterdir()) == [
        ".probe-files.json", "examples.npz", "heads.csv", "index.html", "run.json"]
    rec = json.loads((path / "run.json").read_text(encoding="utf-8"))
    t = rec["timings_s"]
    assert t["report_s"] > 0 and t["model_load_s"] == 0.5 and t["analyze_s"] > 0
    assert rec["counts"]["sequences"] == 3 and rec["settings"]["example_tokens"] == 64


def test_index_html_is_self_contained_and_escaped(run_dir):
    html = (run_dir[0] / "index.html").read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html>")
    assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in html.replace("&#39;", "'")
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
    assert not re.search(r"""@import|url\(\s*["']?\s*(?:https?:)?//""", html, re.I)
    assert "<script>alert(1)</script>" not in html and "<script>alert(2)</script>" not in html
    assert "<b>bold</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in html
    # exactly six script elements: the model view's data and its script, the head view's data
    # and its script, the data block and the heatmap renderer; token text cannot close them
    opened = re.findall(r"<script\b[^>]*>", html)
    assert opened == ['<script type="application/json" class="probe-mv-data">', "<script>",
                      '<script type="application/json" class="probe-hv-data">', "<script>",
                      '<script type="application/json" id="probe-data">', "<script>"]
    assert len(re.findall(r"</script>", html)) == 6


def test_figure_data_matches_the_result(run_dir):
    """Every canvas has its data; the attention data are the example's probabilities rounded to
    1e-3 (stored as integers /1000), the statistic grids the heads' values rounded to 1e-4."""
    path, res = run_dir
    html = (path / "index.html").read_text(encoding="utf-8")
    data = _data(html)["figures"]
    ids = re.findall(r'<canvas data-fig="([^"]+)"', html)
    assert ids and set(ids) == set(data)
    stat = data["stat-prev"]
    grid = res.heads.pivot(index="layer", columns="head", values="prev").to_numpy()
    np.testing.assert_allclose(np.array(stat["values"]).reshape(grid.shape) / 10000, grid, atol=5e-5)
    attn = [k for k in data if k.startswith("attn-")]
    assert attn
    layer, head, ex = map(int, attn[0].split("-")[1:])
    fig = data[attn[0]]
    n = fig["rows"]
    probs = res.examples[ex].probs[layer, head, :n, :n]
    np.testing.assert_allclose(np.array(fig["values"]).reshape(n, n) / 1000, probs, atol=5e-4)
    assert fig["rowLabels"][0] == "[CLS]" and len(fig["rowLabels"]) == n <= MAX_HEATMAP_TOKENS


def test_report_with_an_infinite_verification_difference(tmp_path):
    lm = tiny_model("bert")
    res = analyze(lm, ["The cat sat on the mat."], n_examples=1)
    record = {"model": "m", "passed": False, "max_abs_diff": "inf", "per_layer": [], "cases": []}
    path = write_run(res, lm.tokenizer, tmp_path / "run", verification=record)
    assert "max absolute difference inf" in (path / "index.html").read_text()


def test_long_example_is_cropped_and_marked(tmp_path):
    lm = tiny_model("bert")
    res = analyze(lm, [" ".join(["word"] * 200)], n_examples=1, max_length=64)
    html = (write_run(res, lm.tokenizer, tmp_path / "r") / "index.html").read_text()
    assert re.search(r"Example 1 \(64 tokens, truncated\): word word .* \[\.\.\.\]</blockquote>", html)


# --------------------------------------------------------------------------- in a real browser

_browser = browser_or_skip  # the name other test modules import


def test_the_report_does_not_scroll_sideways_in_a_phone_wide_window(run_dir, chromium):
    """At 390 px the page is as wide as the window: wide figures (the rollout view, 834 px) scroll in
    their own box."""
    path, _ = run_dir
    with watched_page(chromium, path / "index.html", viewport=(390, 800)) as (page, messages, _):
        page.wait_for_function("document.body.getAttribute('data-figures-drawn') !== null")
        assert page.evaluate("document.documentElement.scrollWidth") == 390
        assert messages == []


def test_report_draws_every_figure_offline_in_chromium(run_dir, chromium):
    """Every canvas is drawn, the page makes no request beyond itself and logs no error, and the
    tooltip of an attention cell shows that cell's probability from the data."""
    path, res = run_dir
    with watched_page(chromium, path / "index.html") as (page, messages, requests):
        page.wait_for_function("document.body.getAttribute('data-figures-drawn') !== null")
        n = int(page.evaluate("document.body.getAttribute('data-figures-drawn')"))
        assert n == len(_data((path / "index.html").read_text())["figures"]) > 11
        assert page.evaluate("document.querySelectorAll('canvas[data-drawn]').length") == n
        assert messages == []
        assert requests == [(path / "index.html").as_uri()]
        # an attention canvas: hover the cell (row 2, col 1) and read the tooltip back
        fid = page.evaluate("document.querySelector('canvas[data-fig^=attn]').getAttribute('data-fig')")
        layer, head, ex = map(int, fid.split("-")[1:])
        box = page.evaluate(f"""(() => {{ const c = document.querySelector('canvas[data-fig="{fid}"]');
            c.scrollIntoView(); const r = c.getBoundingClientRect(); const g = c._geom;
            return {{x: r.left + g.left + 1.5 * g.cell, y: r.top + g.top + 2.5 * g.cell}}; }})()""")
        page.mouse.move(box["x"], box["y"])
        tip = page.evaluate("document.querySelector('.tip').textContent")
        expected = res.examples[ex].probs[layer, head, 2, 1]
        value = float(re.search(r": ([\d.]+)$", tip).group(1))
        assert abs(value - expected) <= 5e-4, (tip, expected)
        # the canvas pixel under that cell has the colour the renderer assigns to the value
        colour = page.evaluate(f"""(() => {{ const c = document.querySelector('canvas[data-fig="{fid}"]');
            const g = c._geom, d = window.devicePixelRatio || 1;
            const px = c.getContext('2d').getImageData(Math.round((g.left + 1.5 * g.cell) * d),
                Math.round((g.top + 2.5 * g.cell) * d), 1, 1).data;
            return [px[0], px[1], px[2], window.probeHeatmap.color('blues', {round(float(expected), 3)})]; }})()""")
        want = [int(x) for x in re.findall(r"\d+", colour[3])]
        assert all(abs(a - b) <= 2 for a, b in zip(colour[:3], want)), colour


def toy_section(result, tokenizer):
    """A section builder for the test below: present only when the toy result is."""
    from probe.report.sections import Section, render_fragment

    if "toy" not in result.results:
        return None
    html = render_fragment("section_table.html.j2", columns=["a", "b"], rows=[["<x>", 1]], caption="toy & co")
    fig = {"rows": 1, "cols": 2, "scale": 1, "vmin": 0, "vmax": 1, "cmap": "viridis", "values": [0, 1],
           "title": "toy"}
    return Section("toy", "A toy section", html, figures={"toy-fig": fig}, files={"toy.csv": "a,b\n1,2\n"},
                   record={"rows": 1}, order=10)


def test_sections_add_html_figures_files_and_record(tmp_path, monkeypatch):
    import probe.report.sections as sections

    monkeypatch.setattr(sections, "BUILDERS", [toy_section])
    lm = tiny_model("bert")
    res = analyze(lm, TEXTS[:1], n_examples=1)
    plain = write_run(res, lm.tokenizer, tmp_path / "plain")
    assert not (plain / "toy.csv").exists() and "A toy section" not in (plain / "index.html").read_text()
    res.results["toy"] = object()
    path = write_run(res, lm.tokenizer, tmp_path / "with")
    html = (path / "index.html").read_text()
    assert '<h2 id="toy">A toy section</h2>' in html and "&lt;x&gt;" in html and "toy &amp; co" in html
    assert "toy-fig" in _data(html)["figures"]
    assert (path / "toy.csv").read_text() == "a,b\n1,2\n"
    rec = json.loads((path / "run.json").read_text())
    assert rec["toy"] == {"rows": 1} and rec["output"]["toy.csv"].endswith("toy.csv")


#: Every section builder of probe, registered where it is defined (module, function).
ALL_BUILDERS = {
    ("probe.report.cross", "cross_attention_section"), ("probe.report.images", "image_maps_section"),
    ("probe.report.norms", "value_weighted_section"), ("probe.report.speech", "speech_section"),
    ("probe.report.speech", "frames_section"),
    ("probe.report.sinks", "sink_profile_section"), ("probe.report.routers", "routers_section"),
    ("probe.patterns.report", "health_section"),
    ("probe.patterns.report", "groups_section"), ("probe.patterns.report", "types_section"),
    ("probe.patterns.report", "circuits_section"), ("probe.effects.report", "section"),
    ("probe.effects.patch_report", "section"), ("probe.linguistic.report", "coref_section"),
    ("probe.linguistic.report", "syntax_section"), ("probe.pruning.report", "section"),
    ("probe.view.rollout", "rollout_section"), ("probe.view.section", "head_view_section"),
    ("probe.view.section", "model_view_section"), ("probe.view.section", "steps_section"),
    ("probe.circuits.report", "section"), ("probe.circuits.path_report", "section"), ("probe.qk.report", "section"),
}


def test_every_section_registers_itself_whatever_is_imported_first():
    """The report imports no section (a leaf): building a page loads the section modules by name, and
    each registers its builders, once, whatever was imported before."""
    code = ("import sys; import probe.report.sections as s; from probe.report import write_run; "
            "print(any(m in sys.modules for m in ('probe.effects', 'probe.pruning', 'probe.view'))); "
            "s.load_sections(); print(sorted(f'{b.__module__} {b.__name__}' for b in s.BUILDERS))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["False", str(sorted(f"{m} {f}" for m, f in ALL_BUILDERS))]
    import probe.report.sections as sections

    sections.load_sections()
    assert {(b.__module__, b.__name__) for b in sections.BUILDERS} == ALL_BUILDERS
    assert len(sections.BUILDERS) == len(ALL_BUILDERS)  # each once
    assert set(sections.SECTION_MODULES) == {m for m, _ in ALL_BUILDERS}


def test_sections_have_distinct_orders_so_the_page_order_does_not_depend_on_imports():
    orders = []
    for path in Path(probe.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Section":
                orders += [k.value.value for k in node.keywords if k.arg == "order"]
    assert len(orders) == len(ALL_BUILDERS) and len(set(orders)) == len(orders), sorted(orders)


def test_a_head_labelled_on_repeated_tokens_says_when_nothing_repeats():
    """Issue 27 item 7: an induction head drawn on text where nothing repeats showed a plain stripe
    with no word; the caption now says that the map is not the pattern the label was given for."""
    from dataclasses import replace

    from probe.report import _attention_figures, repeat_note

    assert repeat_note("induction", [5, 6, 7], [False] * 3).startswith("; labelled induction on repeated random")
    assert repeat_note("duplicate-token", [1, 5, 6, 1], [True, False, False, True]) != ""  # specials do not count
    assert repeat_note("induction", [5, 6, 5], [False] * 3) == ""
    assert repeat_note("previous-token", [5, 6, 7], [False] * 3) == ""
    lm = tiny_model("gpt2")
    res = analyze(lm, ["The cat sat on a mat.", "the dog and the dog ran"], n_examples=2)
    heads = res.heads.copy()
    heads["induction"] = 0.0
    heads.loc[0, ["label", "induction"]] = ["induction", 0.9]
    _, blocks = _attention_figures(replace(res, heads=heads), lm.tokenizer)
    crops = {b["example"]: b["crop"] for b in blocks if b["label"] == "induction"}
    assert "no token repeats in this text" in crops[1] and crops[2] == ""


def test_grid_cells_are_readable_and_tables_say_n_a(run_dir, tmp_path):
    """Issue 27 item 15: dark grey '1st' on #0072B2 (2.4:1), raw None in the verification table, and
    '2 padded batches of 2'."""
    from probe.patterns.health import padding_note
    from probe.report.page import LABEL_COLORS, contrast, ink

    assert contrast("#000000", "#ffffff") == pytest.approx(21.0) and contrast("#0072B2", "#0072B2") == 1.0
    assert contrast("#444444", "#0072B2") < 3  # the grid's old text on first-token's blue
    for label, color in LABEL_COLORS.items():
        assert contrast(ink(color), color) >= 4.5, label  # WCAG 2.1 AA for small text
    assert ink("#0072B2") == "#ffffff" and ink("#F0E442") == "#000000"
    html = (run_dir[0] / "index.html").read_text()
    grid = re.search(r'<table class="grid">(.*?)</table>', html, re.S).group(1)
    cells = re.findall(r'<td style="background: (#\w+); color: (#\w+)"', grid)
    assert cells and all(fg == ink(bg) for bg, fg in cells)
    assert padding_note(2, 2, 14) == "padded: every one of the run's 2 batches; 14 (row, padding key) cells per head"
    assert padding_note(1, 3, 1400).startswith("padded: one of the run's 3 batches; 1,400")
    lm = tiny_model("bert")
    res = analyze(lm, ["The cat sat on the mat."], n_examples=1)
    record = {"model": "m", "passed": True, "max_abs_diff": 0.0, "per_layer": [],
              "cases": [{"name": "alone", "padding_max_abs": None, "max_abs_diff": 0.0}]}
    page = (write_run(res, lm.tokenizer, tmp_path / "run", verification=record) / "index.html").read_text()
    cases = re.search(r"<h3>Cases</h3>(.*?)</table>", page, re.S).group(1)
    assert "None" not in cases and '<span class="muted">n/a</span>' in cases


def test_a_bar_axis_writes_its_ticks_with_one_number_of_decimals(chromium, tmp_path):
    """Issue 27 item 15: bar-chart axes mixed decimals (1.00, 0.750)."""
    from probe.report import static_text

    sync_api, executable = chromium
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_content(f"<script>{static_text('charts.js')}</script>")
            labels = "window.probeCharts.axisLabels"
            assert page.evaluate(f"{labels}([0, 0.25, 0.5, 0.75, 1])") == ["0.00", "0.25", "0.50", "0.75", "1.00"]
            assert page.evaluate(f"{labels}([0, 0.5, 1, 1.5, 2])") == ["0.0", "0.5", "1.0", "1.5", "2.0"]
            assert page.evaluate(f"{labels}([0, 25, 50, 75, 100])") == ["0", "25", "50", "75", "100"]
        finally:
            browser.close()


def test_fixed_writes_a_value_that_rounds_to_zero_without_a_sign():
    from probe.util import fixed

    assert [fixed(-0.0004), fixed(0.0), fixed(-0.0006), fixed(1.23456, 2), fixed(-2.5, 1)] == \
        ["0.000", "0.000", "-0.001", "1.23", "-2.5"]
    from probe.effects.patch_report import _fmt  # the patching section's cells (a composition z of -0.04)

    assert [_fmt(-0.04, ".1f"), _fmt(-0.06, ".1f"), _fmt(None), _fmt(float("nan"))] == ["0.0", "-0.1", "", ""]


def test_a_cropped_cross_attention_map_says_so(monkeypatch):
    import types

    import probe.report.cross as cross

    monkeypatch.setattr(cross, "display_tokens", lambda tok, text, ids, offsets, special: [str(i) for i in ids])
    n = cross.MAX_TOKENS + 52
    ex = types.SimpleNamespace(text="x", ids=list(range(n)), offsets=[(0, 0)] * n, special=[False] * n,
                               target={"text": "y", "ids": [0, 1, 2], "offsets": [(0, 0)] * 3, "special": [False] * 3},
                               decoder={"decoder.0.cross": np.full((1, 3, n), 1 / n)})
    figure = cross.cross_figure(ex, None, 0, 0, "L0H0")
    assert figure["cols"] == cross.MAX_TOKENS and figure["rows"] == 3
    assert figure["title"] == f"L0H0, first {cross.MAX_TOKENS} of {n} source positions"
