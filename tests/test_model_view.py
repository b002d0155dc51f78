"""The model view (every head as a thumbnail; click opens the head view) and the attention-step view:
their data equal an independent computation from the model's maps and steps, and (browser) what
Chromium draws reads back as that data, offline, under the views' policy, without console errors."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import CHROMIUM_ARGS, save_tiny, tiny_model
from probe import attention_steps, show
from probe.capture.maps import capture_attention
from probe.cli import main
from probe.entries.analyze import report_steps
from probe.entries.notebook import model_view
from probe.loading.models import load_model
from probe.report import CSP, write_run
from probe.runs.analysis import analyze
from probe.sites import Site
from probe.text.inputs import Text
from probe.view.assets import view_page
from probe.view.modelview import LEVELS, model_view_data, pool_map, pool_maps, render_model_view
from probe.view.stepview import STEPS_KEY

NASTY = 'Look: </script><b>"bold"</b> it\u2028said \'so\' & ran </SCRIPT> away now.'
CSP_WATCH = ("window.__csp = []; document.addEventListener('securitypolicyviolation', "
             "e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));")


# --------------------------------------------------------------------------- data

def block_max(m, cells):
    """Independent block maxima: loop over the blocks."""
    b = max(1, math.ceil(max(m.shape) / cells))
    rows, cols = math.ceil(m.shape[0] / b), math.ceil(m.shape[1] / b)
    return np.array([[m[r * b:(r + 1) * b, c * b:(c + 1) * b].max() for c in range(cols)] for r in range(rows)]), b


def cells_of(site_data, head):
    raw = np.frombuffer(base64.b64decode(site_data["heads"][head]), dtype=np.uint8)
    return raw.reshape(site_data["rows"], site_data["cols"])


def test_thumbnails_are_block_maxima_of_the_models_maps():
    rng = np.random.default_rng(0)
    for shape, cells in (((7, 7), 32), ((70, 70), 32), ((13, 41), 8), ((512, 512), 32)):
        m = rng.random(shape).astype(np.float32)
        got, b = pool_map(m, cells)
        want, wb = block_max(m, cells)
        assert b == wb and np.array_equal(got, want)
        many = np.stack([m, m[::-1], np.full_like(m, np.nan)])  # every head at once: each head's own maxima
        pooled, pb = pool_maps(many, cells)
        assert pb == b and all(np.array_equal(pooled[h], pool_map(many[h], cells)[0], equal_nan=True)
                               for h in range(3))
    lm = tiny_model("llama")
    probs = capture_attention(lm, [NASTY]).probs
    data = model_view(lm, NASTY, cells=8).data
    assert [g["title"] for g in data["grids"]] == [""] and len(data["sites"]) == len(lm.sites)
    for x, s in enumerate(data["sites"]):
        for h in range(lm.geometry.n_heads):
            want, b = block_max(probs[x][0, h].numpy(), 8)
            assert s["block"] == b > 1  # the tiny BPE cuts the text into ~50 tokens
            assert np.array_equal(cells_of(s, h), np.rint(want * LEVELS).astype(np.uint8))
    assert data["sites"][1]["names"][3] == "L1H3"


def test_encoder_decoder_gets_one_grid_per_site_kind_and_rectangular_cross_maps():
    lm = tiny_model("bart")
    text = Text("the cat sat on the mat and then it ran away", target="a dog")
    data = model_view(lm, text).data
    assert [g["title"] for g in data["grids"]] == ["encoder self-attention", "decoder self-attention",
                                                   "cross-attention (target x source)"]
    cross = [s for s in data["sites"] if s["name"].endswith("cross")]
    assert cross and all((s["nq"], s["nk"]) == (cross[0]["nq"], cross[0]["nk"]) for s in cross)
    assert cross[0]["nq"] < cross[0]["nk"] and (cross[0]["rows"], cross[0]["cols"]) == (cross[0]["nq"], cross[0]["nk"])
    assert cross[0]["names"][2] == f"cross L{cross[0]['layer']}H2"


def test_labels_colour_borders_by_site_and_tokens_never_reach_the_page():
    lm = tiny_model("bert")
    res = analyze(lm, [NASTY, "Second text here."], n_examples=1)
    mv = model_view(res, tokenizer=lm.tokenizer)
    want = {(int(r.layer), int(r.head)): r.label for r in res.heads.itertuples() if r.label != "mixed"}
    got = {(x, h): lab for x, s in enumerate(mv.data["sites"]) for h, lab in enumerate(s["labels"]) if lab}
    assert got == want
    fragment = render_model_view(mv.data)
    assert "</script>" not in fragment.split('class="probe-mv-data">', 1)[1].split("</script>", 1)[0]


def test_probe_analyze_puts_the_step_views_in_the_report(tmp_path):
    """The CLI has the model, so its report carries each label's strongest head's steps, equal to
    attention_steps on the first example."""
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    text = "the cat sat on the mat and then the cat sat on the mat again"
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["analyze", "--model", str(folder), "--text", text, "--out", str(out),
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    html = (out / "index.html").read_text(encoding="utf-8")
    assert 'id="model-view"' in html and 'id="attention-steps"' in html
    data = json.loads(html.split('class="probe-sv-data">', 1)[1].split("</script>", 1)[0])
    lm = load_model(str(folder))
    df = attention_steps(lm, text, site=data["siteIndex"], head=data["head"], query=3)
    nk = data["nk"]
    np.testing.assert_allclose(data["probs"][3 * nk:4 * nk], df["probability"], atol=1e-6)


# --------------------------------------------------------------------------- browser

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
    """A page opened in Chromium, its console messages, requests and policy violations recorded."""

    def __init__(self, browser, path, wait=".probe-mv[data-drawn]"):
        self.page = browser.new_page(viewport={"width": 1200, "height": 900})
        self.messages, self.requests = [], []
        self.page.on("console", lambda m: self.messages.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.messages.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.add_init_script(CSP_WATCH)
        self.url = path.as_uri()
        self.page.goto(self.url)
        self.page.wait_for_selector(wait)

    def ev(self, js):
        return self.page.evaluate(js)

    def clean(self):
        assert self.messages == []
        assert self.requests == [self.url]
        assert self.ev("window.__csp") == []


MV = "document.querySelector('.probe-mv').probeModelView"
HV = "document.querySelector('.probe-hv').probeView"
SV = "document.querySelectorAll('.probe-sv')[{k}].probeStepView"


def test_model_view_draws_its_data_and_a_click_opens_the_head_view(browser, tmp_path):
    lm = tiny_model("llama")
    mv = model_view(lm, NASTY)
    pg = Page(browser, mv.save(tmp_path / "mv.html"))
    probs = capture_attention(lm, [NASTY]).probs
    for x, h in ((0, 0), (1, 3)):
        s = mv.data["sites"][x]
        drawn = np.array(pg.ev(f"{MV}.drawn({x}, {h})"))
        assert drawn.shape == (s["rows"], s["cols"])
        want = np.rint(block_max(probs[x][0, h].numpy(), 32)[0] * LEVELS)
        assert np.array_equal(drawn, want)
    pt = pg.ev(f"{MV}.point(1, 2)")
    pg.page.mouse.click(pt["x"], pt["y"])
    st = pg.ev(f"{HV}.state()")
    assert pg.ev(f"{MV}.opened()") == {"site": 1, "head": 2} and st["layer"] == 1 and st["heads"] == [2]
    assert pg.ev(f"{HV}.data.tokens") == mv.head_view.data["tokens"]     # typed </script> is a token, as text
    pg.page.screenshot(path=str(tmp_path / "mv.png"), full_page=True)
    pg.clean()


def test_step_view_rows_are_the_steps_and_a_pinned_query_opens_them(browser, tmp_path):
    lm = tiny_model("gemma2")
    view = show(lm, NASTY, steps=(1, 2))
    pg = Page(browser, view.save(tmp_path / "sv.html"), wait=".probe-sv[data-query]")
    pg.ev(f"{HV}.setLayer(1)")
    pt = pg.ev(f"{HV}.point('q', 6)")
    pg.page.mouse.click(pt["x"], pt["y"])
    sv = SV.format(k=0)
    assert pg.ev(f"{sv}.query()") == 6
    df = attention_steps(lm, NASTY, site=1, head=2, query=6, vectors=True)
    header = pg.ev(f"{sv}.header()")
    rows = pg.ev(f"{sv}.rows()")
    col = {name: i for i, name in enumerate(header)}
    assert [r[col["token"]] for r in rows] == df["token"].tolist()
    for name, want, places in (("q·k", df["score"], 4), ("scaled", df["scaled_score"], 4),
                               ("probability", df["probability"], 4), ("||f(x_j)||", df["value_norm"], 3)):
        np.testing.assert_allclose([float(r[col[name]]) for r in rows], want, atol=0.51 * 10 ** -places)
    assert [r[col["mask"]] == "masked" for r in rows] == df["masked"].tolist()
    np.testing.assert_allclose(np.array(pg.ev(f"{sv}.products()")), np.stack(df["product"]), atol=1e-4)
    pg.page.screenshot(path=str(tmp_path / "sv.png"), full_page=True)
    pg.clean()


def test_report_has_the_model_view_and_the_step_views(browser, tmp_path):
    lm = tiny_model("bert")
    res = analyze(lm, [NASTY, "Second text here."], n_examples=1)
    steps = report_steps(lm, res)
    assert steps and res.results[STEPS_KEY] is steps
    path = write_run(res, lm.tokenizer, tmp_path / "run")
    html = (path / "index.html").read_text(encoding="utf-8")
    assert 'id="model-view"' in html and 'id="attention-steps"' in html and f'content="{CSP}"' in html.replace(
        "&#39;", "'")
    # the step views' script and style once, after the views (it held 11 KB a view before), and every view drawn
    assert len(steps) > 1 and html.count("/* probe attention-step view:") == 1
    assert html.count('class="probe-sv-data"') == len(steps)
    pg = Page(browser, path / "index.html")
    drawn = pg.ev("Array.from(document.querySelectorAll('.probe-sv')).map(e => !!e.probeStepView)")
    assert drawn == [True] * len(steps)
    assert pg.ev("document.querySelectorAll('.probe-sv .sv-fallback').length") == 0
    k = len(steps) - 1
    sv = SV.format(k=k)
    first = steps[k]
    assert pg.ev(f"{sv}.data.name") == first["name"]
    pg.ev(f"{HV}.setLayer({pg.ev(f'{HV}.data.layers').index(first['siteIndex'])})")
    pt = pg.ev(f"{HV}.point('q', 2)")
    pg.page.mouse.click(pt["x"], pt["y"])
    assert pg.ev(f"{sv}.query()") == 2
    row = pg.ev(f"{sv}.rows()")[1]
    assert float(row[-3]) == pytest.approx(res.examples[0].probs[first["siteIndex"]][first["head"], 2, 1], abs=6e-5)
    pt = pg.ev(f"{MV}.point(1, 3)")
    pg.page.mouse.click(pt["x"], pt["y"])
    assert pg.ev(f"{HV}.state()")["heads"] == [3]
    pg.clean()


def test_first_draw_of_30_by_9_heads_at_512_tokens(browser, tmp_path):
    """SmolLM2's shape (30 layers x 9 heads), a 512-token causal example: the first draw's time."""
    rng = np.random.default_rng(0)
    T = 512
    tri = np.tril(np.ones((T, T), dtype=np.float32))
    maps = []
    for _ in range(30):
        m = rng.random((9, T, T)).astype(np.float32) ** 8 * tri
        maps.append(m / m.sum(-1, keepdims=True))
    data = model_view_data(maps, [Site("decoder", x, causal=True) for x in range(30)])
    path = tmp_path / "big.html"
    path.write_text(view_page(render_model_view(data), "30 x 9"), encoding="utf-8")
    pg = Page(browser, path)
    pg.page.wait_for_function(f"{MV}.timings.firstFrameMs !== null")
    t = pg.ev(f"{MV}.timings")
    print(f"model view 30 x 9 heads, 512 tokens: first draw {t['firstDrawMs']:.0f} ms, first frame "
          f"{t['firstFrameMs']:.0f} ms, page {path.stat().st_size / 1e6:.2f} MB")
    assert t["firstDrawMs"] < 3000
    s = data["sites"][29]
    want = np.rint(pool_map(maps[29][8], 32)[0] * LEVELS)
    assert np.array_equal(pg.ev(f"{MV}.drawn(29, 8)"), want) and s["rows"] == 32
    pg.page.screenshot(path=str(tmp_path / "big.png"))
    pg.clean()


def test_encoder_decoder_model_view_draws_each_site_kind(browser, tmp_path):
    lm = tiny_model("t5")
    mv = model_view(lm, Text("the cat sat on the mat and then it ran away", target="a dog"))
    pg = Page(browser, mv.save(tmp_path / "mv.html"))
    assert pg.ev("document.querySelectorAll('.probe-mv .mv-grid-title').length") == 3
    for x, s in enumerate(mv.data["sites"]):
        assert np.array_equal(pg.ev(f"{MV}.drawn({x}, 1)"), cells_of(s, 1))
    cross = next(x for x, s in enumerate(mv.data["sites"]) if s["name"].endswith("cross"))
    pt = pg.ev(f"{MV}.point({cross}, 3)")
    pg.page.mouse.click(pt["x"], pt["y"])
    st = pg.ev(f"{HV}.state()")
    assert st["layer"] == cross and st["heads"] == [3]
    pg.page.screenshot(path=str(tmp_path / "mv.png"), full_page=True)
    pg.clean()
