"""probe compare and load_run: alignment by relative depth, differences B - A against an independent
lookup, removed heads, run folders read back, the comparison folder, the command line; on the
embedded models: minilm vs smollm2, and a run vs itself (every difference exactly 0)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import probe.loading.models as pm
from conftest import tiny_model
from probe.cli import main
from probe.compare import align_layers, compare_runs, label_counts, layer_summary, load_run, most_changed, write_compare
from probe.errors import InputError
from probe.measures.stats import STATISTICS
from probe.report import CSP, write_run
from probe.runs.analysis import analyze
from probe.text.tokens import display_tokens

TEXTS = ["The cat sat on the mat, and then it slept.", "When Maria finished, she celebrated.", "Short one."]


def run(*args):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs on the same texts: a 2-layer BERT (A), a 3-layer GPT-2 (B), A again (another seed)."""
    root = tmp_path_factory.mktemp("cmp")
    lm_a, lm_b, lm_c = tiny_model("bert"), tiny_model("gpt2", layers=3), tiny_model("bert", seed=1)
    res = {k: analyze(lm, TEXTS) for k, lm in (("a", lm_a), ("b", lm_b), ("c", lm_c))}
    folders = {k: write_run(r, lm.tokenizer, root / k) for (k, r), lm in zip(res.items(), (lm_a, lm_b, lm_c))}
    return res, folders, {"a": lm_a, "b": lm_b, "c": lm_c}


def test_align_layers_by_relative_depth():
    assert align_layers(6, 30) == [0, 6, 12, 17, 23, 29]      # round(i * 29 / 5), half up
    assert align_layers(4, 4) == [0, 1, 2, 3]
    assert align_layers(30, 6)[:7] == [0, 0, 0, 1, 1, 1, 1]    # round(i * 5 / 29): 0.52 -> 1 at i = 3
    assert align_layers(3, 2) == [0, 1, 1]                    # 0.5 rounds up
    assert align_layers(1, 5) == [0]
    with pytest.raises(ValueError):
        align_layers(0, 3)


def test_a_run_against_itself_differs_by_exactly_zero(runs):
    res, folders, _ = runs
    for a, b in ((res["a"], res["a"]), (folders["a"], folders["a"])):
        df = compare_runs(a, b)
        assert len(df) == 8 and (df["status"] == "both").all() and not df["label_changed"].any()
        for s in STATISTICS:
            d = df[f"delta_{s}"]
            assert ((d == 0) | (d.isna() & df[f"{s}_a"].isna())).all(), s
        assert df.attrs["notes"] == [] and (df["change"] == 0).all()


def test_differences_are_b_minus_a_of_the_aligned_heads(runs):
    """2-layer A vs 3-layer B: layer i of A with layer round(i * 2 / 1) of B; every delta equals an
    independent lookup in both heads tables."""
    res, _, _ = runs
    a, b = res["a"], res["b"]
    df = compare_runs(a, b)
    assert df.attrs["layer_map"] == [0, 2] and list(df["layer_b"]) == [0] * 4 + [2] * 4
    assert any("relative depth" in n and "0->0; 1->2" in n for n in df.attrs["notes"])
    assert any("encoder and the other a decoder" in n for n in df.attrs["notes"])
    ha, hb = a.heads.set_index(["layer", "head"]), b.heads.set_index(["layer", "head"])
    for row in df.itertuples():
        for s in STATISTICS:
            va, vb = ha.loc[(row.layer, row.head), s], hb.loc[(row.layer_b, row.head), s]
            got = getattr(row, f"delta_{s}")
            assert (math.isnan(got) and (math.isnan(va) or math.isnan(vb))) or got == vb - va, (row, s)
        assert row.label_changed == (ha.loc[(row.layer, row.head), "label"] != hb.loc[(row.layer_b, row.head), "label"])
        probs = [abs(getattr(row, f"delta_{s}")) for s in STATISTICS if s not in ("entropy", "distance")]
        assert row.change == pytest.approx(np.nanmean(probs))
    assert list(df.columns[:8]) == ["layer", "head", "layer_b", "status", "label_a", "label_b", "label_changed",
                                    "change"]
    top = most_changed(df, 3)
    assert list(top["change"]) == sorted(df["change"], reverse=True)[:3]
    # per-layer means come from each run's own heads
    lay = layer_summary(a, b, df)
    assert lay.loc[1, "prev_b"] == pytest.approx(b.heads[b.heads.layer == 2]["prev"].mean())
    counts = label_counts(a, b).set_index("label")
    assert counts["A"].sum() == 8 and counts["B"].sum() == 12


