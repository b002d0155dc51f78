"""Encoder-decoder head views, each site drawn on its own tokens: `show(lm, Text(source, target=...))`
on a tiny Marian used to draw the decoder's self-attention and cross-attention with the *source*
tokens on both axes when the two sides had equal length, and failed with a shape error when they did
not; the report's view looked labels up by (layer, head) only, so the decoder's and cross-attention's
rows overwrote the encoder's.

Right: each site is drawn with its own query tokens (the decoder's: its start token, then the target)
and key tokens (the source for cross-attention), and every head's label is looked up by its site
(stack, layer, kind). The reference here is the model's own ``output_attentions=True`` path, run on
the pair alone, and the tokenizer called directly."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import tiny_model
from probe.compare import load_run
from probe.entries.notebook import show
from probe.loading.seq2seq import decoder_start_id
from probe.report import write_run
from probe.runs.analysis import analyze
from probe.sites import Site
from probe.text.inputs import Text
from probe.text.tokens import display_tokens
from probe.view import label_grid
from probe.view.data import axis_tokens, decoded_map
from probe.view.html import site_labels

SOURCE = "The house is small."
WORDS = "Das Haus ist klein und rot und sehr alt und schön".split()


@pytest.fixture(scope="module")
def marian():
    return tiny_model("marian")


def reference(lm, source: str, target: str):
    """(source labels, target labels, {site name: [heads, query, key]}) from the model's own path."""
    tok = lm.tokenizer
    src = tok(source, return_tensors="pt", return_offsets_mapping=True, return_special_tokens_mask=True)
    tgt = tok(text_target=target, return_offsets_mapping=True, return_special_tokens_mask=True)
    start = decoder_start_id(lm)
    dec = torch.tensor([[start, *tgt["input_ids"]]])
    with torch.no_grad():
        out = lm.model(input_ids=src["input_ids"], attention_mask=src["attention_mask"], decoder_input_ids=dec,
                       output_attentions=True)
    maps = {}
    for layer, a in enumerate(out.encoder_attentions):
        maps[f"encoder.{layer}.self"] = a[0].numpy()
    for layer, (s, c) in enumerate(zip(out.decoder_attentions, out.cross_attentions)):
        maps[f"decoder.{layer}.self"], maps[f"decoder.{layer}.cross"] = s[0].numpy(), c[0].numpy()
    source_labels = display_tokens(tok, source, src["input_ids"][0].tolist(),
                                   [tuple(o) for o in src["offset_mapping"][0].tolist()],
                                   [bool(x) for x in src["special_tokens_mask"][0].tolist()])
    target_labels = display_tokens(tok, target, [start, *tgt["input_ids"]],
                                   [(0, 0), *map(tuple, tgt["offset_mapping"])],
                                   [True, *map(bool, tgt["special_tokens_mask"])])
    return source_labels, target_labels, maps


def targets(lm) -> tuple[str, str]:
    """A target whose decoder side (start token + target) has as many tokens as the source, and one
    that has more."""
    n_source = len(lm.tokenizer(SOURCE)["input_ids"])
    lengths = {}
    for k in range(1, len(WORDS) + 1):
        text = " ".join(WORDS[:k])
        lengths[text] = 1 + len(lm.tokenizer(text_target=text)["input_ids"])
    equal = [t for t, n in lengths.items() if n == n_source]
    longer = [t for t, n in lengths.items() if n > n_source + 2]
    assert equal and longer, (n_source, lengths)
    return equal[0], longer[0]


@pytest.mark.parametrize("which", ["equal", "unequal"])
def test_show_draws_each_site_with_its_own_query_and_key_tokens(marian, which):
    target = targets(marian)[0 if which == "equal" else 1]
    view = show(marian, Text(SOURCE, target=target))
    data = view.data
    source_labels, target_labels, maps = reference(marian, SOURCE, target)
    assert (len(source_labels) == len(target_labels)) == (which == "equal")
    names = [s.name for s in marian.sites]
    assert data["layers"] == list(range(len(names))) and data["layerNames"] == names
    for li, name in enumerate(names):
        queries, keys = axis_tokens(data, li)
        want_q = source_labels if name.startswith("encoder") else target_labels
        want_k = target_labels if name.endswith(".self") and name.startswith("decoder") else source_labels
        assert queries == want_q and keys == want_k, name
        for h in range(data["heads"]):
            np.testing.assert_allclose(decoded_map(data, li, h), maps[name][h], atol=5e-4, err_msg=f"{name} H{h}")
    # every head named by its site
    assert data["headNames"][names.index("decoder.1.cross")][2] == "cross L1H2"
    assert data["headNames"][names.index("encoder.0.self")][0] == "enc L0H0"
    assert data["layerTitles"][names.index("decoder.0.self")] == "dec layer 0"


