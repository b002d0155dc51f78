"""The attention-step table (probe.measures.steps): the softmax of the shown scaled scores is the model's own
row, and the scaled score is the architecture's rule applied to q . k, on a tiny model of every
supported kind and (slow) on the embedded minilm and smollm2."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import probe.measures.steps as steps_module
from conftest import KINDS, SEQ2SEQ, tiny_model
from probe import attention_steps
from probe.architectures.position_bias import alibi_slopes
from probe.capture.maps import encode, forward
from probe.entries.analyze import report_steps
from probe.errors import InputError, UnsupportedArchitectureError
from probe.measures.steps import head_steps, heads_steps
from probe.pruning.removal import remove_heads
from probe.runs.analysis import analyze
from probe.sites import head_name
from probe.text.inputs import Text
from probe.view.stepview import step_view_data

TEXT = "the cat sat on the mat and then it ran away from the dog"
PAIR = Text("the cat sat on the mat today", target="a dog ran home")
ATOL = 1e-5


def text_of(kind):
    return PAIR if kind in SEQ2SEQ else TEXT


def check_identities(st, atol=ATOL):
    """softmax(masked scaled) = the model's row; scaled = softcap(score * scale) + bias; masked keys get 0."""
    expected = st["score"].astype(np.float64) * st["scale"]
    if st["softcap"]:
        expected = np.tanh(expected / st["softcap"]) * st["softcap"]
    expected = expected + st["bias"]
    np.testing.assert_allclose(st["scaled"], expected, atol=atol, rtol=1e-6)
    s = np.where(st["keep"], st["scaled"].astype(np.float64), -np.inf)
    soft = np.exp(s - s.max(-1, keepdims=True))
    soft /= soft.sum(-1, keepdims=True)
    np.testing.assert_allclose(soft, st["model_probs"], atol=atol)
    np.testing.assert_allclose(st["probs"], st["model_probs"], atol=atol)
    assert (st["model_probs"][~st["keep"]] == 0).all()
    np.testing.assert_allclose(st["q"] @ st["k"].T, st["score"], atol=1e-4, rtol=1e-5)  # the vectors shown make q . k