def test_removed_and_missing_heads_count_as_removed(runs):
    """A pruned model's run: heads labelled 'removed' (NaN statistics) or missing from heads.csv."""
    res, _, _ = runs
    a = res["a"]
    b = load_run_like(a)
    heads = b.heads.copy()
    gone = (heads["layer"] == 0) & (heads["head"] == 1)
    heads.loc[gone, ["label", "labels"]] = "removed"
    heads.loc[gone, list(STATISTICS)] = np.nan
    b.heads = heads[~((heads["layer"] == 1) & (heads["head"] == 3))].reset_index(drop=True)
    df = compare_runs(a, b).set_index(["layer", "head"])
    assert df.loc[(0, 1), "status"] == "removed in B" and df.loc[(1, 3), "status"] == "removed in B"
    assert df.loc[(1, 3), "label_b"] == "removed" and not df.loc[(0, 1), "label_changed"]
    assert df.loc[[(0, 1), (1, 3)]].filter(like="delta_").isna().all().all()
    assert (df.drop(index=[(0, 1), (1, 3)])["status"] == "both").all()
    assert (0, 1) not in set(map(tuple, most_changed(df.reset_index(), 8)[["layer", "head"]].to_numpy()))
    assert compare_runs(b, a).set_index(["layer", "head"]).loc[(0, 1), "status"] == "removed in A"


def load_run_like(result):
    from dataclasses import replace

    return replace(result, heads=result.heads.copy())


def test_load_run_reads_back_what_the_analysis_returned(runs):
    res, folders, lms = runs
    a, loaded = res["a"], load_run(folders["a"])
    assert loaded.model == json.loads(json.dumps(a.model)) and loaded.stats is None
    assert loaded.thresholds == a.thresholds and loaded.counts == a.counts
    assert loaded.settings["run_folder"] == str(folders["a"])
    pd.testing.assert_frame_equal(loaded.heads[["layer", "head", "label", "labels"]],
                                  a.heads[["layer", "head", "label", "labels"]])
    stats = list(STATISTICS)
    np.testing.assert_allclose(loaded.heads[stats].to_numpy(float), a.heads[stats].to_numpy(float), rtol=1e-5)
    assert len(loaded.examples) == len(a.examples) == 3
    for le, ex in zip(loaded.examples, a.examples):
        assert (le.index, le.text, le.ids, le.special, le.word_ids) == (ex.index, ex.text, ex.ids, ex.special,
                                                                         ex.word_ids)
        assert le.offsets == ex.offsets
        np.testing.assert_allclose(le.probs, ex.probs, atol=5e-4)          # float16
        assert le.labels == display_tokens(lms["a"].tokenizer, ex.text, ex.ids, ex.offsets, ex.special)


def test_load_run_errors(tmp_path, runs):
    with pytest.raises(InputError, match="no run folder"):
        load_run(tmp_path / "nope")
    with pytest.raises(InputError, match="no heads.csv"):
        load_run(tmp_path)
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "heads.csv").write_text("layer,head\n0,0\n")
    (folder / "run.json").write_text("{not json")
    with pytest.raises(InputError, match="cannot read the run folder"):
        load_run(folder)
    # a folder written before examples.npz: loads, with a note and no examples
    _, folders, _ = runs
    old = tmp_path / "old"
    old.mkdir()
    for name in ("heads.csv", "run.json"):
        (old / name).write_bytes((folders["a"] / name).read_bytes())
    r = load_run(old)
    assert r.examples == [] and any("examples.npz" in n for n in r.notes)


def test_write_compare_folder(runs, tmp_path):
    res, folders, _ = runs
    path = write_compare(folders["a"], folders["b"], tmp_path / "cmp", top=2)
    assert sorted(p.name for p in path.iterdir()) == [".probe-files.json", "compare.csv", "compare.json", "index.html"]
    csv = pd.read_csv(path / "compare.csv")
    assert {"layer", "head"} <= set(csv.columns) and all(f"delta_{s}" in csv.columns for s in STATISTICS)
    np.testing.assert_allclose(csv["delta_prev"], compare_runs(folders["a"], folders["b"])["delta_prev"], rtol=1e-5)
    rec = json.loads((path / "compare.json").read_text())
    assert rec["layer_map"] == [0, 2] and rec["shared_example"] == TEXTS[0]
    html = (path / "index.html").read_text(encoding="utf-8")
    assert f'content="{CSP}"' in html.replace("&#39;", "'") and "relative depth" in html
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
    figs = json.loads(re.search(r'id="probe-data">(.*?)</script>', html, re.S).group(1))["figures"]
    pairs = sorted(k for k in figs if k.startswith("pair-"))
    assert len(pairs) == 4 and any(k.endswith("-A") for k in pairs) and any(k.endswith("-B") for k in pairs)
    top = most_changed(compare_runs(folders["a"], folders["b"]), 2).iloc[0]
    fig = figs[f"pair-{int(top['layer'])}-{int(top['head'])}-B"]
    ex_b = load_run(folders["b"]).examples[0]
    n = fig["rows"]
    np.testing.assert_allclose(np.array(fig["values"]).reshape(n, n) / 1000,
                               ex_b.probs[int(top["layer_b"]), int(top["head"]), :n, :n], atol=5e-4)
    # no shared example text: said, and nothing drawn side by side
    other = write_run(analyze(tiny_model("bert"), ["Different words entirely."]), tiny_model("bert").tokenizer,
                      tmp_path / "other")
    path = write_compare(folders["a"], other, tmp_path / "cmp2")
    assert "no example of the same text" in (path / "index.html").read_text(encoding="utf-8")
    with pytest.raises(InputError, match="already exists"):
        write_compare(folders["a"], other, tmp_path / "cmp2")


