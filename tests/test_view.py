"""The interactive head view: its data (rounding, zero runs, word units, layer budget), its HTML
(escaped, one mount per view), and the drawn page in headless Chromium (Playwright): after a hover
the lines drawn are exactly the data's weights above the line threshold, no request, no console
error, no Content-Security-Policy violation."""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import CHROMIUM_ARGS, tiny_model
from probe.capture.maps import capture_attention
from probe.entries.notebook import show
from probe.errors import InputError
from probe.report import CSP, write_run
from probe.runs.analysis import analyze
from probe.text.tokens import display_tokens
from probe.view import VIEW_CSP, HeadView
from probe.view.data import (
    LINE_THRESHOLD,
    SCALE,
    Alignment,
    Display,
    choose_layers,
    decode_zero_runs,
    decoded_map,
    view_data,
    word_attention,
    word_units,
    zero_runs,
)
from probe.view.html import render_fragment, render_page

NASTY = "Look: <script>alert(1)</script> & <b>bold</b> </script><img src=x> unbelievably."


# --------------------------------------------------------------------------- data

def test_zero_runs_by_hand_and_round_trip():
    assert zero_runs([5, 0, 0, 0, 7, 0]) == [5, -3, 7, -1]
    assert zero_runs([0, 0]) == [-2] and zero_runs([1, 2]) == [1, 2] and zero_runs([]) == []
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, 500) * (rng.random(500) < 0.4)
    enc = zero_runs(x)
    assert len(enc) < len(x)
    np.testing.assert_array_equal(decode_zero_runs(enc, len(x)), x)


def test_word_units_group_pieces_and_keep_special_tokens_apart():
    # [CLS] un ##believ ##able cat [SEP]  -> words 0 (3 pieces) and 1; specials are their own units
    units, labels = word_units([-1, 0, 0, 0, 1, -1], ["[CLS]", "un", "##believ", "##able", "cat", "[SEP]"],
                               "unbelievable cat", [(0, 0), (0, 2), (2, 8), (8, 12), (13, 16), (0, 0)])
    assert units == [0, 1, 1, 1, 2, 3]
    assert labels == ["[CLS]", "unbelievable", "cat", "[SEP]"]
    # without text, pieces are joined without their '##'
    assert word_units([0, 0], ["un", "##do"])[1] == ["undo"]


def test_word_attention_sums_to_words_and_averages_from_words():
    a = np.array([[0.5, 0.25, 0.25],
                  [0.1, 0.6, 0.3],
                  [0.2, 0.2, 0.6]])
    w = word_attention(a, [0, 1, 1])           # token 0 alone, tokens 1-2 one word
    expected = np.array([[0.5, 0.5],                       # row 0: to word 1 = 0.25 + 0.25
                         [(0.1 + 0.2) / 2, (0.9 + 0.8) / 2]])  # word 1: mean of its rows' sums
    np.testing.assert_allclose(w, expected)
    np.testing.assert_allclose(w.sum(1), 1.0)


def test_view_data_rounds_to_thousandths_and_marks_removed_heads():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(5), size=(2, 3, 5))          # [layers, heads, n, n]
    p[1, 2] = np.nan                                        # a removed head
    data = view_data(p, list("abcde"), heads=[2], layer=1)
    assert data["scale"] == SCALE == 1000 and data["layers"] == [0, 1]
    for li in range(2):
        for h in range(3):
            if (li, h) == (1, 2):
                assert data["maps"][li][h] is None and data["removed"][li][h]
                assert np.isnan(decoded_map(data, li, h)).all()
            else:
                np.testing.assert_array_equal(decoded_map(data, li, h) * 1000, np.rint(p[li, h] * 1000))
    assert data["initial"] == {"layer": 1, "heads": []}    # the removed head is not selected


def test_layer_budget_keeps_evenly_spaced_layers_and_says_so():
    assert choose_layers(6, 12, 20) == list(range(6))
    assert choose_layers(30, 9, 512, 4_000_000) == [0]
    assert choose_layers(6, 12, 100, 3 * 12 * 100 * 100) == [0, 2, 5]  # round(i * 5 / 2)
    p = np.full((6, 1, 4, 4), 0.25)
    data = view_data(p, list("abcd"), display=Display(max_values=2 * 16))
    assert data["layers"] == [0, 5] and data["values"] == 32
    assert data["notes"] and "layers 0, 5 of 6 included" in data["notes"][0]


