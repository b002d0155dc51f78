"""Encoder-decoder models (BART, Marian, T5): pairs, sites, cross-attention statistics, --generate.

The reference here does not use probe's statistics: it runs each (source, target) pair ONE AT A
TIME, unpadded, through the model's own ``output_attentions=True`` path (``encoder_attentions``,
``decoder_attentions``, ``cross_attentions``) and applies the definitions of probe.measures.stats row by row
with numpy (float64). probe's batched, padded, hook-captured ``analyze`` must agree with it.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from transformers import DynamicCache, EncoderDecoderCache

from conftest import SCALED_STATISTICS, SEQ2SEQ, save_tiny, tiny_model
from probe.capture.maps import encode
from probe.errors import InputError
from probe.loading.seq2seq import as_targets, decoder_start_id, sides
from probe.measures.stats import ALIGN_WINDOW, HeadStatistics
from probe.runs.analysis import analyze
from probe.sites import Site
from probe.text.inputs import Text

PAIRS = [
    ("The cat sat on the mat.", "Le chat est assis sur le tapis."),
    ("A dog ran home quickly, then slept for a very long time.", "Un chien."),
    ("Yes.", "Oui, bien sûr, absolument, sans aucun doute."),
    ("Where is the station?", "Où est la gare ?"),
]
TEXTS = [Text(s, target=t) for s, t in PAIRS]


def _diag(i: int, S: int, T: int) -> int:
    return 0 if T == 1 else int(np.floor(i * (S - 1) / (T - 1) + 0.5))


def reference_cross_row(a: np.ndarray, i: int, S: int, T: int, sep: np.ndarray, punct: np.ndarray) -> dict:
    """The cross-attention statistics of one target row a [S] (float64)."""
    nz = a[a > 0]
    d = _diag(i, S, T)
    return {
        "first": a[0], "sep": a[sep].sum(), "punct": a[punct].sum(),
        "entropy": float(-(nz * np.log(nz)).sum()),
        "norm_entropy": float(-(nz * np.log(nz)).sum() / math.log(S)) if S >= 2 else float("nan"),
        "distance": float(sum(a[j] * abs(i * S / T - j) for j in range(S))),
        "max_weight": a.max(),
        "aligned": float(sum(a[j] for j in range(S) if abs(j - d) <= ALIGN_WINDOW)),
    }


def reference_cross(lm, texts) -> pd.DataFrame:
    """Cross-attention statistics per (layer, head): token-weighted means over every target row of
    every pair, each pair run alone and unpadded with output_attentions=True."""
    tok = lm.tokenizer
    eos = tok.eos_token_id
    sums, rows = {}, 0
    for t in texts:
        src = tok(t.text, return_tensors="pt")
        tgt = tok(text_target=t.target, return_tensors="pt")["input_ids"]
        dec = torch.cat([torch.tensor([[decoder_start_id(lm)]]), tgt], 1)
        with torch.no_grad():
            out = lm.model(**src, decoder_input_ids=dec, output_attentions=True)
        ids = src["input_ids"][0].tolist()
        S, T = len(ids), dec.shape[1]
        sep = np.array([x == eos for x in ids])
        pieces = [tok.decode([x]) for x in ids]
        punct = np.array([bool(p.strip()) and all(not c.isalnum() and not c.isspace() for c in p.strip())
                          and x not in tok.all_special_ids for p, x in zip(pieces, ids)])
        rows += T
        for layer, att in enumerate(out.cross_attentions):
            a = att[0].double().numpy()  # [heads, T, S]
            for h in range(a.shape[0]):
                for i in range(T):
                    for k, v in reference_cross_row(a[h, i], i, S, T, sep, punct).items():
                        sums[(layer, h, k)] = sums.get((layer, h, k), 0.0) + v
    keys = sorted({(layer, h) for layer, h, _ in sums})
    names = ["first", "sep", "punct", "entropy", "norm_entropy", "distance", "max_weight", "aligned"]
    return pd.DataFrame([{"layer": layer, "head": h, **{n: sums[(layer, h, n)] / rows for n in names}}
                         for layer, h in keys])


@pytest.mark.parametrize("kind", SEQ2SEQ)
def test_cross_statistics_match_an_independent_computation(kind):
    lm = tiny_model(kind)
    result = analyze(lm, TEXTS, batch_size=3)  # padded batches of 3 and 1: padding never enters
    cross = result.heads[result.heads["kind"] == "cross"].reset_index(drop=True)
    ref = reference_cross(lm, TEXTS)
    # float32 forward passes of a padded batch differ from unpadded ones: by a few 1e-6 on BART and
    # Marian, by up to 5e-5 on the tiny T5 (unscaled scores, initializer factor 3; in float64 the
    # two agree to the reference's float32 rounding): 1e-4 absolute, and relative 1e-4 on the
    # statistics with a scale (an entropy near 0 moves by the same absolute amount as a probability)
    for col in ["first", "entropy", "norm_entropy", "distance", "max_weight", "aligned", "sep"]:
        rtol = 1e-4 if col in SCALED_STATISTICS else 0.0
        np.testing.assert_allclose(cross[col].to_numpy(), ref[col].to_numpy(), err_msg=col, atol=1e-4, rtol=rtol)
    # what cross-attention does not define is NaN, never a number
    assert cross[["self", "prev", "next", "long"]].isna().all().all()


@pytest.mark.parametrize("kind", SEQ2SEQ)
def test_heads_have_encoder_decoder_and_cross_rows(kind):
    lm = tiny_model(kind)
    heads = analyze(lm, TEXTS).heads
    decoder_layers = lm.model.config.num_decoder_layers if kind == "t5" else lm.model.config.decoder_layers
    n_heads = lm.geometry.n_heads
    counts = heads.groupby(["stack", "kind"]).size().to_dict()
    assert counts == {("encoder", "self"): lm.geometry.n_layers * n_heads,
                      ("decoder", "self"): decoder_layers * n_heads, ("decoder", "cross"): decoder_layers * n_heads}
    assert list(heads.columns[:4]) == ["stack", "kind", "layer", "head"]
    assert heads.loc[heads["kind"] != "cross", "aligned"].isna().all()
    assert heads.loc[heads["kind"] == "cross", "aligned"].between(0, 1).all()


def test_batched_equals_one_at_a_time():
    lm = tiny_model("bart")
    one = analyze(lm, TEXTS, batch_size=1).heads
    many = analyze(lm, TEXTS, batch_size=4).heads
    num = [c for c in one.columns if one[c].dtype.kind == "f"]
    np.testing.assert_allclose(one[num].to_numpy(), many[num].to_numpy(), atol=2e-5, rtol=1e-5, equal_nan=True)


def _cross_batch(S_T: list[tuple[int, int]]):
    """A batch of tiny BART pairs with exactly S source and T target tokens per row."""
    lm = tiny_model("bart")
    texts = [Text(" ".join(["word"] * S), target=" ".join(["mot"] * (T - 1))) for S, T in S_T]
    batch = encode(lm, texts)
    assert batch.lengths.tolist() == [S for S, _ in S_T] and batch.target.lengths.tolist() == [T for _, T in S_T]
    return lm, batch


def _aligned_of(lm, batch, probs) -> float:
    site = Site("decoder", 0, "cross")
    stats = HeadStatistics([site], 1, lm.tokenizer)
    stats.update(site, probs, batch)
    return float(stats.result()["aligned"].iloc[0]), stats


def test_aligned_is_one_on_an_exactly_diagonal_map_and_the_share_of_near_keys_on_a_uniform_one():
    shapes = [(9, 5), (4, 7), (6, 6)]  # target shorter, longer and as long as the source
    lm, batch = _cross_batch(shapes)
    Tq, Tk = batch.target.input_ids.shape[1], batch.input_ids.shape[1]
    # padded query rows hold junk (7.0) that must never count; real rows are 0 at padded keys, as a
    # model's masked softmax leaves them
    diagonal = torch.full((3, 1, Tq, Tk), 7.0)
    uniform = torch.full((3, 1, Tq, Tk), 7.0)
    share_sum, rows = 0.0, 0
    for b, (S, T) in enumerate(shapes):
        diagonal[b, :, :T] = 0.0
        uniform[b, :, :T] = 0.0
        uniform[b, :, :T, :S] = 1.0 / S
        for i in range(T):
            d = math.floor(i * (S - 1) / (T - 1) + 0.5)
            diagonal[b, 0, i, d] = 1.0
            share_sum += len([j for j in range(S) if abs(j - d) <= 1]) / S
            rows += 1
    assert _aligned_of(lm, batch, diagonal)[0] == pytest.approx(1.0, abs=1e-12)
    value, stats = _aligned_of(lm, batch, uniform)
    assert value == pytest.approx(share_sum / rows, abs=1e-7)
    # the uniform map's entropy is ln S per row and norm_entropy exactly 1
    frame = stats.result()
    assert frame["norm_entropy"].iloc[0] == pytest.approx(1.0, abs=1e-6)
    expected = sum(T * math.log(S) for S, T in shapes) / sum(T for _, T in shapes)
    assert frame["entropy"].iloc[0] == pytest.approx(expected, rel=1e-6)


def test_sides_of_each_site():
    lm, batch = _cross_batch([(5, 3)])
    assert sides(Site("encoder", 0), batch) == (batch, batch)
    assert sides(Site("decoder", 0, "self", causal=True), batch) == (batch.target, batch.target)
    assert sides(Site("decoder", 0, "cross"), batch) == (batch.target, batch)


def test_target_starts_with_the_decoder_start_token_and_keeps_offsets():
    lm = tiny_model("t5")
    batch = encode(lm, [Text("The cat.", target="Le chat noir.")])
    t = batch.target
    assert int(t.input_ids[0, 0]) == decoder_start_id(lm) == lm.model.config.decoder_start_token_id
    assert bool(t.special[0, 0]) and t.offsets[0, 0].tolist() == [0, 0]
    covered = [t.texts[0].text[s:e] for s, e in t.offsets[0, 1:].tolist() if e > s]
    assert "".join(covered).replace(" ", "") == "Lechatnoir."
    assert batch.texts[0].pair is None and t.texts[0].text == "Le chat noir."


def test_a_source_without_target_is_one_clear_error():
    lm = tiny_model("bart")
    with pytest.raises(InputError, match="text 2 has no target.*--pairs FILE.*--generate N"):
        analyze(lm, [Text("One.", target="Un."), Text("Two.")])


def test_the_target_has_its_own_name_and_pair_is_a_deprecated_alias_for_it():
    lm = tiny_model("bart")
    new = analyze(lm, TEXTS, n_examples=0).heads
    with pytest.warns(DeprecationWarning, match=r"Text\(source, pair=target\).*deprecated.*target="):
        old = analyze(lm, [Text(s, pair=t) for s, t in PAIRS], n_examples=0).heads
    pd.testing.assert_frame_equal(new, old)  # the same numbers: pair= is read as the target
    with pytest.raises(InputError, match="text 1 has both a second segment \\(pair\\) and a target"):
        analyze(lm, [Text("One.", pair="Deux.", target="Un.")])
    with pytest.raises(InputError, match="text 2 has a target, which only encoder-decoder models read"):
        analyze(tiny_model("bert"), [Text("One."), Text("Two.", target="Deux.")])
    moved = as_targets([Text("A.", pair="B.", index=4), Text("C.", target="D.")])
    assert [(t.text, t.pair, t.target, t.index) for t in moved] == [("A.", None, "B.", 4), ("C.", None, "D.", None)]
    assert not isinstance(as_targets(iter(moved)), list)  # a stream stays lazy


@pytest.mark.parametrize("kind", SEQ2SEQ)
def test_generate_writes_greedy_targets(kind):
    lm = tiny_model(kind)
    result = analyze(lm, ["The cat sat on the mat.", "Two dogs ran."], generate=6)
    for ex in result.examples:
        # the model's own greedy continuation (at most 6 new tokens), decoded to text and re-tokenized
        # as a target (a random model's byte pieces may re-tokenize into more tokens than it generated)
        assert ex.target is not None
        src = lm.tokenizer(ex.text, return_tensors="pt")
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())  # T5's deeper tiny decoder needs it
        ids = lm.model.generate(**src, max_new_tokens=6, do_sample=False, num_beams=1, cache=cache)[0, 1:]
        assert 1 <= len(ids) <= 6
        assert ex.target["text"] == lm.tokenizer.decode(ids, skip_special_tokens=True).strip()
    assert set(result.heads["kind"]) == {"self", "cross"}


def test_generate_refuses_other_models_and_bad_counts():
    with pytest.raises(InputError, match="encoder-decoder models"):
        analyze(tiny_model("gpt2"), ["Hello there."], generate=3)
    with pytest.raises(InputError, match="--generate must be at least 1"):
        analyze(tiny_model("bart"), ["Hello there."], generate=0)


def test_report_draws_grids_per_site_kind_and_cross_heatmaps(tmp_path):
    from probe.report import write_run

    lm = tiny_model("bart")
    result = analyze(lm, TEXTS)
    path = write_run(result, lm.tokenizer, tmp_path / "run")
    html = (path / "index.html").read_text()
    for title in ("encoder self-attention", "decoder self-attention", "cross-attention (decoder queries"):
        assert title in html
    data = json.loads(html.split('<script type="application/json" id="probe-data">')[1].split("</script>")[0]
                      .replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&"))
    cross = {k: v for k, v in data["figures"].items() if k.startswith("cross-")}
    assert cross, "no cross-attention heatmap"
    fig = next(iter(cross.values()))
    assert fig["xLabel"] == "source token (key)" and fig["yLabel"] == "target token (query)"
    ex = result.examples[0]
    assert fig["cols"] == len(ex.ids) and fig["rows"] == len(ex.target["ids"])
    assert "Le" in fig["rowLabels"] and "cat" in fig["colLabels"]
    csv = pd.read_csv(path / "cross.csv")
    assert len(csv) == lm.model.config.decoder_layers * lm.geometry.n_heads
    heads = pd.read_csv(path / "heads.csv")
    assert set(zip(heads["stack"], heads["kind"])) == {("encoder", "self"), ("decoder", "self"), ("decoder", "cross")}


@pytest.mark.parametrize("kind,model_kind,shown", [
    *[(k, "encoder-decoder", "encoder-decoder: bidirectional encoder, causal decoder") for k in SEQ2SEQ],
    ("gpt2", "decoder", "decoder, causal"), ("bert", "encoder", "encoder, bidirectional"),
])
def test_run_json_and_the_report_name_the_model_kind(kind, model_kind, shown, tmp_path):
    from probe.report import write_run

    lm = tiny_model(kind)
    assert lm.kind == lm.spec.kind == model_kind
    texts = TEXTS[:2] if model_kind == "encoder-decoder" else [s for s, _ in PAIRS[:2]]
    path = write_run(analyze(lm, texts), lm.tokenizer, tmp_path / "run")
    model = json.loads((path / "run.json").read_text())["model"]
    assert model["kind"] == model_kind and model["causal"] == (model_kind == "decoder")
    assert ("stacks" in model) == (model_kind == "encoder-decoder")
    html = (path / "index.html").read_text()
    assert f"({type(lm.model).__name__}, {shown})</td>" in html


def test_cli_pairs_and_generate(tmp_path):
    from probe.cli import main

    folder = save_tiny("t5", tmp_path / "t5")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
    runner = CliRunner()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the CLI gives the file's second column as the target
        res = runner.invoke(main, ["analyze", "--model", str(folder), "--pairs", str(pairs), "--out",
                                   str(tmp_path / "a"), "--no-progress"])
    assert res.exit_code == 0, res.output
    heads = pd.read_csv(tmp_path / "a" / "heads.csv")
    assert set(heads["kind"]) == {"self", "cross"} and set(heads["stack"]) == {"encoder", "decoder"}
    res = runner.invoke(main, ["analyze", "--model", str(folder), "--text", "The cat sat.", "--generate", "10",
                               "--out", str(tmp_path / "g"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "g" / "cross.csv").exists()
    res = runner.invoke(main, ["analyze", "--model", str(folder), "--text", "The cat sat.", "--out",
                               str(tmp_path / "n"), "--no-progress"])
    assert res.exit_code != 0 and "has no target" in res.output


def test_cli_refuses_what_does_not_fit_an_encoder_decoder_model(tmp_path):
    from probe.cli import main

    t5 = save_tiny("t5", tmp_path / "t5")
    gpt2 = save_tiny("gpt2", tmp_path / "gpt2")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("A cat.\tUn chat.\n", encoding="utf-8")
    runner = CliRunner()
    cases = [
        (["--model", str(t5), "--pairs", str(pairs), "--generate", "3"], "not both"),
        (["--model", str(gpt2), "--text", "Hello there.", "--generate", "3"], "encoder-decoder models"),
        (["--model", str(t5), "--coref"], "is an encoder-decoder model"),
        (["--model", str(t5), "--text", "Hi.", "--generate", "0"], "--generate"),
    ]
    for i, (args, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        res = runner.invoke(main, ["analyze", *args, "--out", str(out), "--no-progress"])
        assert res.exit_code != 0 and message in res.output, (args, res.output)
        assert "Traceback" not in res.output and not (out / "index.html").exists()
    res = runner.invoke(main, ["prune", "--model", str(t5), "--out", str(tmp_path / "p")])
    assert res.exit_code != 0 and "head pruning covers one-stack models" in res.output
    assert runner.invoke(main, ["analyze", "--model", str(t5), "--pairs", str(pairs), "--out", str(tmp_path / "r"),
                                "--no-progress"]).exit_code == 0
    # compare: an encoder-decoder run against itself, site kind by site kind (every difference 0) ...
    res = runner.invoke(main, ["compare", str(tmp_path / "r"), str(tmp_path / "r"), "--out", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    cmp = pd.read_csv(tmp_path / "c" / "compare.csv")
    assert set(zip(cmp["stack"], cmp["kind"])) == {("encoder", "self"), ("decoder", "self"), ("decoder", "cross")}
    assert (cmp.filter(like="delta_").fillna(0) == 0).all().all() and not cmp["label_changed"].any()
    # ... but not against a one-stack model's run: their sites do not correspond
    assert runner.invoke(main, ["analyze", "--model", str(gpt2), "--text", "Hello there.", "--out",
                                str(tmp_path / "g"), "--no-progress"]).exit_code == 0
    res = runner.invoke(main, ["compare", str(tmp_path / "r"), str(tmp_path / "g"), "--out", str(tmp_path / "c2")])
    assert res.exit_code != 0 and "encoder-decoder model" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("kind", ["t5", "gpt2"])
def test_head_statistics_count_sites_not_layers(kind):
    lm = tiny_model(kind)
    stats = HeadStatistics(lm.sites, lm.geometry.n_heads, lm.tokenizer)
    config = lm.model.config
    expected = (config.num_layers + 2 * config.num_decoder_layers) if kind == "t5" else config.n_layer
    assert stats.n_sites == len(lm.sites) == expected
    assert not hasattr(stats, "n_layers") and not hasattr(stats, "to_frame")