def test_compare_command(runs, tmp_path, monkeypatch):
    _, folders, lms = runs
    out = tmp_path / "c"
    r = run("compare", str(folders["a"]), str(folders["c"]), "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "8 heads in both" in r.stdout and f"Report: {out / 'index.html'}" in r.stdout
    assert run("compare", str(folders["a"])).exit_code == 2
    assert run("compare", str(folders["a"]), str(folders["c"]), "--text", "x").exit_code == 2
    assert run("compare", "--model", "x").exit_code == 2
    bad = run("compare", str(folders["a"]), str(tmp_path / "missing"))
    assert bad.exit_code == 1 and "Error: no run folder" in bad.stderr
    taken = run("compare", str(folders["a"]), str(folders["c"]), "--out", str(out))
    assert taken.exit_code == 1 and "already exists" in taken.stderr
    # --model A --model B on one corpus
    monkeypatch.setattr(pm, "load_model", lambda name, **kw: lms[name])
    out2 = tmp_path / "m"
    r = run("compare", "--model", "a", "--model", "b", "--text", TEXTS[0], "--text", TEXTS[1], "--out", str(out2))
    assert r.exit_code == 0, r.output
    csv = pd.read_csv(out2 / "compare.csv")
    assert len(csv) == 8 and sorted(set(csv["layer_b"])) == [0, 2]
    assert "relative depth" in r.stderr


# --------------------------------------------------------------------------- embedded models

@pytest.mark.slow
def test_minilm_vs_smollm2_and_a_run_vs_itself(minilm, smollm2, tmp_path, monkeypatch):
    """`probe compare` on the embedded models (one corpus, --model twice), then on run folders:
    a run against itself gives differences of exactly 0."""
    monkeypatch.setattr(pm, "load_model", lambda name, **kw: {"minilm": minilm, "smollm2": smollm2}[name])
    out = tmp_path / "mx"
    r = run("compare", "--model", "minilm", "--model", "smollm2", "--limit", "8", "--out", str(out))
    assert r.exit_code == 0, r.output
    csv = pd.read_csv(out / "compare.csv")
    assert len(csv) == 6 * 12 and sorted(set(csv["layer_b"])) == [0, 6, 12, 17, 23, 29]
    assert (csv.loc[csv["head"] >= 9, "status"] == "only in A").all()
    assert (csv.loc[csv["head"] < 9, "status"] == "both").all()
    assert csv["delta_next"].isna().all() and csv["delta_sep"].isna().all()   # a decoder has neither
    rec = json.loads((out / "compare.json").read_text())
    assert rec["shared_example"] is not None and rec["counts"]["only in A"] == 18
    # the same through run folders, and a run against itself
    folders = {}
    for name in ("minilm", "smollm2"):
        folders[name] = tmp_path / name
        assert run("analyze", "--model", name, "--limit", "8", "--out", str(folders[name])).exit_code == 0
    r = run("compare", str(folders["minilm"]), str(folders["smollm2"]), "--out", str(tmp_path / "fx"))
    assert r.exit_code == 0, r.output
    folder_csv = pd.read_csv(tmp_path / "fx" / "compare.csv")
    np.testing.assert_allclose(folder_csv["delta_prev"], csv["delta_prev"], rtol=1e-4, atol=1e-6)
    r = run("compare", str(folders["smollm2"]), str(folders["smollm2"]), "--out", str(tmp_path / "self"))
    assert r.exit_code == 0, r.output
    same = pd.read_csv(tmp_path / "self" / "compare.csv")
    deltas = same.filter(like="delta_")
    assert ((deltas == 0) | deltas.isna()).all().all() and (deltas == 0).sum().sum() > 270 * 8
    assert not same["label_changed"].any() and (same["status"] == "both").all()


# --------------------------------------------------------------------------- encoder-decoder runs

def test_encoder_decoder_runs_are_compared_site_by_site(tmp_path):
    """Each head is matched within its own (stack, kind): a cross-attention head of A with the
    cross-attention head of B at the same layer and index, never with an encoder head; the page
    draws one grid per site kind and names heads enc/dec/cross L4H5."""
    from probe.text.inputs import Text

    pairs = [Text("The cat sat on the mat.", target="Le chat."), Text("A dog ran home.", target="Un chien court.")]
    lm_a, lm_b = tiny_model("marian"), tiny_model("bart")
    a, b = analyze(lm_a, pairs), analyze(lm_b, pairs)
    df = compare_runs(a, b)
    assert list(df.columns[:4]) == ["stack", "kind", "layer", "head"] and len(df) == len(a.heads)
    key = ["stack", "kind", "layer", "head"]
    ha, hb = a.heads.set_index(key), b.heads.set_index(key)
    for r in df.to_dict("records"):
        site = (r["stack"], r["kind"], r["layer"], r["head"])
        for stat in ("first", "entropy", "aligned"):
            want = hb.loc[site, stat] - ha.loc[site, stat]
            got = r[f"delta_{stat}"]
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12), (site, stat)
        assert r["label_a"] == ha.loc[site, "label"] and r["label_b"] == hb.loc[site, "label"]
    assert df.attrs["layer_map"] == {"encoder.self": [0, 1], "decoder.self": [0, 1], "decoder.cross": [0, 1]}
    summary = layer_summary(a, b, df)
    cross0 = summary[(summary["kind"] == "cross") & (summary["layer"] == 0)].iloc[0]
    rows = a.heads[(a.heads["kind"] == "cross") & (a.heads["layer"] == 0)]
    assert cross0["first_a"] == pytest.approx(rows["first"].mean())
    path = write_compare(write_run(a, lm_a.tokenizer, tmp_path / "a"), write_run(b, lm_b.tokenizer, tmp_path / "b"),
                         tmp_path / "cmp", top=len(df))  # every head side by side
    html = (path / "index.html").read_text(encoding="utf-8")
    for title in ("encoder self-attention", "decoder self-attention", "cross-attention (decoder queries"):
        assert html.count(f"<h3>{title}") == 2  # the label grid and the differences
    assert re.search(r'title="A (enc|dec|cross) L\dH\d: ', html)
    figs = json.loads(re.search(r'id="probe-data">(.*?)</script>', html, re.S).group(1))["figures"]
    cross = [f for k, f in figs.items() if k.startswith("pair-decoder-cross-")]
    assert len(cross) == 2 * 8  # 2 layers x 4 heads, A and B
    for f in cross:  # target rows, source columns, from the run folder's own maps
        assert f["yLabel"] == "query (attending)" and f["rows"] == len(a.examples[0].target["ids"])
        assert f["cols"] == len(a.examples[0].ids)
    with pytest.raises(InputError, match="is an encoder-decoder model and the other run's model is not"):
        compare_runs(a, analyze(tiny_model("bert"), TEXTS))