def test_view_data_takes_its_alignment_and_display_as_records():
    """Side 0's words come from ``alignment`` (labelled by the text's characters), the title, note, names,
    labels and line threshold from ``display``; defaults: no words, the module's budget and threshold."""
    p = np.full((2, 2, 4, 4), 0.25)
    text = "unbelievable cat"
    tokens, offsets = ["un", "##believable", "cat", "[SEP]"], [(0, 2), (2, 12), (13, 16), (0, 0)]
    data = view_data(p, tokens, alignment=Alignment([0, 0, 1, -1], text, offsets),
                     display=Display(threshold=0.5, title="T", note="N", layer_names=["a", "b"],
                                     head_labels={(1, 0): "previous-token"}))
    assert data["units"] == [0, 0, 1, 2] and data["unitLabels"] == ["unbelievable", "cat", "[SEP]"]
    assert (data["threshold"], data["title"], data["notes"]) == (0.5, "T", ["N"])
    assert data["layerNames"] == ["a", "b"] and data["headLabels"] == [["", ""], ["previous-token", ""]]
    plain = view_data(p, tokens)
    assert plain["units"] is None and plain["threshold"] == LINE_THRESHOLD and plain["title"] == ""


@pytest.mark.parametrize("kwargs, fragment", [
    ({"layers": [7]}, "layers must be among"),
    ({"layer": 1, "layers": [0]}, "not among the included layers"),
    ({"heads": [4]}, "no head 4: layers have heads 0-0"),
    ({"display": Display(threshold=0)}, "line threshold"),
])
def test_view_data_rejects_bad_selections(kwargs, fragment):
    with pytest.raises(InputError, match=fragment):
        view_data(np.full((2, 1, 3, 3), 1 / 3), ["a", "b", "c"], **kwargs)


def test_show_keeps_the_models_probabilities_of_the_included_layers():
    lm = tiny_model("bert")
    text = "The cat sat on the mat, unbelievably."
    view = show(lm, text, layers=[1], layer=1, heads=[0, 2])
    cap = capture_attention(lm, text)
    n = view.data["n"]
    assert n == int(cap.batch.lengths[0]) and view.data["layers"] == [1]
    for h in range(lm.geometry.n_heads):
        np.testing.assert_allclose(decoded_map(view.data, 0, h), cap.probs[1][0, h, :n, :n].numpy(), atol=5e-4)
    assert view.data["initial"] == {"layer": 0, "heads": [0, 2]}
    assert view.data["tokens"][0] == "[CLS]" and view.data["layerNames"] == ["encoder.1.self"]
    # word units follow the batch's word ids: 'unbelievably.' is one whitespace word
    assert view.data["unitLabels"][-2:] == ["unbelievably.", "[SEP]"]
    assert show(lm, text, words=False).data["units"] is None


def test_show_of_a_result_uses_its_example_and_head_labels():
    lm = tiny_model("gpt2")
    res = analyze(lm, ["The cat sat on the mat.", "Hello."], n_examples=2, example_tokens=5)
    view = show(res, tokenizer=lm.tokenizer, example=1)
    ex = res.examples[1]
    assert view.data["n"] == ex.probs.shape[-1] and view.data["causal"]
    assert view.data["tokens"] == display_tokens(lm.tokenizer, ex.text, ex.ids, ex.offsets, ex.special)[:view.data["n"]]
    labelled = {(int(r.layer), int(r.head)): r.label for r in res.heads.itertuples() if r.label != "mixed"}
    for (layer, head), label in labelled.items():
        assert view.data["headLabels"][layer][head] == label
    with pytest.raises(InputError, match="example 2 was not kept"):
        show(res, tokenizer=lm.tokenizer, example=2)
    with pytest.raises(InputError, match="a tokenizer is needed"):
        show(res)
    with pytest.raises(InputError, match="needs one text"):
        show(lm)