def test_labels_are_looked_up_by_site_not_by_layer_and_head():
    """Three heads at layer 0, head 0, one per site kind, each with its own label."""
    heads = pd.DataFrame({"stack": ["encoder", "decoder", "decoder"], "kind": ["self", "self", "cross"],
                          "layer": [0, 0, 0], "head": [0, 0, 0], "label": ["previous-token", "self", "broad"]})
    sites = [Site("encoder", 0), Site("decoder", 0, "self"), Site("decoder", 0, "cross")]
    assert site_labels(heads, sites) == {(0, 0): "previous-token", (1, 0): "self", (2, 0): "broad"}
    grid = label_grid(heads).data
    assert grid.loc[("enc", 0), 0] == "previous-token" and grid.loc[("dec", 0), 0] == "self"
    assert grid.loc[("cross", 0), 0] == "broad" and list(grid.index.get_level_values(0)) == ["enc", "dec", "cross"]


def test_report_view_and_a_loaded_run_key_every_head_by_its_site(marian, tmp_path):
    equal, longer = targets(marian)
    res = analyze(marian, [Text(SOURCE, target=longer), Text("A dog.", target=equal)])
    path = write_run(res, marian.tokenizer, tmp_path / "run")
    html = (path / "index.html").read_text(encoding="utf-8")
    raw = re.search(r'class="probe-hv-data">(.*?)</script>', html, re.S).group(1)
    data = json.loads(raw)
    names = [s.name for s in marian.sites]
    assert data["layerNames"] == names
    by_site = {(r["stack"], int(r["layer"]), r["kind"], int(r["head"])): r["label"]
               for r in res.heads.to_dict("records")}
    for li, name in enumerate(names):
        stack, layer, kind = name.split(".")
        for h in range(data["heads"]):
            label = by_site[(stack, int(layer), kind, h)]
            assert data["headLabels"][li][h] == ("" if label == "mixed" else label), (name, h)
    source_labels, target_labels, _ = reference(marian, SOURCE, longer)
    cross = names.index("decoder.0.cross")
    assert axis_tokens(data, cross) == (target_labels, source_labels)
    # the run folder keeps the decoder's maps and tokens: the loaded run shows the same view
    loaded = show(load_run(path), layers=[cross])
    assert axis_tokens(loaded.data, 0) == (target_labels, source_labels)
    np.testing.assert_allclose(decoded_map(loaded.data, 0, 1), decoded_map(data, cross, 1), atol=1e-3)
    assert loaded.data["headLabels"][0] == data["headLabels"][cross]


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


@pytest.mark.parametrize("which", ["equal", "unequal"])
def test_page_draws_target_rows_and_source_columns(marian, browser, tmp_path, which):
    target = targets(marian)[0 if which == "equal" else 1]
    view = show(marian, Text(SOURCE, target=target), threshold=0.001)
    source_labels, target_labels, maps = reference(marian, SOURCE, target)
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(view.save(tmp_path / "view.html").as_uri())
    page.wait_for_selector(".probe-hv[data-draws]")
    v = "document.querySelector('.probe-hv').probeView"
    names = [s.name for s in marian.sites]
    for name, (want_q, want_k) in {"encoder.1.self": (source_labels, source_labels),
                                   "decoder.1.self": (target_labels, target_labels),
                                   "decoder.1.cross": (target_labels, source_labels)}.items():
        page.evaluate(f"{v}.setLayer({names.index(name)}); {v}.setHeads([0, 3])")
        st = page.evaluate(f"{v}.state()")
        assert st["queries"] == want_q and st["keys"] == want_k, name
        last = len(want_q) - 1  # the last query row: lines to every key of its own side
        pt = page.evaluate(f"{v}.point('q', {last})")
        page.mouse.move(pt["x"], pt["y"])
        lines = page.evaluate(f"{v}.lines()")
        want = {(h, last, k) for h in (0, 3) for k in range(len(want_k)) if maps[name][h, last, k] >= 0.001 + 5e-4}
        got = {(d["head"], d["query"], d["key"]) for d in lines}
        assert want <= got and all(d["key"] < len(want_k) for d in lines), name
        strip = page.evaluate(f"{v}.strip()")
        np.testing.assert_allclose(strip["3"], maps[name][3, last], atol=5e-4)
        page.mouse.move(2, 2)
    page.screenshot(path=str(tmp_path / f"seq2seq-{which}.png"), full_page=True)
    assert errors == []
    page.close()


def test_layer_menu_shows_the_layer_drawn_first(marian, browser, tmp_path):
    """The view opens on the initial layer (the report opens on its chosen head's layer): the layer
    menu names that layer, not the first one."""
    target = targets(marian)[1]
    view = show(marian, Text(SOURCE, target=target), layer=3, heads=[1])
    page = browser.new_page()
    page.goto(view.save(tmp_path / "v.html").as_uri())
    page.wait_for_selector(".probe-hv[data-draws]")
    menu = page.evaluate("""(() => { const s = document.querySelector('.probe-hv .hv-bar select');
        return [s.value, s.options[s.selectedIndex].textContent]; })()""")
    v = "document.querySelector('.probe-hv').probeView"
    assert menu == ["3", "cross layer 0"] and page.evaluate(f"{v}.state().layer") == 3
    assert page.evaluate(f"{v}.state().keys") == reference(marian, SOURCE, target)[0]
    page.close()