def test_note_on_different_text_says_what_differs(tmp_path):
    """One model on two texts: the differences are the text's (not 'the models mixed with their
    input'); two models on two texts: they mix the models with the input; one text: no note."""
    bert, gpt2 = tiny_model("bert"), tiny_model("gpt2")
    a, b = analyze(bert, TEXTS[:2]), analyze(bert, ["Birds sing in the morning; they fly away."])
    notes = [n for n in compare_runs(a, b).attrs["notes"] if "different text" in n]
    assert notes == [f"the runs analysed different text (A: 2 sequences ({TEXTS[0][:40]!r} ...); B: 1 sequence "
                     "('Birds sing in the morning; they fly away' ...)) with the same model (tiny-bert-wordpiece): "
                     "every difference is the text's, not the model's (how its heads behave on the one text and "
                     "on the other)"]
    assert not any("different models" in n or "mixes the models" in n for n in compare_runs(a, b).attrs["notes"])
    other = analyze(gpt2, ["Birds sing in the morning; they fly away."])
    mixed = compare_runs(a, other).attrs["notes"]
    assert any(n.endswith("each difference mixes the models with their input; for a comparison of heads, analyse "
                          "the same corpus with both") for n in mixed)
    assert not any("different text" in n for n in compare_runs(a, analyze(bert, TEXTS[:2])).attrs["notes"])
    # the page's note on the missing side-by-side view: one model needs the same text, not 'both models'
    page_notes = json.loads((write_compare(a, b, tmp_path / "ab", tokenizers=(bert.tokenizer, bert.tokenizer))
                             / "compare.json").read_text(encoding="utf-8"))["notes"]
    assert page_notes[-1].endswith("so attention is not shown side by side; analyse the same text in both runs to "
                                   "see it.")
