"""Value-weighted (norm-based) attention, checked against an independent computation.

The reference below does not use probe.capture.values: it takes each layer's value-projection input x_j
with a hook, slices the value and output projection weights per head by hand for each layout
(nn.Linear rows, GPT-2 Conv1D columns, GPT-NeoX / BLOOM per-head fused blocks, Phi-3 stacked rows;
query head h reads value head floor(h / (H / KV))), computes f_h(x_j) = (x_j W_V^g + b_V^g) W_O^h
explicitly in float64, and measures N~ = row-normalized A[i, j] ||f_h(x_j)|| with the row-by-row
statistics of test_stats, one sequence at a time and unpadded.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from test_seq2seq import TEXTS as PAIR_TEXTS
from test_seq2seq import reference_cross_row
from test_stats import SHORT, reference_heads

from conftest import ONE_STACK, SEQ2SEQ, SHARED_DATA, assert_statistics_close, save_tiny, tiny_model
from probe.architectures import site_block, site_spec
from probe.capture.maps import capture_attention
from probe.cli import main
from probe.errors import InputError
from probe.measures.stats import NORM_MASS, STATISTICS, by_norm
from probe.runs.analysis import analyze
from probe.sites import Site
from probe.text.corpus import read_corpus
from probe.text.inputs import Text

# --------------------------------------------------------------------------- the reference

def head_weights(lm, site: Site, h: int):
    """(W_V [d_in, d_head], b_V [d_head], W_O [d_head, d_model]) of query head h, float64, sliced by hand."""
    spec, paths = lm.spec, site_spec(lm.spec, site)
    block = site_block(lm.model, spec, site)
    dh, H = lm.geometry.d_head, lm.geometry.n_heads
    KV = lm.geometry.n_kv_heads
    g = h // (H // KV)
    mod = block.get_submodule(paths.v or paths.qkv)
    w, b = mod.weight.detach().double(), mod.bias
    b = None if b is None else b.detach().double()
    if spec.qkv_layout == "separate":  # nn.Linear [out, in]: value head g's rows
        rows = slice(g * dh, (g + 1) * dh)
        W_V, b_V = w[rows].T, (None if b is None else b[rows])
    elif spec.qkv_layout == "conv1d":  # GPT-2 Conv1D [in, q | k | v]: columns 2D + g dh ...
        D = H * dh
        cols = slice(2 * D + g * dh, 2 * D + (g + 1) * dh)
        W_V, b_V = w[:, cols], b[cols]
    elif spec.qkv_layout == "per_head":  # [heads * (q, k, v) * d_head, in]
        W_V = w.reshape(H, 3, dh, -1)[g, 2].T
        b_V = None if b is None else b.reshape(H, 3, dh)[g, 2]
    else:  # Phi-3 stacked rows: q (H dh) | k (KV dh) | v (KV dh)
        start = H * dh + KV * dh + g * dh
        W_V, b_V = w[start:start + dh].T, (None if b is None else b[start:start + dh])
    o = block.get_submodule(paths.o).weight.detach().double()
    W_O = o[h * dh:(h + 1) * dh, :] if spec.conv1d else o[:, h * dh:(h + 1) * dh].T
    return W_V, (torch.zeros(dh, dtype=torch.float64) if b_V is None else b_V), W_O


def explicit_f(lm, site: Site, x: torch.Tensor) -> torch.Tensor:
    """f_h(x_j) [heads, T, d_model] (float64) from the value-projection input x [T, d_in]."""
    out = []
    for h in range(lm.geometry.n_heads):
        W_V, b_V, W_O = head_weights(lm, site, h)
        out.append((x.double() @ W_V + b_V) @ W_O)
    return torch.stack(out)


def _value_inputs(lm, sites):
    """Hooks keeping each site's value-projection input [T, d_in] (batch of one)."""
    kept, handles = {}, []
    for site in sites:
        paths = site_spec(lm.spec, site)
        mod = site_block(lm.model, lm.spec, site).get_submodule(paths.v or paths.qkv)
        handles.append(mod.register_forward_pre_hook(lambda m, args, s=site: kept.__setitem__(s, args[0][0])))
    return kept, handles