@pytest.mark.parametrize("kind", KINDS)
def test_steps_identities_on_every_kind(kind):
    lm = tiny_model(kind)
    n = len(lm.sites)
    for site in sorted({0, n // 2, n - 1}):
        st = head_steps(lm, text_of(kind), site=site, head=lm.geometry.n_heads - 1)
        check_identities(st)


def test_the_architectures_own_rules_show_in_the_columns():
    # causal + sliding window of 4: query 9 sees keys 6..9 only
    st = head_steps(tiny_model("qwen2-window"), TEXT, site=1, head=0)  # layers from max_window_layers=1 on
    assert np.flatnonzero(st["keep"][9]).tolist() == [6, 7, 8, 9]
    # GQA: 4 query heads read 1 key/value head in the tiny Qwen2 (head 3 -> kv head 0); LLaMA: 2 (head 3 -> 1)
    assert st["kv_head"] == 0 and head_steps(tiny_model("llama"), TEXT, site=0, head=3)["kv_head"] == 1
    # ALiBi: bias = m_h * key position (the same for every query), BLOOM's scale 1/sqrt(d_head)
    lm = tiny_model("bloom")
    st = head_steps(lm, TEXT, site=1, head=2)
    m = float(alibi_slopes(lm.geometry.n_heads)[2])
    np.testing.assert_allclose(st["bias"][5], m * np.arange(st["bias"].shape[1]), rtol=1e-2)
    assert st["scale"] == pytest.approx(lm.geometry.d_head ** -0.5)
    # T5: unscaled, with a learned bias on self-attention sites; no bias on cross-attention
    lm = tiny_model("t5")
    st = head_steps(lm, PAIR, site=0, head=1)
    assert st["scale"] == 1.0 and np.abs(st["bias"]).max() > 0
    assert np.abs(head_steps(lm, PAIR, site="cross L0", head=1)["bias"]).max() == 0
    # Gemma 2: the cap binds (some |scaled| close to it) and the shown scaled scores never pass it
    st = head_steps(tiny_model("gemma2"), TEXT, site=0, head=0)
    assert st["softcap"] and np.abs(st["scaled"]).max() <= st["softcap"]


def test_value_norm_is_the_heads_value_through_its_output_columns():
    """||f_h(x_j)|| from the weights, independently: BERT's Linear and GPT-2's Conv1D layouts."""
    lm = tiny_model("bert")
    layer = lm.model.encoder.layer[1].attention
    st = head_steps(lm, TEXT, site=1, head=2)
    x = capture_input(lm, layer.self, TEXT)
    dh = lm.geometry.d_head
    wv, bv = layer.self.value.weight[2 * dh:3 * dh], layer.self.value.bias[2 * dh:3 * dh]
    f = (x @ wv.T + bv) @ layer.output.dense.weight[:, 2 * dh:3 * dh].T
    np.testing.assert_allclose(st["value_norm"], f.norm(dim=-1).detach().numpy(), rtol=1e-5)
    lm = tiny_model("gpt2")
    attn = lm.model.transformer.h[0].attn
    st = head_steps(lm, TEXT, site=0, head=1)
    x = capture_input(lm, attn, TEXT)
    D = lm.geometry.d_model
    wv, bv = attn.c_attn.weight[:, 2 * D + dh:2 * D + 2 * dh], attn.c_attn.bias[2 * D + dh:2 * D + 2 * dh]
    f = (x @ wv + bv) @ attn.c_proj.weight[dh:2 * dh]
    np.testing.assert_allclose(st["value_norm"], f.norm(dim=-1).detach().numpy(), rtol=1e-5)


def capture_input(lm, module, text):
    """The module's input [T, d_model] on the text as probe encodes it."""
    got = {}

    def hook(m, args, kw):
        got.setdefault("x", (args or (kw["hidden_states"],))[0])

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            forward(lm, encode(lm, [text]))
    finally:
        handle.remove()
    return got["x"][0].detach()


def test_table_columns_vectors_and_errors():
    lm = tiny_model("llama")
    df = attention_steps(lm, TEXT, site="L1", head=3, query=4, vectors=True)
    info = df.attrs["steps"]
    assert info.name == "L1H3" and info.kv_head == 1 and info.query == 4 and info.max_diff <= ATOL
    for col in ("key", "token", "score", "scaled_score", "bias", "masked", "probability", "value_norm"):
        assert col in df.columns
    assert df["masked"].tolist() == [j > 4 for j in range(len(df))]
    assert df["probability"][df["masked"]].eq(0).all() and df["probability"].sum() == pytest.approx(1, abs=1e-6)
    np.testing.assert_allclose([p.sum() for p in df["product"]], df["score"], atol=1e-4)
    np.testing.assert_allclose(df["contribution"], df["probability"] * df["value_norm"])
    for bad in (dict(site=99), dict(site="L9"), dict(head=9), dict(query=99)):
        with pytest.raises(InputError):
            attention_steps(lm, TEXT, **{"site": 0, "head": 0, "query": 0, **bad})


@pytest.mark.slow
def test_steps_identities_on_minilm(minilm):
    for site, head in ((0, 0), (3, 7), (5, 11)):
        check_identities(head_steps(minilm, "The keys to the cabinet are on the table.", site=site, head=head))


@pytest.mark.slow
def test_steps_identities_on_smollm2(smollm2):
    for site, head in ((0, 0), (14, 4), (29, 8)):
        st = head_steps(smollm2, "The keys to the cabinet are on the table.", site=site, head=head)
        check_identities(st)
        assert st["kv_head"] == head // 3


def test_steps_on_a_physically_pruned_site_use_its_own_heads():
    """Layer 0 keeps 3 of 4 heads: its value norms read a 3 * d_head wide output projection."""
    lm = tiny_model("bert")
    remove_heads(lm, {0: [1]})
    st = head_steps(lm, TEXT, site=0, head=2)
    check_identities(st)
    with pytest.raises(InputError, match="no head 3: L0 has heads 0-2"):
        head_steps(lm, TEXT, site=0, head=3)


def _counting_forward(monkeypatch) -> list:
    calls = []

    def counted(lm, batch):
        calls.append(1)
        return forward(lm, batch)
    monkeypatch.setattr(steps_module, "forward", counted)
    return calls


@pytest.mark.parametrize("kind", ["llama", "bert", "bloom"])
def test_several_heads_share_the_passes_and_equal_one_at_a_time(kind, monkeypatch):
    """heads_steps: one forward pass records every pick from the model's attention calls (BLOOM's through
    the reference module swapped in); the reference route takes one from-scratch pass per head of the
    most-picked site (here 2: site 0 twice) and one pass of the model for every site's probabilities.
    Each pick's arrays equal its own head_steps and its softmax is the model's row."""
    lm = tiny_model(kind)
    picks = [(1, 2), (0, 3), (0, 1)]
    for via, passes in (("function", 1), ("reference", 2 + 1)):
        alone = [head_steps(lm, TEXT, site, head, via=via) for site, head in picks]
        calls = _counting_forward(monkeypatch)
        together = heads_steps(lm, TEXT, picks, via=via)
        assert len(calls) == passes, via
        monkeypatch.undo()
        for one, st in zip(alone, together):
            assert (st["site"], st["head"]) == (one["site"], one["head"])
            for key in ("q", "k", "v", "score", "bias", "scaled", "keep", "probs", "model_probs", "value_norm"):
                np.testing.assert_array_equal(st[key], one[key], err_msg=key)
            assert st["q_tokens"] == one["q_tokens"] and st["kv_head"] == one["kv_head"]
            check_identities(st)
    calls = _counting_forward(monkeypatch)
    assert "model_probs" not in heads_steps(lm, TEXT, picks[:2], model_probs=False)[0] and len(calls) == 1


def test_report_steps_run_the_first_example_once(monkeypatch):
    """The report's step views (one head of each label, in different layers or not) come from one forward
    pass, and hold each head's own steps."""
    lm = tiny_model("bert")
    low = {"previous-token": 0.1, "self": 0.1, "first-token": 0.1, "next-token": 0.1}  # labels on random heads
    res = analyze(lm, [TEXT, "Second text."], n_examples=1, thresholds=low)
    calls = _counting_forward(monkeypatch)
    out = report_steps(lm, res)
    chosen = [(d["siteIndex"], d["head"]) for d in out]
    per_layer = Counter(layer for layer, _ in chosen)
    assert len(out) >= 3 and max(per_layer.values()) >= 2 and len(calls) == 1, (chosen, len(calls))
    monkeypatch.undo()
    n = res.examples[0].probs.shape[-1]
    for d in out:
        st = head_steps(lm, TEXT, d["siteIndex"], d["head"], max_length=n)
        want = step_view_data(st, site_index=d["siteIndex"])
        assert {k: v for k, v in d.items() if k not in ("label", "reason")} == {
            **want, "name": head_name(d["siteIndex"], d["head"])}


def test_the_steps_and_the_rollout_of_a_sentence_pair_are_of_the_pair():
    """Issue 27 items 2 and 3: with --pairs the step views showed segment A alone (9 keys, no segment
    ids) and the rollout left out every example ("tokens differ"): both run on the input analysed."""
    from probe.measures.rollout_examples import run_rollout

    lm = tiny_model("bert")
    pair = Text("The cat sat on the mat.", pair="It was happy there.")
    res = analyze(lm, [pair, Text("Second text.", pair="And its pair.")], n_examples=2)
    ex = res.examples[0]
    assert ex.pair == "It was happy there." and ex.as_text() == pair
    out = report_steps(lm, res)
    n = ex.probs.shape[-1]
    assert out and all(len(d["kTokens"]) == n == len(ex.ids) for d in out)
    assert out[0]["kTokens"].count("[SEP]") == 2
    for d in out:  # the numbers of the pair (segment ids included), not of segment A alone
        want = step_view_data(head_steps(lm, pair, d["siteIndex"], d["head"], max_length=n), site_index=d["siteIndex"])
        assert d["qTokens"] == want["qTokens"] and d["kTokens"] == want["kTokens"]
    alone = head_steps(lm, pair.text, 1, 0)  # layer 1: segment A's states differ by what it attended to
    paired = head_steps(lm, pair, 1, 0)
    assert not np.allclose(paired["score"][:len(alone["score"]), :len(alone["score"])], alone["score"])
    record = run_rollout(lm, res)
    assert [e.index for e in record.examples] == [0, 1] and record.notes == []
    assert list(record.examples[0].rollout.tokens)[:n] == out[0]["kTokens"]


# --------------------------------------------------------------------------- steps from the model's own call

STEP_KEYS = ("q", "k", "v", "score", "bias", "scaled", "probs", "model_probs", "value_norm", "output")


@pytest.mark.parametrize("kind", KINDS)
def test_the_call_and_the_reference_module_give_the_same_steps_on_every_hand_family(kind):
    """Issue 47 item 4: the steps read from the model's own attention call (probe's attention function) equal
    the from-scratch reference module's (its own projections of q, k and v), within 1e-6, on every hand family
    and variant: RoPE kinds, GQA, windows, ALiBi (BLOOM, Falcon), T5's bias, DeBERTa's relative terms, softcaps,
    cross-attention. The bias (and so the scaled score) is compared at the keys the mask keeps: a model that
    adds its position bias to a float mask (Falcon's ALiBi in transformers 5.25) leaves no bias at a masked key
    (-inf there), while the reference module computes one."""
    lm = tiny_model(kind)
    n = len(lm.sites)
    for site in sorted({0, n // 2, n - 1}):
        for head in sorted({0, lm.geometry.n_heads - 1}):
            call = head_steps(lm, text_of(kind), site=site, head=head)
            ref = head_steps(lm, text_of(kind), site=site, head=head, via="reference")
            for key in STEP_KEYS:
                kept = call["keep"] if key in ("bias", "scaled") else ...
                np.testing.assert_allclose(call[key][kept], ref[key][kept], atol=1e-6, rtol=0,
                                           err_msg=f"{kind} {site} {key}")
            assert (call["keep"] == ref["keep"]).all() and call["kv_head"] == ref["kv_head"]
            assert (call["scale"], call["softcap"], call["sink"]) == (ref["scale"], ref["softcap"], None)


def eager_probs(lm, text) -> dict:
    """Each site's probabilities [heads, query, key] from the model's own eager attention (``output_attentions``),
    independent of probe's attention function."""
    batch = encode(lm, [text])
    with torch.no_grad():
        out = forward(lm, batch, output_attentions=True)
    if lm.kind == "encoder-decoder":
        maps = {("encoder", "self"): out.encoder_attentions, ("decoder", "self"): out.decoder_attentions,
                ("decoder", "cross"): out.cross_attentions}
        return {s: maps[s.stack, s.kind][s.layer][0] for s in lm.sites}
    return {s: out.attentions[s.layer][0] for s in lm.sites}


def check_call_steps(lm, text, atol=ATOL):
    """Every site and head: the steps' softmax (with the sink column where there is one) is the model's own
    eager row, the scaled scores follow from q . k, and the head's output is probs @ v."""
    own = eager_probs(lm, text)
    for site in lm.sites:
        n_heads = own[site].shape[0]
        for st in heads_steps(lm, text, [(site, h) for h in range(n_heads)]):
            mine = dict(st, model_probs=own[site][st["head"]].float().numpy())
            if st["sink"] is None:
                check_identities(mine, atol)
            else:  # one more softmax column: the rows of the keys sum to less than 1
                s = np.where(st["keep"], st["scaled"].astype(np.float64), -np.inf)
                s = np.concatenate([s, st["sink"][:, None]], axis=1)
                soft = np.exp(s - s.max(-1, keepdims=True))
                soft = (soft / soft.sum(-1, keepdims=True))[:, :-1]
                np.testing.assert_allclose(soft, mine["model_probs"], atol=atol)
                np.testing.assert_allclose(st["probs"], mine["model_probs"], atol=atol)
                rows = st["probs"].sum(-1)
                assert (rows <= 1 + 1e-6).all() and (rows < 0.99).any()
            np.testing.assert_allclose(st["probs"] @ st["v"], st["output"], atol=1e-5)


def tools_lm(model_type: str):
    """A tiny model of any text type as tools/models_table.py builds it (tools/tiny_models.py), wrapped."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import tiny_models

    from probe.loading.models import from_pretrained_objects

    kind = dict(tiny_models.text_types())[model_type]
    model, tok = tiny_models.build(model_type, kind)
    return from_pretrained_objects(model, tok, name=f"tiny-{model_type}")


#: Discovered types (no hand-written spec): encoders (ModernBERT's local window, ALBERT's shared layer,
#: XLM-R), decoders (gpt-oss's sink logits and window, DeepSeek-V3's MLA with d_v != d_qk, OLMo 2's q/k norms,
#: Cohere 2's sliding window, Doge's dynamic mask as a bias), encoder-decoders (mBART, mT5's relative bias).
DISCOVERED_SAMPLE = ("modernbert", "albert", "xlm-roberta", "gpt_oss", "deepseek_v3", "olmo2", "mbart", "mt5")
TOOLS_SAMPLE = ("cohere2", "doge")


@pytest.mark.parametrize("model_type", DISCOVERED_SAMPLE + TOOLS_SAMPLE)
def test_steps_on_discovered_types_are_the_models_own(model_type):
    """Issue 47 item 4: steps on types without a hand-written spec, every head of every site, checked against
    the model's own eager attention (not probe's function)."""
    from generic_models import generic_lm

    lm = tools_lm(model_type) if model_type in TOOLS_SAMPLE else generic_lm(model_type)
    assert lm.spec.discovered
    text = PAIR if lm.kind == "encoder-decoder" else TEXT
    check_call_steps(lm, text)
    df = attention_steps(lm, text, site=len(lm.sites) - 1, head=1, query=2)
    assert df.attrs["steps"].max_diff <= ATOL


def test_windows_and_sinks_show_in_the_discovered_steps():
    import transformers as tr
    from generic_models import generic_lm

    from conftest import bert_tokenizer
    from probe.loading.models import from_pretrained_objects

    tok = bert_tokenizer()  # ModernBERT's local layers (local_attention=4): keys |i - j| <= 2 around the query
    config = tr.ModernBertConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, global_attn_every_n_layers=2, local_attention=4,
                                 pad_token_id=0, cls_token_id=101, sep_token_id=102)
    torch.manual_seed(0)
    lm = from_pretrained_objects(tr.AutoModel.from_config(config, attn_implementation="eager").eval(), tok)
    local = next(s for s in lm.sites if s.window is not None)
    st = head_steps(lm, TEXT, site=local, head=1)
    assert np.flatnonzero(st["keep"][8]).tolist() == [6, 7, 8, 9, 10]
    check_call_steps(lm, TEXT)
    lm = generic_lm("gpt_oss")
    st = head_steps(lm, TEXT, site=0, head=2)
    sinks = lm.model.model.layers[0].self_attn.sinks
    np.testing.assert_allclose(st["sink"], float(sinks[2].detach()), rtol=1e-6)
    assert st["kv_head"] == 1  # 4 query heads, 2 key/value heads


def test_a_capture_only_type_has_steps_from_its_projections_and_no_reference_route():
    """A model whose attention is its own code (ConvBERT) hands probe no query or key through the interface: the
    steps read them from its projections and check them against its maps (tests/test_steps_own_code.py); the
    from-scratch route is refused in one line, no traceback."""
    from generic_models import generic_lm

    lm = generic_lm("convbert")
    assert lm.spec.capture_only
    df = attention_steps(lm, TEXT, site=1, head=0, query=3)
    assert df.attrs["steps"].max_diff <= ATOL and "plain scaled dot-product attention" in df.attrs["steps"].note
    with pytest.raises(UnsupportedArchitectureError) as err:
        head_steps(lm, TEXT, via="reference")
    assert "attention steps" in str(err.value) and "\n" not in str(err.value)


def test_the_step_view_record_is_extended_without_changing_its_fields():
    """The view's record keeps every field it had (the live page and the reports read them) and adds the
    sink logits (null where none) and the value norms as null where probe found no output projection."""
    st = head_steps(tiny_model("llama"), TEXT, site=1, head=2)
    data = step_view_data(st)
    assert {"version", "site", "name", "head", "kvHead", "scale", "softcap", "nq", "nk", "dHead", "qTokens", "kTokens",
            "q", "k", "score", "bias", "scaled", "keep", "probs", "valueNorm", "source", "siteIndex", "query",
            "hasBias"} <= set(data)
    assert data["sink"] is None
    from generic_models import generic_lm

    data = step_view_data(head_steps(generic_lm("gpt_oss"), TEXT, site=1, head=0))
    assert len(data["sink"]) == data["nq"] and all(isinstance(v, float) for v in data["sink"])


def test_the_views_and_the_report_carry_steps_on_a_discovered_type_and_on_a_capture_only_one():
    """probe.show and the report's step views on ModernBERT hold its own steps (they were left out of
    discovered types); a capture-only type's head view opens with the steps read from its projections."""
    from generic_models import generic_lm

    import probe

    lm = generic_lm("modernbert")
    view = probe.show(lm, TEXT)
    site, head = view.steps["siteIndex"], view.steps["head"]
    assert view.steps == step_view_data(head_steps(lm, TEXT, site, head), site_index=site, query=view.steps["query"])
    res = analyze(lm, [TEXT, "Second text."], n_examples=1, thresholds={"previous-token": 0.1, "self": 0.1})
    out = report_steps(lm, res)
    assert out and all(d["probs"] for d in out)
    own = generic_lm("convbert")
    view = probe.show(own, TEXT)
    site, head = view.steps["siteIndex"], view.steps["head"]
    assert view.steps == step_view_data(head_steps(own, TEXT, site, head), site_index=site,
                                        query=view.steps["query"])