def test_fragment_escapes_tokens_and_each_view_has_its_own_id():
    lm = tiny_model("bert")
    view = show(lm, NASTY)
    a, b = view.to_html(), view.to_html()
    for html in (a, b):
        assert "<script>alert(1)" not in html and "<b>bold" not in html and "<img src=x>" not in html
        assert re.findall(r"<script\b[^>]*>", html) == ['<script type="application/json" class="probe-hv-data">',
                                                        "<script>",  # then the step view of the initial head
                                                        '<script type="application/json" class="probe-sv-data">',
                                                        "<script>"]
        assert len(re.findall(r"</script>", html)) == 4
        assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
    ids = [re.search(r'<div class="probe-hv" id="([^"]+)"', h).group(1) for h in (a, b)]
    assert ids[0] != ids[1]
    assert view._repr_html_().startswith('<div class="probe-hv"')
    page = render_page(view.data)
    assert f'<meta http-equiv="Content-Security-Policy" content="{VIEW_CSP}">' in page


# --------------------------------------------------------------------------- in a real browser

#: Collects Content-Security-Policy violations (Chromium also logs them as console errors).
CSP_WATCH = ("window.__csp = []; document.addEventListener('securitypolicyviolation', "
             "e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));")


@pytest.fixture(scope="module")
def browser(chromium):
    sync_api, path = chromium
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A page opened in Chromium with its console messages, requests and CSP violations recorded."""

    def __init__(self, browser, path):
        self.page = browser.new_page(viewport={"width": 1200, "height": 900})
        self.messages, self.requests = [], []
        self.page.on("console", lambda m: self.messages.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.messages.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.add_init_script(CSP_WATCH)
        self.url = path.as_uri()
        self.page.goto(self.url)
        self.page.wait_for_selector(".probe-hv[data-draws]")

    def view(self, k: int = 0) -> str:
        return f"document.querySelectorAll('.probe-hv')[{k}].probeView"

    def hover(self, side: str, i: int, k: int = 0, click: bool = False) -> list[dict]:
        pt = self.page.evaluate(f"{self.view(k)}.point('{side}', {i})")
        self.page.mouse.move(pt["x"], pt["y"])
        if click:
            self.page.mouse.click(pt["x"], pt["y"])
        return self.page.evaluate(f"{self.view(k)}.lines()")

    def clean(self) -> None:
        assert self.messages == []
        assert self.requests == [self.url]
        assert self.page.evaluate("window.__csp") == []


def expected_lines(m: np.ndarray, heads, side: str, i: int, threshold: float) -> dict:
    out = {}
    for h in heads:
        vec = m[h][i] if side == "q" else m[h][:, i]
        for j, w in enumerate(vec):
            if w >= threshold:
                out[(h, i, j) if side == "q" else (h, j, i)] = float(w)
    return out


def as_dict(lines) -> dict:
    return {(d["head"], d["query"], d["key"]): d["weight"] for d in lines}


def test_hovered_tokens_lines_are_the_data_in_chromium(browser, tmp_path):
    """Hover a query: its row's weights >= threshold, per selected head; hover a key: its column;
    word mode: the word-level aggregate of the page's data; pin survives leaving the canvas."""
    lm = tiny_model("bert")
    view = show(lm, NASTY, threshold=0.05, heads=[0, 1, 2, 3])
    pg = Page(browser, view.save(tmp_path / "view.html"))
    v = pg.view()
    tokens = pg.page.evaluate(f"{v}.data.tokens")
    assert tokens == view.data["tokens"] and "<script>alert(1)</script>" not in pg.page.content()
    m = np.stack([decoded_map(view.data, 0, h) for h in range(4)])     # layer 0 as the page holds it
    got = as_dict(pg.hover("q", 3))                                    # initial selection: every head
    want = expected_lines(m, range(4), "q", 3, 0.05)
    assert got.keys() == want.keys() and len(want) > 0
    assert all(abs(got[k] - want[k]) < 1e-6 for k in want)
    strip = pg.page.evaluate(f"{v}.strip()")
    np.testing.assert_allclose(np.array(strip["2"]), m[2][3], atol=1e-6)   # the strip is the whole row
    # one head, on a key: the column
    pg.page.evaluate(f"{v}.setHeads([1])")
    got = as_dict(pg.hover("k", 5))
    want = expected_lines(m, [1], "k", 5, 0.05)
    assert got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-6 for k in want)
    # another layer and a lower threshold
    pg.page.evaluate(f"{v}.setLayer(1); {v}.setThreshold(0.001); {v}.setHeads([0, 3])")
    m1 = np.stack([decoded_map(view.data, 1, h) for h in range(4)])
    got = as_dict(pg.hover("q", 0))
    want = expected_lines(m1, [0, 3], "q", 0, 0.001)
    assert got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-6 for k in want)
    # pinned: leaving the canvas keeps the lines
    pg.hover("q", 2, click=True)
    pg.page.mouse.move(5, 5)
    st = pg.page.evaluate(f"{v}.state()")
    assert st["pinned"] and st["focus"] == {"side": "q", "i": 2}
    assert as_dict(pg.page.evaluate(f"{v}.lines()")).keys() == expected_lines(m1, [0, 3], "q", 2, 0.001).keys()
    pg.page.keyboard.press("Escape")     # the canvas has focus after the click
    # word mode: sum over the key word's pieces, mean over the query word's pieces
    pg.page.evaluate(f"{v}.setMode('words')")
    units = view.data["units"]
    w = np.stack([word_attention(m1[h], units) for h in range(4)])
    got = as_dict(pg.hover("q", len(view.data["unitLabels"]) - 2))
    want = expected_lines(w, [0, 3], "q", len(view.data["unitLabels"]) - 2, 0.001)
    assert got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-5 for k in want)
    pg.page.screenshot(path=str(tmp_path / "view.png"))
    pg.clean()