def normalized(n: np.ndarray) -> np.ndarray:
    """Rows of n divided by their sums (rows summing to 0 stay 0)."""
    total = n.sum(-1, keepdims=True)
    return np.divide(n, total, out=np.zeros_like(n), where=total > 0)


def norm_maps(lm, enc) -> list[np.ndarray]:
    """N~ per layer, [heads, T, T] float64, of one unpadded sequence (the ``maps`` of reference_heads)."""
    kept, handles = _value_inputs(lm, lm.sites)
    try:
        with torch.no_grad():
            out = lm.model(**enc, output_attentions=True, **({"use_cache": False} if lm.kind == "decoder" else {}))
    finally:
        for handle in handles:
            handle.remove()
    maps = []
    for site, att in zip(lm.sites, out.attentions):
        norms = explicit_f(lm, site, kept[site]).norm(dim=-1).numpy()  # [H, T]
        maps.append(normalized(att[0].double().numpy() * norms[:, None, :]))
    return maps


def by_norm_frame(heads):
    """The ``_by_norm`` columns renamed to the statistics' names (for assert_statistics_close)."""
    return heads[["layer", "head", *(by_norm(s) for s in STATISTICS)]].rename(
        columns={by_norm(s): s for s in STATISTICS})


# --------------------------------------------------------------------------- against the reference

@pytest.mark.parametrize("family", ONE_STACK)
def test_by_norm_statistics_match_an_independent_computation(family):
    lm = tiny_model(family)
    heads = analyze(lm, SHORT, batch_size=3, n_examples=0).heads  # padded batches of 3 and 2
    expected = reference_heads(lm, SHORT, maps=norm_maps)
    actual = by_norm_frame(heads).sort_values(["layer", "head"]).reset_index(drop=True)
    assert_statistics_close(actual, expected.sort_values(["layer", "head"]).reset_index(drop=True),
                            names=list(STATISTICS), err_msg=family)
    # the weights differ from the norms' map: a test that compared A with itself would pass above
    assert np.abs(heads["first"] - heads["first_by_norm"]).max() > 1e-3


