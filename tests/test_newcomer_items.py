"""Smaller things a newcomer hit, each with the value it should have: a token limit the special
tokens fill alone is blamed on the limit (not the text); the report lists the examples it draws and
leaves out an empty section; compare says which run lacks a statistic, says why nothing is side by
side and notes runs on different text; an explicit ``layers=`` in ``show`` keeps the size cap; the
head view's tooltip never shows the value of the previous mouse event; heatmap titles are never
clipped; notebooks get no TqdmWarning."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

from conftest import save_tiny, tiny_model
from probe.capture.maps import encode
from probe.cli import main
from probe.compare import write_compare
from probe.entries.notebook import show
from probe.errors import InputError
from probe.report import write_run
from probe.runs.analysis import analyze
from probe.view.data import decoded_map

TEXTS = ["The cat sat on the mat, and then it slept.", "When Maria finished, she celebrated.", "Short one."]


# --------------------------------------------------------------------------- token limit

def test_a_limit_the_special_tokens_fill_blames_the_limit(tmp_path):
    lm = tiny_model("bert")  # [CLS] ... [SEP]: two special tokens
    with pytest.raises(InputError, match=r"max length 2 is too small: the model adds 2 special tokens to a sequence"
                                         r".*3 or more"):
        encode(lm, ["The cat sat."], max_length=2)
    with pytest.raises(InputError, match=r"adds 3 special tokens to a sentence pair.*4 or more"):
        from probe.text.inputs import Text
        encode(lm, [Text("The cat.", pair="A dog.")], max_length=3)
    assert int(encode(lm, ["The cat sat."], max_length=3).lengths[0]) == 3  # one token of the text fits
    with pytest.raises(InputError, match="has no tokens besides special tokens"):  # the text's own fault
        encode(lm, ["   "])
    folder = save_tiny("bert", tmp_path / "bert")
    r = CliRunner().invoke(main, ["analyze", "--model", str(folder), "--text", "The cat sat.", "--max-length", "2",
                                  "--out", str(tmp_path / "run"), "--no-progress"])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert r.exit_code == 1 and len(errors) == 1 and "max length 2 is too small" in errors[0], r.output
    assert "text 1" not in errors[0] and not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- the report's examples

def _page(path) -> str:
    return (path / "index.html").read_text(encoding="utf-8")


def _figures(html: str) -> dict:
    return json.loads(re.search(r'id="probe-data">(.*?)</script>', html, re.S).group(1))["figures"]


def test_report_lists_the_examples_it_draws_and_omits_an_empty_section(tmp_path):
    lm = tiny_model("bert")
    res = analyze(lm, TEXTS, n_examples=3)
    html = _page(write_run(res, lm.tokenizer, tmp_path / "three"))
    drawn = {k.rsplit("-", 1)[1] for k in _figures(html) if k.startswith("attn-")}
    listed = re.findall(r"<blockquote>Example (\d+) ", html)
    assert drawn == {"0", "1"} and listed == ["1", "2"]  # 2 drawn, the same 2 listed
    assert "3 kept: all are in examples.npz" in html
    none = analyze(lm, TEXTS, n_examples=0)
    html = _page(write_run(none, lm.tokenizer, tmp_path / "zero"))
    assert "Attention of selected heads" not in html and "<blockquote>Example" not in html
    assert 'id="head-view"' not in html and not (tmp_path / "zero" / "examples.npz").exists()
    one = analyze(lm, TEXTS[:1], n_examples=1)
    html = _page(write_run(one, lm.tokenizer, tmp_path / "one"))
    assert "on the first 1 example." in html and "kept:" not in html
    assert re.search(r"· 1 sequence, \d+ tokens</p>", html)


# --------------------------------------------------------------------------- compare

@pytest.fixture(scope="module")
def runs():
    bert, gpt2 = tiny_model("bert"), tiny_model("gpt2")
    return {"bert": analyze(bert, TEXTS), "gpt2": analyze(gpt2, TEXTS), "other": analyze(bert, ["Different words."]),
            "lms": (bert.tokenizer, gpt2.tokenizer)}


def _na_blocks(html: str) -> dict:
    return dict(re.findall(r'<div class="na">\|\u0394 (\w+)\|: ([^<]*)</div>', html))


def test_compare_says_which_run_lacks_a_statistic(runs, tmp_path):
    a, b = runs["bert"], runs["gpt2"]
    assert a.heads["next"].notna().all() and b.heads["next"].isna().all()  # a decoder has no next token
    html = _page(write_compare(a, b, tmp_path / "ab", tokenizers=runs["lms"]))
    na = _na_blocks(html)
    assert na["next"] == f"not defined for run B ({b.model['name']})"
    html = _page(write_compare(b, a, tmp_path / "ba", tokenizers=runs["lms"][::-1]))
    assert _na_blocks(html)["next"] == f"not defined for run A ({b.model['name']})"
    assert "not defined for both runs" not in html


def test_compare_without_shared_text_says_so_and_notes_the_other_input(runs, tmp_path):
    bert, _ = runs["lms"]
    path = write_compare(runs["bert"], runs["other"], tmp_path / "c", tokenizers=(bert, bert))
    html = _page(path)
    section = html.split("<h2>Most changed heads, side by side</h2>")[1].split("<script")[0]
    assert "The runs kept no example of the same text" in section and 'data-fig="pair-' not in section
    notes = json.loads((path / "compare.json").read_text(encoding="utf-8"))["notes"]
    different = [n for n in notes if n.startswith("the runs analysed different text")]
    assert len(different) == 1 and "A: 3 sequences" in different[0] and "B: 1 sequence (" in different[0]
    same = json.loads((write_compare(runs["bert"], runs["gpt2"], tmp_path / "s", tokenizers=runs["lms"])
                       / "compare.json").read_text(encoding="utf-8"))["notes"]
    assert not any("different text" in n for n in same)


# --------------------------------------------------------------------------- show(layers=...) and the cap

def test_explicit_layers_keep_the_cap():
    lm = tiny_model("bert")  # 2 layers x 4 heads
    text = "The cat sat on the mat."
    n = int(encode(lm, [text]).lengths[0])
    per_layer = 4 * n * n
    with pytest.raises(InputError, match=rf"layers \[0, 1\] hold {2 * per_layer:,} numbers .* at most "
                                         rf"{per_layer:,} .* max_values={2 * per_layer}"):
        show(lm, text, layers=[0, 1], max_values=per_layer)
    assert show(lm, text, layers=[0, 1], max_values=2 * per_layer).data["values"] == 2 * per_layer
    chosen = show(lm, text, max_values=per_layer).data  # no layers given: the cap chooses, and says so
    assert chosen["layers"] == [0] and "layers 0 of 2 included" in chosen["notes"][0]
    res = analyze(lm, [text])
    with pytest.raises(InputError, match="hold .* numbers"):
        show(res, tokenizer=lm.tokenizer, layers=[0, 1], max_values=per_layer)


# --------------------------------------------------------------------------- in Chromium

@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium on PATH")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def test_tooltip_shows_the_value_of_this_mouse_event(browser, tmp_path):
    """Hovering from a query straight onto a key: the tip of that one event is the key's own (its
    label only: the hovered key is now the focus), not the previous query's weight to it; with the
    query pinned, the tip is the page's weight from that query to the key, per selected head."""
    lm = tiny_model("bert")
    view = show(lm, "The cat sat on the mat, and then it slept.", heads=[1, 2])
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(view.save(tmp_path / "v.html").as_uri())
    page.wait_for_selector(".probe-hv[data-draws]")
    v = "document.querySelector('.probe-hv').probeView"
    labels = view.data["tokens"]
    q, k = page.evaluate(f"{v}.point('q', 3)"), page.evaluate(f"{v}.point('k', 5)")
    page.mouse.move(q["x"], q["y"])
    page.mouse.move(k["x"], k["y"], steps=1)  # one mousemove event, from the query onto the key
    assert page.evaluate(f"{v}.state().focus") == {"side": "k", "i": 5}
    assert page.evaluate(f"{v}.tip()") == f"{json.dumps(labels[5])} (key 5)"
    page.mouse.move(q["x"], q["y"])
    page.mouse.click(q["x"], q["y"])  # pin query 3
    page.mouse.move(k["x"], k["y"], steps=1)
    m = [decoded_map(view.data, 0, h) for h in range(4)]
    want = [f"{json.dumps(labels[5])} (key 5)"] + [f"L0H{h}: {m[h][3, 5]:.3f}" for h in (1, 2)]
    assert page.evaluate(f"{v}.tip()") == "\n".join(want)
    page.close()