def test_two_views_on_one_page_mount_separately(browser, tmp_path):
    """A notebook puts several fragments on one page: each mounts once, with its own state."""
    lm = tiny_model("gpt2")
    a, b = show(lm, "The cat sat on the mat."), show(lm, "Another sentence here, longer than the first one.")
    page = render_page(a.data).replace("</body>", b.to_html() + "</body>")
    path = tmp_path / "two.html"
    path.write_text(page, encoding="utf-8")
    pg = Page(browser, path)
    assert pg.page.evaluate("document.querySelectorAll('.probe-hv').length") == 2
    assert pg.page.evaluate(f"{pg.view(0)}.data.n") == a.data["n"]
    assert pg.page.evaluate(f"{pg.view(1)}.data.n") == b.data["n"]
    lines = pg.hover("q", 4, k=1)
    assert all(d["query"] == 4 and d["key"] <= 4 for d in lines)         # causal: no key after the query
    assert pg.page.evaluate(f"{pg.view(0)}.state().focus") is None
    assert pg.page.evaluate("document.querySelectorAll('.probe-hv .hv-bar').length") == 2   # mounted once each
    assert page.count('class="hv-fallback"') == 2      # shown until the script runs, then removed
    assert pg.page.evaluate("document.querySelectorAll('.hv-fallback').length") == 0
    pg.clean()


def test_view_mounts_when_a_notebook_inserts_it(browser, tmp_path):
    """JupyterLab renders an HTML output with innerHTML (scripts inert), then replaces each script by
    a fresh copy, possibly before the output is attached to the page: the view mounts when attached."""
    lm = tiny_model("bert")
    view = show(lm, "The cat sat on the mat.")
    path = tmp_path / "empty.html"
    path.write_text(render_page(show(lm, "Another one.").data), encoding="utf-8")
    pg = Page(browser, path)
    mounted = pg.page.evaluate("""(html) => {
        const host = document.createElement('div');
        host.innerHTML = html;                                   // detached: nothing runs yet
        for (const old of Array.from(host.getElementsByTagName('script'))) {
            const s = document.createElement('script');
            for (const a of Array.from(old.attributes)) s.setAttribute(a.name, a.value);
            s.textContent = old.textContent;
            old.parentNode.replaceChild(s, old);
        }
        const before = !!host.querySelector('.probe-hv').probeView;
        document.body.appendChild(host);                         // attached: the script runs now
        return [before, !!host.querySelector('.probe-hv').probeView];
    }""", view._repr_html_())
    assert mounted == [False, True]
    lines = pg.hover("q", 2, k=1)
    m = np.stack([decoded_map(view.data, 0, h) for h in range(4)])
    # the view opens on one head (head 0 of layer 0 without a step view): its lines only
    assert as_dict(lines).keys() == expected_lines(m, [0], "q", 2, view.data["threshold"]).keys()
    pg.clean()