@pytest.mark.parametrize("kind", SEQ2SEQ)
def test_cross_by_norm_statistics_read_the_encoder_output(kind):
    """Cross-attention's values are the encoder output's: f from the cross value projection's input.
    One pair a batch: the tiny T5's padded and unpadded float32 passes differ by up to 5e-5
    (test_seq2seq), which is not what this compares (the one-stack test above runs padded)."""
    lm = tiny_model(kind)
    heads = analyze(lm, PAIR_TEXTS, batch_size=1, n_examples=0).heads
    cross_sites = [s for s in lm.sites if s.kind == "cross"]
    sums, rows = {}, 0
    tok = lm.tokenizer
    for t in PAIR_TEXTS:
        cap = capture_attention(lm, [t])
        kept, handles = _value_inputs(lm, cross_sites)
        try:
            capture_attention(lm, [t])  # the same pass again, hooks on the cross value projections
        finally:
            for handle in handles:
                handle.remove()
        S, T = int(cap.batch.lengths[0]), int(cap.batch.target.lengths[0])
        ids = cap.batch.input_ids[0, :S].tolist()
        sep = np.array([x == tok.eos_token_id for x in ids])
        punct = np.zeros(S, dtype=bool)  # punct is compared apart (the tokenizer's offsets)
        rows += T
        for site in cross_sites:
            x = kept[site][:S]
            assert torch.equal(x, cap.outputs.encoder_last_hidden_state[0, :S])  # x_j: the encoder's output
            norms = explicit_f(lm, site, x).norm(dim=-1).numpy()
            tilde = normalized(cap[site][0, :, :T, :S].double().numpy() * norms[:, None, :])
            for h in range(tilde.shape[0]):
                for i in range(T):
                    for k, v in reference_cross_row(tilde[h, i], i, S, T, sep, punct).items():
                        sums[(site.layer, h, k)] = sums.get((site.layer, h, k), 0.0) + v
    cross = heads[heads["kind"] == "cross"]
    for name in ("first", "entropy", "distance", "max_weight", "aligned", "sep"):
        expected = [sums[(int(r.layer), int(r.head), name)] / rows for r in cross.itertuples()]
        np.testing.assert_allclose(cross[by_norm(name)].to_numpy(), expected, atol=1e-5, rtol=1e-5, err_msg=name)
    assert cross[[by_norm(s) for s in ("self", "prev", "next", "long")]].isna().all().all()


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_heads_and_the_output_bias_add_up_to_the_attention_output(family):
    """sum_h A_h f_h + b_O = the output projection's output (fp32, 1e-5); llama: 4 heads, 2 KV heads."""
    lm = tiny_model(family)
    assert family != "llama" or lm.geometry.n_kv_heads < lm.geometry.n_heads
    text = "The cat sat on the mat, and then it slept."
    enc = lm.tokenizer(text, return_tensors="pt")
    kept, handles = _value_inputs(lm, lm.sites)
    outs = {}
    for site in lm.sites:
        o = site_block(lm.model, lm.spec, site).get_submodule(site_spec(lm.spec, site).o)
        handles.append(o.register_forward_hook(lambda m, a, y, s=site: outs.__setitem__(s, y[0])))
    try:
        with torch.no_grad():
            out = lm.model(**enc, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    mass = analyze(lm, [text], n_examples=0).heads[NORM_MASS].to_numpy().reshape(len(lm.sites), -1)
    for l, (site, att) in enumerate(zip(lm.sites, out.attentions)):
        f = explicit_f(lm, site, kept[site])  # [H, T, d_model]
        per_head = torch.einsum("hij,hjd->hid", att[0].double(), f)  # [H, T, d_model]
        o = site_block(lm.model, lm.spec, site).get_submodule(site_spec(lm.spec, site).o)
        bias = o.bias.double() if o.bias is not None else 0.0
        torch.testing.assert_close(per_head.sum(0) + bias, outs[site].double(), atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(mass[l], per_head.norm(dim=-1).mean(-1).numpy(), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- hand-built cases

def test_a_value_projection_of_bias_only_gives_the_attention_weights():
    """W_V = 0 and b_V != 0: every key's f is the same vector, so N~ = A exactly (up to rounding)."""
    lm = tiny_model("bert")
    with torch.no_grad():
        for layer in lm.model.encoder.layer:
            layer.attention.self.value.weight.zero_()
            layer.attention.self.value.bias.normal_()
    heads = analyze(lm, SHORT, n_examples=0).heads
    for s in STATISTICS:
        np.testing.assert_allclose(heads[by_norm(s)], heads[s], atol=1e-6, rtol=1e-6, err_msg=s)


def test_zeroing_one_value_head_zeroes_exactly_the_query_heads_that_share_it():
    """LLaMA with 4 query heads on 2 KV heads: value head 1 feeds query heads 2 and 3 only."""
    lm = tiny_model("llama")
    H, KV, dh = lm.geometry.n_heads, lm.geometry.n_kv_heads, lm.geometry.d_head
    assert (H, KV) == (4, 2)
    with torch.no_grad():
        lm.model.model.layers[0].self_attn.v_proj.weight[dh:2 * dh] = 0.0
    cap = capture_attention(lm, SHORT, value_norms=True)
    norms = cap.norms[0]  # [batch, heads, key]
    assert torch.all(norms[:, 2:] == 0.0)
    real = cap.batch.real[:, None, :]
    assert torch.all(norms[:, :2][real.expand(-1, 2, -1)] > 0)
    assert torch.all(cap.norms[1][real.expand(-1, H, -1)] > 0)  # the other layer is untouched
    heads = analyze(lm, SHORT, n_examples=0).heads
    layer0 = heads[heads["layer"] == 0].set_index("head")
    assert layer0.loc[[2, 3], [by_norm(s) for s in STATISTICS]].isna().all().all()  # every row left out
    assert (layer0.loc[[2, 3], NORM_MASS] == 0).all()
    assert layer0.loc[[0, 1], by_norm("first")].notna().all()


def test_removed_heads_stay_nan():
    from probe.pruning.removal import remove_heads

    lm = tiny_model("llama")
    remove_heads(lm, {0: [1]})
    heads = analyze(lm, SHORT, n_examples=0).heads.set_index(["layer", "head"])
    assert heads.loc[(0, 1), [by_norm(s) for s in STATISTICS] + [NORM_MASS]].isna().all()
    assert heads.drop(index=(0, 1))[by_norm("first")].notna().all()


def test_shared_grams_give_each_runs_own_values_and_follow_the_weights():
    """Inside shared_grams a run reads the output projections' G_h filed by an earlier run: its statistics equal a
    run without the store; a weight changed in place, replaced, or cut (heads removed) is computed again (its
    statistics equal a fresh run's on the changed model)."""
    from probe.capture.values import shared_grams
    from probe.pruning.removal import remove_heads

    lm = tiny_model("llama")
    cols = [by_norm(s) for s in STATISTICS] + [NORM_MASS]
    fresh = analyze(lm, SHORT, n_examples=0).heads[cols]
    store: dict = {}
    with shared_grams(store):
        first = analyze(lm, SHORT, n_examples=0).heads[cols]
        filed = {k: v[3] for k, v in store.items()}
        again = analyze(lm, SHORT, n_examples=0).heads[cols]
    assert len(filed) == len(lm.sites) and all(store[k][3] is g for k, g in filed.items())  # read, not recomputed
    pd.testing.assert_frame_equal(first, fresh)
    pd.testing.assert_frame_equal(again, fresh)
    o = lm.model.model.layers[0].self_attn.o_proj
    with torch.no_grad():
        o.weight.mul_(3.0)  # in place: the version counter moves
    changed = analyze(lm, SHORT, n_examples=0).heads[cols]
    with shared_grams(store):
        got = analyze(lm, SHORT, n_examples=0).heads[cols]
    pd.testing.assert_frame_equal(got, changed)
    assert not np.allclose(changed[NORM_MASS], fresh[NORM_MASS])
    o.weight = torch.nn.Parameter(o.weight.detach() * 0.5)  # a new weight tensor
    changed = analyze(lm, SHORT, n_examples=0).heads[cols]
    with shared_grams(store):
        got = analyze(lm, SHORT, n_examples=0).heads[cols]
    pd.testing.assert_frame_equal(got, changed)
    remove_heads(lm, {1: [1]})  # the cut weight: fewer rows
    changed = analyze(lm, SHORT, n_examples=0).heads[cols]
    with shared_grams(store):
        got = analyze(lm, SHORT, n_examples=0).heads[cols]
    pd.testing.assert_frame_equal(got, changed)


# --------------------------------------------------------------------------- options

def test_no_norm_leaves_the_columns_out_and_labels_by_norm_read_them():
    lm = tiny_model("bert")
    plain = analyze(lm, SHORT, n_examples=0, value_weighted=False).heads
    assert not any(c.endswith("_by_norm") for c in plain.columns) and NORM_MASS not in plain
    weighted = analyze(lm, SHORT, n_examples=0).heads
    np.testing.assert_array_equal(plain["first"], weighted["first"])  # weights unchanged
    thresholds = {"first-token": 0.2}
    by_w = analyze(lm, SHORT, n_examples=0, thresholds=thresholds).heads
    by_n = analyze(lm, SHORT, n_examples=0, thresholds=thresholds, labels_by="norm").heads
    np.testing.assert_array_equal(by_n["first"], by_w["first"])  # the columns themselves stay
    held_n = by_n["labels"].str.contains("first-token")
    assert held_n.tolist() == (by_n["first_by_norm"] >= 0.2).tolist()
    assert by_w["labels"].str.contains("first-token").tolist() == (by_w["first"] >= 0.2).tolist()
    with pytest.raises(InputError, match="labels by norm"):
        analyze(lm, SHORT, value_weighted=False, labels_by="norm")
    with pytest.raises(InputError, match="labels by"):
        analyze(lm, SHORT, labels_by="value")


def test_value_norms_of_one_batch_equal_the_explicit_ones():
    """capture_attention(value_norms=True): ||f_h(x_j)|| [batch, heads, key] for another view to reuse."""
    lm = tiny_model("gpt2")
    text = "Hello, world! A short one."
    cap = capture_attention(lm, [text, "Hi."], value_norms=True)
    kept, handles = _value_inputs(lm, lm.sites)
    try:
        capture_attention(lm, [text])
    finally:
        for handle in handles:
            handle.remove()
    T = int(cap.batch.lengths[0])
    for site, norms in zip(cap.sites, cap.norms):
        assert norms.shape == (2, lm.geometry.n_heads, cap.batch.input_ids.shape[1])
        expected = explicit_f(lm, site, kept[site]).norm(dim=-1)
        torch.testing.assert_close(norms[0, :, :T].double(), expected, atol=1e-5, rtol=1e-5)


def test_a_pair_input_has_every_site_kind():
    lm = tiny_model("t5")
    heads = analyze(lm, [Text("A b c.", target="D e.")], n_examples=0).heads
    assert heads[by_norm("first")].notna().all() and (heads[NORM_MASS] > 0).all()


# --------------------------------------------------------------------------- the embedded models

UD_DEV = SHARED_DATA / "ud-ewt" / "en_ewt-ud-dev.conllu"


def _ud_sentences(n: int) -> list[str]:
    if not UD_DEV.exists():
        pytest.skip("the UD English EWT dev file is not on this machine")
    return read_corpus(UD_DEV, limit=n)


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["minilm", "smollm2"])
def test_embedded_models_by_norm_statistics_match_the_independent_computation(fixture, request):
    """50 UD EWT dev sentences: every _by_norm statistic within 1e-5 of the explicit per-head f."""
    lm = request.getfixturevalue(fixture)
    texts = _ud_sentences(50)
    heads = analyze(lm, texts, batch_size=8, n_examples=0).heads
    expected = reference_heads(lm, texts, maps=norm_maps).sort_values(["layer", "head"]).reset_index(drop=True)
    actual = by_norm_frame(heads).sort_values(["layer", "head"]).reset_index(drop=True)
    names = [s for s in STATISTICS if expected[s].notna().any()]
    assert_statistics_close(actual, expected, names=names, err_msg=fixture)
    for name in names:  # and the tolerance is the brief's 1e-5 at most
        np.testing.assert_allclose(actual[name], expected[name], atol=1e-5, rtol=1e-5, err_msg=name)


# --------------------------------------------------------------------------- the command line

def test_cli_writes_the_columns_and_the_section_and_refuses_labels_by_norm_without_norms(tmp_path):
    folder = save_tiny("bert", tmp_path / "bert")
    runner = CliRunner()
    bad = runner.invoke(main, ["analyze", "--model", str(folder), "--text", "A b.", "--no-norm", "--labels-by", "norm",
                               "--out", str(tmp_path / "bad"), "--no-distance"])
    assert bad.exit_code != 0
    errors = [line for line in bad.output.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: labels by norm need the value-weighted statistics; they are turned off (--no-norm)"]
    assert "Traceback" not in bad.output and not (tmp_path / "bad").exists()
    ok = runner.invoke(main, ["analyze", "--model", str(folder), "--text", "The cat sat on the mat.", "--text",
                              "Hello, world!", "--labels-by", "norm", "--out", str(tmp_path / "run"), "--no-distance"])
    assert ok.exit_code == 0, ok.output
    heads = pd.read_csv(tmp_path / "run" / "heads.csv")
    assert {by_norm(s) for s in STATISTICS} | {NORM_MASS} <= set(heads.columns)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["settings"]["labels_by"] == "norm" and record["settings"]["value_weighted"] is True
    layers = record["value-weighted"]["per_layer"]
    assert [row["layer"] for row in layers] == [0, 1]
    np.testing.assert_allclose([row["first_by_norm"] for row in layers],
                               heads.groupby("layer")["first_by_norm"].mean().to_numpy(), atol=1e-5)
    assert 'data-fig="norm-first"' in (tmp_path / "run" / "index.html").read_text()
    plain = runner.invoke(main, ["analyze", "--model", str(folder), "--text", "A b.", "--no-norm",
                                 "--out", str(tmp_path / "plain"), "--no-distance"])
    assert plain.exit_code == 0, plain.output
    assert not any(c.endswith("_by_norm") for c in pd.read_csv(tmp_path / "plain" / "heads.csv").columns)
    assert "value-weighted" not in json.loads((tmp_path / "plain" / "run.json").read_text())