def test_heatmap_titles_are_not_clipped_on_short_examples(browser, tmp_path):
    lm = tiny_model("bert")
    res = analyze(lm, ["Hi.", "Yes, ok."], n_examples=2)
    path = write_run(res, lm.tokenizer, tmp_path / "run")
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto((path / "index.html").as_uri())
    page.wait_for_selector("body[data-figures-drawn]")
    geoms = page.evaluate("""Array.from(document.querySelectorAll('canvas[data-fig]')).map(c => ({
        id: c.getAttribute('data-fig'), width: c.getBoundingClientRect().width, g: c._geom || null}))""")
    figures = _figures(_page(path))
    checked = 0
    for item in geoms:
        fig, g = figures[item["id"]], item["g"]
        if g is None or not fig.get("title") or "title" not in g:
            continue
        assert " ".join(g["title"]["lines"]) == fig["title"], item["id"]  # every word drawn
        assert g["title"]["x"] >= 0 and g["title"]["x"] + g["title"]["width"] <= item["width"] + 0.5, item
        checked += 1
    short = [i for i in geoms if i["id"].startswith("attn-")]
    assert short and checked >= len(short) and all(figures[i["id"]]["rows"] <= 6 for i in short)
    page.locator("canvas[data-fig^='attn-']").first.scroll_into_view_if_needed()
    page.screenshot(path=str(tmp_path / "titles.png"), full_page=True)
    page.close()


# --------------------------------------------------------------------------- notebooks

def test_a_notebook_that_loads_a_model_prints_no_tqdm_warning(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        pytest.skip("no python3 Jupyter kernel")
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    folder = save_tiny("bert", tmp_path / "bert")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import probe, pathlib\n"
        f"assert pathlib.Path(probe.__file__).resolve().is_relative_to({str(root)!r})\n"
        f"lm = probe.load_model({str(folder)!r})\n"
        "r = probe.analyze(lm, ['The cat sat.', 'A dog ran.'], progress=True)\n"
        "print(type(probe.util.progress_bar(total=1)).__module__, len(r.heads))")]
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(root)}}).execute()
    out = [o for o in nb.cells[0].outputs]
    text = "".join(o.get("text", "") for o in out)
    assert "TqdmWarning" not in text and "IProgress" not in text, text
    try:
        import ipywidgets  # noqa: F401
        bar = "tqdm.notebook"
    except ImportError:
        bar = "tqdm.std"  # no ipywidgets: tqdm's text bar, without the warning
    assert f"{bar} 8" in text  # 2 layers x 4 heads analysed