def test_report_view_shows_the_first_examples_attention(browser, tmp_path):
    """The report's section: the initial head, hovered, draws the example's probabilities (the
    analysis' own float32 maps, rounded to 1e-3) under the report's CSP."""
    lm = tiny_model("bert")
    res = analyze(lm, [NASTY, "Second text."], n_examples=2)
    path = write_run(res, lm.tokenizer, tmp_path / "run")
    html = (path / "index.html").read_text(encoding="utf-8")
    assert f'content="{CSP}"' in html.replace("&#39;", "'") and 'id="head-view"' in html
    pg = Page(browser, path / "index.html")
    v = pg.view()
    st = pg.page.evaluate(f"{v}.state()")
    layer, heads = st["layer"], st["heads"]
    assert len(heads) == 1
    lines = as_dict(pg.hover("q", 4))
    probs = res.examples[0].probs[layer]
    want = {k: w for k, w in expected_lines(probs, heads, "q", 4, 0.01).items()}
    assert lines.keys() <= set(expected_lines(probs, heads, "q", 4, 0.0095).keys())
    assert {k for k in want if want[k] >= 0.0105} <= lines.keys()
    assert all(abs(lines[k] - float(probs[k[0], k[1], k[2]])) <= 5e-4 for k in lines)
    pg.clean()


def test_head_view_object_saves_a_page(tmp_path):
    lm = tiny_model("bert")
    view = HeadView.from_example(analyze(lm, ["One two three."], n_examples=1).examples[0], lm.tokenizer)
    path = view.save(tmp_path / "v.html")
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert "probe-hv-data" in render_fragment(view.data, "fixed-id") and 'id="fixed-id"' in render_fragment(
        view.data, "fixed-id")


def test_label_grid_for_notebooks():
    from probe.report import LABEL_COLORS
    from probe.view import label_grid

    lm = tiny_model("bert")
    res = analyze(lm, ["The cat sat on the mat.", "A second sentence, with a comma."])
    styler = label_grid(res)
    expected = res.heads.pivot(index="layer", columns="head", values="label")
    assert styler.data.equals(expected)
    html = styler.to_html()
    for label in set(expected.to_numpy().ravel()):
        assert f"background-color: {LABEL_COLORS[label]}" in html
    relation = res.heads.assign(label=["syntactic:nsubj"] + list(res.heads["label"][1:]))
    assert f"background-color: {LABEL_COLORS['syntactic']}" in label_grid(relation).to_html()  # the family's colour
    prev = label_grid(res.heads, "prev")
    np.testing.assert_array_equal(prev.data.to_numpy(), res.heads.pivot(index="layer", columns="head",
                                                                       values="prev").to_numpy())
    with pytest.raises(InputError, match="no column 'nope'"):
        label_grid(res, "nope")


def _line_pixels(pg, k: int = 0) -> int:
    """Pixels drawn on the head view's canvas between its two token columns (where only lines go)."""
    return pg.page.evaluate(f"""() => {{
        const root = document.querySelectorAll('.probe-hv')[{k}], c = root.querySelector('.hv-scroll canvas');
        const w = c.width, h = c.height, x0 = Math.ceil(w * 0.4), x1 = Math.floor(w * 0.6);
        const copy = document.createElement('canvas'); copy.width = w; copy.height = h;
        const ctx = copy.getContext('2d', {{willReadFrequently: true}}); ctx.drawImage(c, 0, 0);
        const d = ctx.getImageData(x0, 0, x1 - x0, h).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
        return n; }}""")


@pytest.mark.parametrize("where", ["show", "report"])
def test_lines_are_drawn_at_load_before_any_hover(browser, tmp_path, where):
    """As bertviz's head view: right after load, with no token hovered, every token's lines of the
    selected heads are drawn (weights >= the line threshold), on the canvas, not only in the data;
    leaving a hovered token draws them again."""
    lm = tiny_model("bert")
    if where == "show":
        view = show(lm, "The cat sat on the mat.", heads=[0, 2])
        data, path = view.data, view.save(tmp_path / "view.html")
    else:
        res = analyze(lm, ["The cat sat on the mat.", "Second text."], n_examples=1)
        path = write_run(res, lm.tokenizer, tmp_path / "run") / "index.html"
        data = None
    pg = Page(browser, path)
    v = pg.view()
    data = data or pg.page.evaluate(f"{v}.data")
    st = pg.page.evaluate(f"{v}.state()")
    assert st["focus"] is None and st["heads"]
    li = st["layerIndex"]
    m = {h: decoded_map(data, li, h) for h in st["heads"]}
    want = {(h, q, k) for h in st["heads"] for (q, k) in zip(*np.nonzero(m[h] + 1e-6 >= data["threshold"]))}
    got = as_dict(pg.page.evaluate(f"{v}.lines()"))
    assert len(got) > 0 and got.keys() == want
    assert all(abs(got[key] - m[key[0]][key[1], key[2]]) < 1e-6 for key in got)
    assert _line_pixels(pg) > 0
    pg.hover("q", 1)
    assert {key[1] for key in as_dict(pg.page.evaluate(f"{v}.lines()"))} == {1}    # hovered: that row only
    pg.page.mouse.move(2, 2)
    assert as_dict(pg.page.evaluate(f"{v}.lines()")).keys() == want
    pg.page.evaluate(f"{v}.setHeads([])")
    assert pg.page.evaluate(f"{v}.lines()") == [] and _line_pixels(pg) == 0
    pg.clean()


def test_the_head_view_opens_on_one_head():
    """Issue 27 item 6: show() and model_view() opened with every head of layer 0 checked (a hairball),
    and steps=(site, head) left the head view on layer 0: one head, the step view's where there is one."""
    from probe.entries.notebook import model_view
    from probe.report.page import choose_heads

    lm = tiny_model("gpt2")
    text = "The cat sat on the mat."
    assert show(lm, text).data["initial"] == {"layer": 0, "heads": [0]}
    view = show(lm, text, steps=(1, 3))
    assert view.data["initial"] == {"layer": view.data["layers"].index(1), "heads": [3]}
    assert view.steps["head"] == 3
    assert show(lm, text, steps=False).data["initial"]["heads"] == [0]
    assert show(lm, text, layer=1, heads=[0, 2], steps=(0, 1)).data["initial"] == {"layer": 1, "heads": [0, 2]}
    assert model_view(lm, text).head_view.data["initial"] == {"layer": 0, "heads": [0]}
    res = analyze(lm, [text, "Hello there."], n_examples=1)
    layer, head = choose_heads(res)[0][:2]
    got = show(res, tokenizer=lm.tokenizer).data
    assert got["initial"] == {"layer": got["layers"].index(layer), "heads": [head]}


def test_chosen_heads_are_the_strongest_of_each_label_in_pandas_order():
    """choose_heads takes each label's heads in the order pandas' sort_values(ascending=False) gives them (ties and
    NaN included: descending replays its nargsort) and names the statistic's value."""
    import pandas as pd

    from probe.measures.classify import LABEL_RULES
    from probe.report.page import choose_heads, descending

    rng = np.random.default_rng(3)
    for trial in range(500):
        n = int(rng.integers(1, 40))
        v = rng.choice([0.0, 0.5, 1.0, np.nan, 0.25], size=n) if trial % 2 else rng.random(n)
        want = pd.DataFrame({"v": v}).sort_values("v", ascending=False).index.to_numpy()
        assert np.array_equal(descending(v), want)
    res = analyze(tiny_model("gpt2"), ["The cat sat on the mat.", "Hello there, said the dog."], n_examples=0)
    heads = res.heads
    for layer, head, label, reason in choose_heads(res, per_label=2, limit=100):
        stat = "max_weight" if label == "mixed" else LABEL_RULES[label][0]
        rows = heads[heads["label"] == label].sort_values(stat, ascending=False)
        top = rows.head(1 if label == "mixed" else 2)
        assert (layer, head) in set(zip(top["layer"], top["head"]))
        value = top[(top["layer"] == layer) & (top["head"] == head)][stat].iloc[0]
        assert reason == f"{stat} = {value:.2f}"
