"""The swapped-in reference attention and ``verify``: every tiny kind passes, every mutant fails,
the swap restores the model, the classic failures of hand-written attention (a lost or inverted
causal mask, a mask constant that overflows fp16, cache steps, heads split without a transpose,
scaling by d_model, weights preprocessed, real scores overflowing to -inf, padding checks that shift
positions: each told at its test), the architecture-specific behaviour of the newer families, and
``probe verify``.

Two tests marked ``slow`` verify the real embedded models.
"""

from __future__ import annotations

import json
import math
import types
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner
from transformers import BertConfig, BertModel, DynamicCache

from conftest import (
    ENCODERS,
    KINDS,
    LAYERS,
    SEQ2SEQ,
    bert_tokenizer,
    hook_snapshot,
    no_hooks,
    save_tiny,
    tiny_model,
    tolerance,
)
from probe.architectures import get_spec, site_block, site_modules
from probe.capture.hooks import Hooks
from probe.capture.reference import MUTANTS, MaskError, ReferenceAttention, Rope, mutant_applies
from probe.capture.reference.swap import swap_attention
from probe.cli import main
from probe.errors import ProbeError
from probe.loading.models import embedded_folder, from_pretrained_objects
from probe.verification import BF16_ATOL, NOISE_FACTOR, verify
from probe.verification.battery import CACHE_TEXTS

DECODER_CASES = ["sentence", "right-padded", "left-padded", "padding-invariance", "kv-cache", "max-length"]
ENCODER_CASES = ["sentence", "right-padded", "padding-invariance", "sentence-pair", "max-length"]
SEQ2SEQ_CASES = ["sentence", "right-padded", "kv-cache", "max-length"]


def _layers(kind: str) -> list[tuple[str, int]]:
    """(stack, layer) of every verified layer: an encoder-decoder model's two stacks (tiny T5's
    decoder has one layer more than its encoder), else one stack."""
    if kind in SEQ2SEQ:
        decoder = LAYERS + 1 if kind == "t5" else LAYERS
        return [("encoder", i) for i in range(LAYERS)] + [("decoder", i) for i in range(decoder)]
    return [(r, i) for r in ("encoder" if kind in ENCODERS else "decoder",) for i in range(LAYERS)]

_CACHE: dict = {}


def _lm(kind):
    """A shared tiny model of ``kind`` for tests that leave it as they found it (verify, swap)."""
    if kind not in _CACHE:
        _CACHE[kind] = tiny_model(kind)
    return _CACHE[kind]


def _capture(lm, **inputs):
    """One forward pass through the modules in place now: (probs per layer, hidden per layer, output)."""
    probs, hidden = {}, {}
    if lm.kind != "encoder":
        inputs.setdefault("use_cache", False)
    if lm.spec.probs_argument is not None:  # DeBERTa returns its probabilities only when asked
        inputs.setdefault(lm.spec.probs_argument, True)
    with torch.no_grad(), Hooks() as hooks:
        for i, module in enumerate([m for _, m in site_modules(lm.model, lm.spec)]):
            hooks.forward(module, lambda m, a, out, i=i: probs.__setitem__(i, out[1]))
        for i, layer in enumerate(site_block(lm.model, lm.spec, site) for site in lm.sites):
            hooks.forward(layer, lambda m, a, out, i=i: hidden.__setitem__(i, out[0] if isinstance(out, tuple)
                                                                           else out))
        output = lm.model(**inputs)
    n = len(probs)
    return [probs[i] for i in range(n)], [hidden[i] for i in range(n)], output


def _final(lm, output):
    return output.logits if lm.kind != "encoder" else output.last_hidden_state


def _ids(n, batch=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, 1000, (batch, n), generator=g)  # ordinary ids of every test vocabulary (>= 1000)


# ---------------------------------------------------------------------------------------------
# Every kind passes; every mutant fails where it applies
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_passes_verification(kind):
    lm = _lm(kind)
    result = verify(lm)
    assert result.passed, result.to_json()
    assert [(r.stack, r.layer) for r in result.per_layer] == _layers(kind)
    # probabilities within 1e-5; hidden states within float32 rounding of another summation order (a
    # CPU's kernels for a one-token cache step: 4e-5 on hidden states of magnitude ~50, 0 elsewhere)
    assert all(r.passed and r.attn_max_abs <= 1e-5 and r.hidden_max_abs <= 1e-4 for r in result.per_layer)
    expected = SEQ2SEQ_CASES if kind in SEQ2SEQ else DECODER_CASES if lm.kind == "decoder" else ENCODER_CASES
    assert [c.name for c in result.cases] == expected
    assert lm.kind == ("encoder" if kind in ENCODERS else "encoder-decoder" if kind in SEQ2SEQ else "decoder")
    if kind not in SEQ2SEQ:
        invariance = result.cases[[c.name for c in result.cases].index("padding-invariance")]
        assert invariance.padding_max_abs is not None and invariance.padding_max_abs <= 1e-5
        assert invariance.batching_noise is not None and invariance.batching_noise <= 1e-5
        assert all(c.padding_max_abs is None for c in result.cases if c is not invariance)
    # max-length: min(model limit, 1024) tokens; RoBERTa's 66-row table starts at pad_token_id + 1 = 1;
    # ALiBi (BLOOM) and T5's relative bias have no position table: probe's documented fallback is 512
    positions = 65 if kind == "roberta" else 512 if kind.startswith("bloom") or kind == "t5" else 64
    assert result.cases[-1].shape[-1] == min(positions, lm.tokenizer.model_max_length)
    data = json.loads(json.dumps(result.to_json()))
    assert set(data) >= {"model", "passed", "max_abs_diff", "per_layer", "cases"}
    assert data["passed"] is True and len(data["per_layer"]) == len(_layers(kind))


def _mutant_cases(lm):
    """The cheap cases that show every mutant: one sentence, padding on each side, padding invariance."""
    if lm.kind == "encoder-decoder":
        return ["sentence", "right-padded"]
    if lm.kind == "decoder":
        return ["sentence", "right-padded", "left-padded", "padding-invariance"]
    return ["sentence", "right-padded", "padding-invariance"]


def _mutant_matrix():
    """Every (kind, mutant) pair. The fast tier runs a fixed sample, kind ``i`` with mutant ``(i + 4) mod
    len(MUTANTS)`` in sorted order, plus c2p-sign on DeBERTa-v2 and alibi-sign on Falcon with ALiBi:
    every kind once, every mutant several times; the other pairs are ``slow`` (the full matrix runs in CI)."""
    mutants = sorted(MUTANTS)
    fast = {("deberta-v2", "c2p-sign"), ("falcon-alibi", "alibi-sign")}  # the family-specific ones on their kinds
    for i, kind in enumerate(KINDS):
        for j, mutant in enumerate(mutants):
            marks = () if j == (i + 4) % len(mutants) or (kind, mutant) in fast else (pytest.mark.slow,)
            yield pytest.param(kind, mutant, id=f"{kind}-{mutant}", marks=marks)


@pytest.mark.parametrize("kind,mutant", list(_mutant_matrix()))
def test_every_mutant_fails_where_it_applies(kind, mutant):
    lm = _lm(kind)
    applies, why = mutant_applies(mutant, lm)
    cases = _mutant_cases(lm)
    if mutant in ("no-causal-mask", "causal-inverted") and lm.kind == "encoder":
        assert not applies and why == f"{mutant} applies to decoders only"
        result = verify(lm, mutant=mutant, cases=cases)  # changes nothing: passes, and says why
        assert result.passed and any("cannot change this model" in n for n in result.notes)
        return
    if mutant == "no-scale" and kind in ("gpt2-unscaled", "t5", "gpt_neo"):  # T5 and GPT-Neo do not scale their scores
        assert not applies and why == "the model does not scale its scores"
        return
    inapplicable = {"alibi-sign": (not kind.startswith("bloom") and kind != "falcon-alibi",
                                   "the model has no ALiBi bias"),
                    "c2p-sign": (kind != "deberta-v2", "the model has no content-to-position term (DeBERTa's c2p)")}
    if mutant in inapplicable and inapplicable[mutant][0]:
        assert not applies and why == inapplicable[mutant][1]
        result = verify(lm, mutant=mutant, cases=cases)
        assert result.passed and any("cannot change this model" in n for n in result.notes)
        return
    assert applies, why
    result = verify(lm, mutant=mutant, cases=cases)
    assert not result.passed
    assert result.mutant == mutant
    assert result.max_abs_diff > 1e-3
    failed = {c.name for c in result.cases if not c.passed}
    if mutant == "no-padding-mask":  # only padded batches can show it
        padded = "left-padded" if lm.kind == "decoder" else "right-padded"
        assert failed == {padded} | ({"padding-invariance"} if "padding-invariance" in cases else set())
    else:
        assert "sentence" in failed


def test_unknown_mutant_is_a_clear_error():
    lm = _lm("bert")
    with pytest.raises(ProbeError, match="unknown mutant 'typo'"):
        verify(lm, mutant="typo")
    with pytest.raises(ProbeError, match="unknown mutant 'typo'; choose from"):
        with swap_attention(lm, "typo"):
            pass
    assert not any(isinstance(m, ReferenceAttention) for m in [m for _, m in site_modules(lm.model, lm.spec)])


def test_unknown_or_empty_case_list_is_an_error():
    lm = _lm("bert")
    with pytest.raises(ProbeError, match="unknown case"):
        verify(lm, cases=["kv-cache"])  # decoders only
    with pytest.raises(ProbeError, match="no verification case"):
        verify(lm, cases=[])


# ---------------------------------------------------------------------------------------------
# The swap itself
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,children", [
    ("bert", ["key", "query", "value"]),  # BERT's output projection stays in BertSelfOutput
    ("distilbert", ["k_lin", "out_lin", "q_lin", "v_lin"]),
    ("gpt2", ["c_attn", "c_proj"]),
    ("llama", ["k_proj", "o_proj", "q_proj", "v_proj"]),
    ("gpt_neox", ["dense", "query_key_value"]),
    ("phi3", ["o_proj", "qkv_proj"]),
    ("gemma3", ["k_norm", "k_proj", "o_proj", "q_norm", "q_proj", "v_proj"]),
])
def test_swap_holds_the_original_projections_and_restores(kind, children):
    lm = tiny_model(kind)
    originals = [m for _, m in site_modules(lm.model, lm.spec)]
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    ptrs = {k: v.data_ptr() for k, v in lm.model.state_dict().items()}
    with swap_attention(lm) as swapped:
        now = [m for _, m in site_modules(lm.model, lm.spec)]
        assert all(isinstance(m, ReferenceAttention) for m in now) and now == swapped.modules
        assert swapped.originals == originals
        for ref, orig in zip(now, originals):
            assert sorted(n for n, _ in ref.named_children()) == children
            for name, child in ref.named_children():
                assert child is orig.get_submodule(name)  # the same module object, not a copy
        # same parameter names and storage: nothing copied, renamed or preprocessed (a preprocessed copy
        # would shift the logits by a constant per position)
        assert {k: v.data_ptr() for k, v in lm.model.state_dict().items()} == ptrs
        assert not no_hooks(lm.model)  # the swap's pre/post hooks on the base model
    assert [m for _, m in site_modules(lm.model, lm.spec)] == originals
    after = lm.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert no_hooks(lm.model)

    with pytest.raises(RuntimeError, match="boom"):
        with swap_attention(lm):
            raise RuntimeError("boom")
    assert [m for _, m in site_modules(lm.model, lm.spec)] == originals
    assert no_hooks(lm.model)


def test_swap_into_callers_hooks_lasts_until_they_are_removed():
    lm = tiny_model("llama")
    originals = [m for _, m in site_modules(lm.model, lm.spec)]
    hooks = Hooks()
    with swap_attention(lm, hooks=hooks) as swapped:
        assert [m for _, m in site_modules(lm.model, lm.spec)] == swapped.modules
    assert [m for _, m in site_modules(lm.model, lm.spec)] == swapped.modules  # the caller's Hooks own the swap
    hooks.remove()
    assert [m for _, m in site_modules(lm.model, lm.spec)] == originals and no_hooks(lm.model)


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama", "gemma2"])
def test_verify_leaves_no_hook_and_restores_everything(kind):
    lm = tiny_model(kind)
    originals = [m for _, m in site_modules(lm.model, lm.spec)]
    snapshot = hook_snapshot(lm.model)
    lm.model.train()
    result = verify(lm, mutant="no-scale", cases=["sentence"])
    assert not result.passed
    assert any("measured in eval mode" in n for n in result.notes)
    assert lm.model.training  # restored after measuring
    assert hook_snapshot(lm.model) == snapshot and [m for _, m in site_modules(lm.model, lm.spec)] == originals
    assert all(m.training for m in lm.model.modules())


def test_swapped_module_works_when_the_original_runs_sdpa():
    """The reference returns probabilities whatever implementation the model is set to (sdpa and flash
    attention return none)."""
    lm = tiny_model("llama")
    ids = _ids(6)
    eager_probs, _, eager_out = _capture(lm, input_ids=ids)
    lm.model.set_attn_implementation("sdpa")
    with swap_attention(lm):
        probs, _, out = _capture(lm, input_ids=ids)
    assert len(probs) == 2 and all(p.shape == (1, 4, 6, 6) for p in probs)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(probs, eager_probs))
    assert torch.allclose(out.logits, eager_out.logits, **tolerance("scaled"))


def test_verify_runs_eager_for_the_original_and_restores_sdpa():
    lm = tiny_model("bert")
    lm.model.set_attn_implementation("sdpa")
    result = verify(lm, cases=["sentence", "right-padded"])
    assert result.passed and [c.name for c in result.cases] == ["sentence", "right-padded"]
    assert any("switched attention implementation from 'sdpa' to 'eager'" in n for n in result.notes)
    assert lm.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("kind", ["gpt2", "llama", "mistral", "gpt_neox", "phi3", "gemma2", "gemma3", "qwen2-window"])
def test_generate_with_left_padding_is_unchanged(kind):
    """generate() runs through the swap (2D mask, position ids and cache handled each step)."""
    lm = _lm(kind)
    tok = lm.tokenizer
    tok.padding_side = "left"
    try:
        enc = tok(["Hello there my good friend, how are you today?", "A b"], return_tensors="pt", padding=True)
    finally:
        tok.padding_side = "right"
    assert not bool(enc["attention_mask"].all())
    args = dict(max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    original = lm.model.generate(**enc, **args)
    with swap_attention(lm):
        swapped = lm.model.generate(**enc, **args)
    assert original.shape == (2, enc["input_ids"].shape[1] + 12)
    assert torch.equal(swapped, original)


@pytest.mark.parametrize("kind,windows", [
    ("mistral", [8, 8]), ("qwen2-window", [None, 4]), ("gemma2", [4, None]), ("gemma3", [4, None]),
    ("phi3", [None, None]), ("llama", [None, None]),
])
def test_sliding_windows_follow_the_config(kind, windows):
    lm = _lm(kind)
    ids = _ids(20)
    _, _, original = _capture(lm, input_ids=ids)
    assert [s.window for s in lm.sites] == windows
    with swap_attention(lm) as swapped:
        assert [m.window for m in swapped.modules] == windows
        probs, _, out = _capture(lm, input_ids=ids)
    assert torch.allclose(out.logits, original.logits, **tolerance("scaled"))
    for w, p in zip(windows, probs):
        if w is not None:  # key 19 - w is the newest key query 19 no longer sees
            assert torch.count_nonzero(p[0, :, 19, :20 - w]) == 0
            assert bool((p[0, :, 19, 20 - w:] > 0).all())
        else:
            assert bool((p[0, :, 19] > 0).all())


# ---------------------------------------------------------------------------------------------
# Failure cases seen in other tools (each test says its case)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["gpt2", "llama", "gpt_neox", "phi3", "gemma2"])
def test_unpadded_decoder_weights_above_diagonal_are_zero(kind):
    lm = _lm(kind)
    ids = torch.tensor([[101, 196, 437, 238, 206, 102]])  # 6 tokens, no padding, no mask given
    eager_probs, eager_hidden, eager_out = _capture(lm, input_ids=ids)
    with swap_attention(lm):
        probs, hidden, out = _capture(lm, input_ids=ids)
    above = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    for p, e in zip(probs, eager_probs):
        assert p.shape == (1, 4, 6, 6)
        assert torch.count_nonzero(p[..., above]) == 0  # exactly 0 above the diagonal
        assert torch.allclose(p, e, atol=1e-5, rtol=0)
    for h, e in zip(hidden, eager_hidden):
        assert torch.allclose(h, e, **tolerance("scaled"))  # hidden states
    assert torch.allclose(out.logits, eager_out.logits, **tolerance("scaled"))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_changing_token_5_leaves_positions_0_to_4_bit_identical(kind):
    lm = _lm(kind)
    ids = torch.tensor([[101, 196, 437, 238, 206, 196, 523, 102]])  # 8 tokens
    changed = ids.clone()
    changed[0, 5] = 389
    with swap_attention(lm):
        p1, h1, o1 = _capture(lm, input_ids=ids)
        p2, h2, o2 = _capture(lm, input_ids=changed)
    assert torch.equal(o1.logits[:, :5], o2.logits[:, :5])
    assert not torch.equal(o1.logits[:, 5:], o2.logits[:, 5:])
    for a, b in zip(p1, p2):
        assert torch.equal(a[:, :, :5], b[:, :, :5])  # rows 0-4, every key, every head
    for a, b in zip(h1, h2):
        assert torch.equal(a[:, :5], b[:, :5])
    # the inverted-polarity bug is caught by this very check
    with swap_attention(lm, "causal-inverted"):
        _, _, m1 = _capture(lm, input_ids=ids)
        _, _, m2 = _capture(lm, input_ids=changed)
    assert not torch.equal(m1.logits[:, :5], m2.logits[:, :5])


def _half(kind, dtype):
    model, tok = tiny_model(kind, wrap=False)
    return from_pretrained_objects(model.to(dtype), tok, name=f"{kind}-{dtype}")


def _left_padded(lm, texts):
    tok = lm.tokenizer
    tok.padding_side = "left"
    try:
        enc = tok(texts, return_tensors="pt", padding=True)
    finally:
        tok.padding_side = "right"
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["gpt2", "gpt2-upcast", "llama", "gemma2"])
def test_half_precision_left_padding_has_no_nan(kind, dtype):
    lm = _half(kind, dtype)
    enc = _left_padded(lm, ["The cat sat on the mat.", "A much longer sentence with quite a few more tokens in it."])
    keep = enc["attention_mask"].bool()
    assert not keep.all()  # there is left padding
    try:
        with swap_attention(lm):
            probs, hidden, out = _capture(lm, **enc)
    except RuntimeError as exc:  # an op without a CPU kernel for this dtype
        pytest.skip(f"{dtype} not supported on this CPU build: {exc}")
    eps = torch.finfo(dtype).eps  # 9.8e-4 (fp16), 7.8e-3 (bf16)
    for p in probs:
        assert p.dtype == dtype
        assert torch.isfinite(p).all()
        sums = p.float().sum(-1)[keep[:, None, :].expand(-1, p.size(1), -1)]
        assert torch.allclose(sums, torch.ones_like(sums), atol=4 * eps, rtol=0)
        # padding keys of real rows are exactly 0
        pad_keys = (~keep)[:, None, None, :] & keep[:, None, :, None]
        assert torch.count_nonzero(p[pad_keys.expand_as(p)]) == 0
    for h in hidden:
        assert torch.isfinite(h).all()
    assert torch.isfinite(out.logits).all()


def test_bf16_verification_passes_with_the_documented_tolerance():
    model, tok = tiny_model("llama", wrap=False)
    inv_freq = model.model.rotary_emb.inv_freq.clone()
    model = model.to(torch.bfloat16)
    # from_pretrained(dtype=bfloat16) keeps RoPE's inv_freq buffer in float32; .to() would round it to
    # bfloat16 and the model's own RoPE would lose precision. Keep it as loading does.
    model.model.rotary_emb.inv_freq = inv_freq
    lm = from_pretrained_objects(model, tok, name="llama-bf16")
    result = verify(lm, atol=BF16_ATOL)
    assert result.passed and result.dtype == "bfloat16"
    assert result.max_abs_diff <= BF16_ATOL


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_kv_cache_steps_match_the_full_pass(kind):
    lm = _lm(kind)
    ids = _ids(9, batch=2, seed=3)
    full_probs, _, full_out = _capture(lm, input_ids=ids)

    def incremental():
        """A 6-token prefix, then 3 one-token steps with the cache: (probs per step, logits per step)."""
        cache = DynamicCache(config=lm.model.config)
        _capture(lm, input_ids=ids[:, :6], attention_mask=torch.ones(2, 6, dtype=torch.long), cache=cache,
                 use_cache=True)
        steps, logits = [], []
        for step in range(1, 4):
            end = 6 + step
            probs, _, out = _capture(lm, input_ids=ids[:, end - 1:end],
                                     attention_mask=torch.ones(2, end, dtype=torch.long), cache=cache, use_cache=True)
            steps.append(probs)
            logits.append(out.logits)
        return steps, torch.cat(logits, 1), cache

    _, original_logits, _ = incremental()
    with swap_attention(lm):
        steps, logits, cache = incremental()
        for step, probs in enumerate(steps, start=1):
            assert [tuple(p.shape) for p in probs] == [(2, 4, 1, 6 + step)] * LAYERS  # [batch, heads, 1, 6 + k]
            for layer, p in enumerate(probs):
                row = full_probs[layer][:, :, 5 + step, : 6 + step]  # the matching row of one full pass
                assert torch.allclose(p[:, :, 0], row, atol=1e-5, rtol=0)
        assert torch.allclose(logits, original_logits, **tolerance("scaled"))  # the original, step by step
        # against one full pass: one-row and full-sequence GEMMs round differently in fp32
        assert torch.allclose(logits, full_out.logits[:, 6:], atol=1e-4, rtol=1e-4)

        # a mask covering only the new token is a clear error, not a shape error deep inside
        with pytest.raises(MaskError, match=r"attention_mask has 1 columns but the keys are 10 \(9 cached \+ 1 new"):
            lm.model(input_ids=ids[:, :1], attention_mask=torch.ones(2, 1, dtype=torch.long), cache=cache,
                     use_cache=True)
    assert torch.allclose(original_logits, full_out.logits[:, 6:], atol=1e-4, rtol=1e-4)


def test_reference_module_called_directly_checks_mask_length():
    model, _ = tiny_model("gpt2", wrap=False)
    module = ReferenceAttention(model.transformer.h[0].attn, get_spec(model.config), model.config, 0)
    x = torch.randn(2, 1, 64)
    cache = DynamicCache(config=model.config)
    module(torch.randn(2, 6, 64), cache=cache, padding_mask=torch.ones(2, 6))
    y, p = module(x, cache=cache, padding_mask=torch.ones(2, 7))
    assert y.shape == (2, 1, 64) and p.shape == (2, 4, 1, 7)
    with pytest.raises(MaskError, match="does not cover the 8 keys"):
        module(x, cache=cache, padding_mask=torch.ones(2, 1))
    with pytest.raises(MaskError, match="needs the 2D padding mask"):
        module(x, attention_mask=torch.zeros(2, 1, 1, 9))


def _bert(hidden, heads, layers, seed, **kw):
    tok = bert_tokenizer()
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     attn_implementation="eager", **kw)
    return from_pretrained_objects(BertModel(cfg).eval(), tok, name=f"bert-{hidden}-{heads}")


def test_every_head_of_a_12_head_encoder_matches():
    lm = _bert(96, 12, 3, seed=4, intermediate_size=128, initializer_range=0.3)
    ids = _ids(7, batch=2, seed=4)
    mask = torch.ones(2, 7, dtype=torch.long)
    original, _, _ = _capture(lm, input_ids=ids, attention_mask=mask)
    with swap_attention(lm):
        swapped, _, _ = _capture(lm, input_ids=ids, attention_mask=mask)
    for layer, (a, b) in enumerate(zip(swapped, original)):
        assert a.shape == (2, 12, 7, 7)
        for head in range(12):
            assert torch.allclose(a[:, head], b[:, head], atol=1e-6, rtol=0), (layer, head)
    with swap_attention(lm, "merge-without-transpose"):
        broken, _, _ = _capture(lm, input_ids=ids, attention_mask=mask)
    assert torch.allclose(broken[0], original[0], atol=1e-6)  # layer 0's probabilities are still right ...
    assert not torch.allclose(broken[1], original[1], atol=1e-3)  # ... the mixed-up output shows from layer 1


def test_scale_is_one_over_sqrt_d_head():
    lm = _bert(768, 12, 2, seed=5, intermediate_size=64, max_position_embeddings=32, initializer_range=0.1)
    with swap_attention(lm) as swapped:
        assert swapped.modules[0].d_head == 64
        assert swapped.modules[0].scale == 1 / math.sqrt(64) == 0.125
    assert verify(lm).passed
    with swap_attention(lm, "scale-d-model") as swapped:
        assert swapped.modules[0].score_scale() == pytest.approx(1 / math.sqrt(768), rel=1e-12)
    result = verify(lm, mutant="scale-d-model", cases=["sentence"])
    assert not result.passed
    assert result.per_layer[0].attn_max_abs > 1e-3


@pytest.mark.parametrize("kind", ["gpt2", "llama", "distilbert", "gpt_neox", "phi3", "gemma"])
def test_raw_outputs_match_without_preprocessing(kind):
    lm = _lm(kind)
    enc = lm.tokenizer(["The cat sat on the mat.", "Dogs bark."], return_tensors="pt", padding=True)
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    _, hidden, out = _capture(lm, **inputs)
    with swap_attention(lm):
        _, hidden2, out2 = _capture(lm, **inputs)
    keep = enc["attention_mask"].bool()
    assert not keep.all()
    assert torch.allclose(_final(lm, out2)[keep], _final(lm, out)[keep], **tolerance("scaled"))
    for a, b in zip(hidden2, hidden):
        assert torch.allclose(a[keep], b[keep], **tolerance("scaled"))


# --------------------------------------------------------------------------- fp16 real scores that overflow to -inf

def test_swapped_llama_in_fp16_with_left_padding_gives_zero_for_masked_keys_and_no_nan(monkeypatch):
    """Natural weights, then the query projection x 1000 so that real scores overflow in fp16:
    masked keys (future and padding) get exactly 0, no NaN anywhere, every row sums to 1 or is 0."""
    import probe.capture.interface as module  # the reference module computes with probe's attention function

    lm = _half("llama", torch.float16)
    enc = _left_padded(lm, ["The cat sat on the mat.", "A much longer sentence with quite a few more tokens in it."])
    real = enc["attention_mask"].bool()
    T = real.shape[1]
    assert not real.all()
    keep = real[:, None, None, :] & torch.tril(torch.ones(T, T, dtype=torch.bool))  # (B, 1, T, T)
    scores = []
    op = module.scored_attention

    def spy(q, k, v, *args, **kw):
        scores.append(((q @ k.transpose(-2, -1)) * kw["scale"]).detach())
        return op(q, k, v, *args, **kw)

    monkeypatch.setattr(module, "scored_attention", spy)
    for factor in (1.0, 1000.0):
        for layer in (site_block(lm.model, lm.spec, site) for site in lm.sites):
            layer.self_attn.q_proj.weight.data *= factor
        scores.clear()
        with swap_attention(lm):
            probs, hidden, out = _capture(lm, **enc)
        for p in probs:
            assert p.dtype == torch.float16
            assert not torch.isnan(p).any()
            assert torch.count_nonzero(p[~keep.expand_as(p)]) == 0  # masked keys: exactly 0
            sums = p.float().sum(-1)[real[:, None, :].expand(-1, p.size(1), -1)]
            assert bool(((sums - 1).abs() <= 4e-3).logical_or(sums == 0).all())
        real_scores = torch.cat([s[keep.expand_as(s)] for s in scores])
        if factor == 1.0:
            assert bool(torch.isfinite(real_scores).all())
        else:
            assert bool((real_scores == -math.inf).any())  # real scores really overflow to -inf here
        assert all(not torch.isnan(h).any() for h in hidden) and not torch.isnan(out.logits).any()


# --------------------------------------------------------------------------- left padding at the same positions

def _alone_and_padded(lm, pad, position_ids_from_mask, text=CACHE_TEXTS[0]):
    """Per layer, attention and hidden states of the real tokens: (prompt alone, prompt left-padded
    by ``pad``). The default prompt is the one verify's padding-invariance case uses."""
    ids = lm.tokenizer([text], return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    probs, hidden, _ = _capture(lm, input_ids=ids, attention_mask=torch.ones(1, n, dtype=torch.long))
    padded = torch.cat([torch.full((1, pad), lm.tokenizer.pad_token_id), ids], 1)
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones(1, n, dtype=torch.long)], 1)
    extra = {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0)} if position_ids_from_mask else {}
    probs_p, hidden_p, _ = _capture(lm, input_ids=padded, attention_mask=mask, **extra)
    return probs + hidden, [p[:, :, pad:, pad:] for p in probs_p] + [h[:, pad:] for h in hidden_p]


def _max_diff(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_left_padded_and_padding_invariance_cases_pass(kind):
    lm = _lm(kind)
    result = verify(lm, cases=["left-padded", "padding-invariance"])
    left, case = result.cases
    assert left.passed and case.passed, result.to_json()
    assert case.padding_max_abs <= 1e-5
    assert case.batching_noise <= 1e-5
    assert case.shape[0] == 1  # pass 0 is the prompt alone
    # the same comparison done here on the original model, for each padding the case uses
    for pad in (1, 3, 8):
        alone, padded = _alone_and_padded(lm, pad, position_ids_from_mask=True)
        assert _max_diff(alone, padded) <= 1e-5, pad


def test_without_position_ids_from_the_mask_gpt2_moves_the_tokens():
    """Learned absolute positions: left padding without position ids shifts every real token."""
    lm = _lm("gpt2")
    for pad in (1, 3, 8):
        alone, shifted = _alone_and_padded(lm, pad, position_ids_from_mask=False)
        assert _max_diff(alone, shifted) > 1e-3, pad
        alone, fixed = _alone_and_padded(lm, pad, position_ids_from_mask=True)
        assert _max_diff(alone, fixed) <= 1e-5, pad


def test_padding_invariance_does_not_fail_a_correct_reference_on_another_prompt(monkeypatch):
    import probe.verification.battery as battery

    text = "Once upon a time there was"  # 11 tokens: a length where the tiny llama's own rounding shows here
    monkeypatch.setattr(battery, "CACHE_TEXTS", [text, battery.CACHE_TEXTS[1]])
    lm = _lm("llama")
    alone, padded = _alone_and_padded(lm, 1, position_ids_from_mask=True, text=text)
    rounding = _max_diff(alone, padded)  # the original model's own length-dependent rounding (2.5e-5 here)
    if rounding == 0.0:  # which lengths round differently is the CPU's GEMM kernels' choice
        pytest.skip("this machine rounds the prompt alone and left-padded alike: no rounding to bound")
    assert rounding < 1e-4
    atol = rounding / 4  # a tolerance below that rounding, on any machine that has some
    result = verify(lm, cases=["padding-invariance"], atol=atol)
    case = result.cases[0]
    assert case.max_abs_diff == 0.0  # the reference reproduces the original exactly ...
    assert case.passed  # ... so padding invariance must not fail it
    # the length-dependent rounding is measured on the right-padded prompt and bounds the check
    assert case.padding_max_abs > atol and case.batching_noise > atol
    assert case.padding_max_abs <= NOISE_FACTOR * case.batching_noise


def test_left_padded_case_passes_position_ids_from_the_mask():
    lm = _lm("gpt2")
    seen = []

    def record(module, args, kwargs):
        seen.append((kwargs.get("attention_mask"), kwargs.get("position_ids")))

    handle = lm.model.base_model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        assert verify(lm, cases=["left-padded"]).passed
    finally:
        handle.remove()
    assert len(seen) == 2  # the original and the swapped run
    for mask, positions in seen:
        assert mask is not None and positions is not None
        assert not bool(mask[:, 0].all())  # some rows are padded on the left
        for row_mask, row_pos in zip(mask.bool(), positions):
            assert row_pos[row_mask].tolist() == list(range(int(row_mask.sum())))  # real tokens: 0, 1, 2 ...


@pytest.mark.slow
def test_smollm2_padding_invariance_within_batching_noise(smollm2):
    result = verify(smollm2, cases=["left-padded", "padding-invariance"])
    left, case = result.cases
    print(f"smollm2 padding-invariance: padded vs alone {case.padding_max_abs:.3e}, "
          f"batching noise {case.batching_noise:.3e}")
    assert left.passed and case.passed, result.to_json()
    assert case.padding_max_abs <= max(1e-5, 4 * case.batching_noise)


# ---------------------------------------------------------------------------------------------
# Architecture-specific behaviour: breaking it must show
# ---------------------------------------------------------------------------------------------

def _swap_difference(lm, ids, patch=None):
    """max |swapped - original| over logits and every layer's probabilities, with ``patch(module)``
    applied to each swapped module first (None: the correct reference)."""
    probs0, _, out0 = _capture(lm, input_ids=ids)
    with swap_attention(lm) as swapped:
        if patch is not None:
            for m in swapped.modules:
                patch(m)
        probs, _, out = _capture(lm, input_ids=ids)
    diffs = [float((a - b).abs().max()) for a, b in zip(probs, probs0)]
    return max(diffs + [float((_final(lm, out) - _final(lm, out0)).abs().max())])


def _full_rotary(m):
    m.rope = Rope.from_config({**m.rope.params, "partial_rotary_factor": 1.0}, m.d_head, m.rope.max_positions)


def _swap_kv_split(m):
    """Phi-3's fused projection split as q | v | k (keys and values exchanged)."""
    def project(self, x, source=None):
        q, k, v = ReferenceAttention.project(self, x, source)
        return q, v, k
    m.project = types.MethodType(project, m)


def _no_norm(m):
    m.normalize = lambda q, k: (q, k)


def _set(**attrs):
    def patch(m):
        for name, value in attrs.items():
            setattr(m, name, value)
    return patch


def _rel_without_norm(m):
    m._rel_embeddings[0] = (m.rel_embeddings[0], None)


def _alibi_other_count(m):
    """Falcon's ALiBi added the number of times the installed release's eager attention does not (measured):
    once where it adds it twice (transformers 5.0-5.24), twice where it adds it once (5.25 on)."""
    from probe.architectures.falcon import _alibi_values, eager_alibi_count

    def inner(module, n_query, n_key, past, key_positions, device, content=None):
        return _alibi_values(module, n_key, key_positions, device)
    other = None if eager_alibi_count(type(m.config)) == 2 else inner
    m.spec = replace(m.spec, position_bias=replace(m.spec.position_bias, inner=other))


BREAKS = {
    "deberta-v2-scale-without-position-terms": ("deberta-v2", _set(scale=16 ** -0.5)),  # 1/sqrt(3 d_head)
    "deberta-v2-positions-not-normalised": ("deberta-v2", _rel_without_norm),
    "falcon-alibi-other-count": ("falcon-alibi", _alibi_other_count),
    "gpt_neox-full-rotary": ("gpt_neox", _full_rotary),
    "phi3-full-rotary": ("phi3", _full_rotary),
    "phi3-kv-split": ("phi3", _swap_kv_split),
    "gemma-scale-from-hidden-size": ("gemma", _set(scale=(64 // 4) ** -0.5)),  # d_head is 24, not 64 / 4
    "gemma2-no-softcap": ("gemma2", _set(softcap=None)),
    "gemma2-scale-from-head-dim": ("gemma2", _set(scale=24 ** -0.5)),  # query_pre_attn_scalar is 20
    "gemma2-no-window": ("gemma2", _set(window=None)),
    "gemma3-no-window": ("gemma3", _set(window=None)),
    "qwen2-window-no-window": ("qwen2-window", _set(window=None)),
    "mistral-no-window": ("mistral", _set(window=None)),
    "gemma3-no-qk-norm": ("gemma3", _no_norm),
    "qwen3-no-qk-norm": ("qwen3", _no_norm),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_breaking_architecture_specific_behaviour_shows(name):
    kind, patch = BREAKS[name]
    lm = _lm(kind)
    ids = _ids(20)  # longer than every window (4 or 8)
    assert _swap_difference(lm, ids) <= 1e-5
    assert _swap_difference(lm, ids, patch) > 1e-3


@pytest.mark.parametrize("kind,heads,kv_heads,d_head,rotary_dim,scale,softcap", [
    ("gpt_neox", 4, 4, 16, 4, 16 ** -0.5, None),
    ("phi3", 4, 2, 16, 8, 16 ** -0.5, None),
    ("gemma", 4, 2, 24, 24, 24 ** -0.5, None),
    ("gemma2", 4, 2, 24, 24, 20 ** -0.5, 5.0),
    ("gemma3", 4, 2, 24, 24, 20 ** -0.5, None),
    ("qwen3", 4, 2, 16, 16, 16 ** -0.5, None),
])
def test_new_architectures_geometry(kind, heads, kv_heads, d_head, rotary_dim, scale, softcap):
    lm = _lm(kind)
    with swap_attention(lm) as swapped:
        assert swapped.notes == []  # the model's own scaling attribute agrees with the rule
        for m, orig in zip(swapped.modules, swapped.originals):
            assert (m.n_head, m.n_kv_head, m.d_head) == (heads, kv_heads, d_head)
            assert m.rope.rotary_dim == rotary_dim
            assert m.scale == pytest.approx(scale, rel=1e-12) == orig.scaling
            assert m.softcap == softcap
            assert m.is_causal


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def _cli(*args):
    return CliRunner().invoke(main, ["verify", *args, "--no-progress"])


def test_cli_verify_quick_checks_the_sentence_case_only(tmp_path):
    """Issue 27 item 11: --quick runs the one-sentence case of the battery (the whole battery's
    padding, key/value-cache and long cases are what take minutes on a large model)."""
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    quick = _cli("--model", str(folder), "--quick", "--json")
    assert quick.exit_code == 0, quick.output
    data = json.loads(quick.stdout)
    assert [c["name"] for c in data["cases"]] == ["sentence"] and data["passed"] is True
    assert len(data["per_layer"]) == LAYERS
    whole = json.loads(_cli("--model", str(folder), "--json").stdout)
    assert [c["name"] for c in whole["cases"]] == DECODER_CASES and len(DECODER_CASES) > 1


def test_cli_verify_on_a_local_folder(tmp_path):
    folder = save_tiny("gpt2", tmp_path / "gpt2")
    ok = _cli("--model", str(folder))
    assert ok.exit_code == 0, ok.output
    lines = ok.output.strip().splitlines()
    assert lines[-1].startswith("PASS: max abs diff")
    layer_rows = [line for line in lines if line.split()[:1] in (["0"], ["1"])]
    assert len(layer_rows) == LAYERS and all(r.endswith("PASS") for r in layer_rows)
    start = lines.index("cases:") + 1
    case_rows = [line.split()[0] for line in lines[start:start + len(DECODER_CASES)]]
    assert case_rows == DECODER_CASES and ok.output.count("PASS") == LAYERS + len(DECODER_CASES) + 1

    bad = _cli("--model", str(folder), "--mutant", "no-causal-mask", "--json")
    assert bad.exit_code == 1
    data = json.loads(bad.stdout)
    assert data["passed"] is False and data["mutant"] == "no-causal-mask" and len(data["per_layer"]) == LAYERS

    encoder = save_tiny("bert", tmp_path / "bert")
    moot = _cli("--model", str(encoder), "--mutant", "causal-inverted")
    assert moot.exit_code == 1
    assert moot.output.strip() == (f"Error: mutant 'causal-inverted' cannot change {encoder}: "
                                   "causal-inverted applies to decoders only")
    enc_ok = _cli("--model", str(encoder), "--json")
    assert enc_ok.exit_code == 0, enc_ok.output
    assert [c["name"] for c in json.loads(enc_ok.stdout)["cases"]] == ENCODER_CASES

    missing = _cli("--model", str(tmp_path / "nope"))
    assert missing.exit_code == 1
    assert missing.output.startswith("Error: ") and len(missing.output.strip().splitlines()) == 1

    for option, value in (("--atol", "-1"), ("--rtol", "-0.5"), ("--atol", "nan"), ("--rtol", "nan"),
                          ("--atol", "inf")):
        bad_tol = _cli("--model", str(folder), option, value)
        assert bad_tol.exit_code == 2, (option, value, bad_tol.output)
        assert len(bad_tol.output.strip().splitlines()) == 1
        assert bad_tol.output.startswith(f"Error: Invalid value for '{option}'")
        assert "PASS" not in bad_tol.output and "FAIL" not in bad_tol.output  # nothing ran
    unknown = _cli("--model", str(folder), "--mutant", "typo")
    assert unknown.exit_code == 2


@pytest.mark.parametrize("kind,mutant", [
    ("gpt_neox", "no-causal-mask"), ("phi3", "merge-without-transpose"), ("gemma", "scale-d-model"),
    ("gemma2", "no-scale"), ("gemma3", "causal-inverted"), ("qwen3", "no-padding-mask"),
    ("deberta-v2", "c2p-sign"), ("falcon", "no-causal-mask"), ("falcon-alibi", "alibi-sign"),
])
def test_cli_verify_new_architectures(tmp_path, kind, mutant):
    folder = save_tiny(kind, tmp_path / kind)
    ok = _cli("--model", str(folder), "--json")
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.stdout)
    assert data["passed"] is True and data["max_abs_diff"] <= 1e-4 and len(data["per_layer"]) == LAYERS
    if kind.startswith(("deberta", "falcon")):  # the hand specs follow the eager code's rounding: 0 on some CPUs,
        assert data["max_abs_diff"] <= 1e-5  # a few ulps where the kernels add another shape in another order
    assert [c["name"] for c in data["cases"]] == (ENCODER_CASES if kind in ENCODERS else DECODER_CASES)
    bad = _cli("--model", str(folder), "--mutant", mutant)
    assert bad.exit_code == 1, bad.output
    assert bad.output.strip().splitlines()[-1].startswith("FAIL: max abs diff")


# ---------------------------------------------------------------------------------------------
# Real embedded models
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("alias", ["minilm", "smollm2"])
def test_embedded_models_pass_verification(alias):
    from probe.loading.models import load_model

    if embedded_folder(alias) is None:
        pytest.skip(f"embedded model {alias} not installed")
    lm = load_model(alias)
    result = verify(lm)
    assert result.passed, result.to_json()
    assert result.max_abs_diff <= 1e-5
    assert len(result.per_layer) == lm.geometry.n_layers
    assert [c.name for c in result.cases] == (DECODER_CASES if lm.kind == "decoder" else ENCODER_CASES)
    assert result.cases[-1].shape == [1, 512 if alias == "minilm" else 1024]


def test_deberta_v2_without_relative_attention_verifies_at_zero():
    """DeBERTa-v2's default config has relative_attention=False: the encoder then holds no relative
    table, no position term is added (the scale still counts pos_att_type, as transformers does), and
    the from-scratch attention reproduces the model exactly (the swap used to look the table up and fail)."""
    import transformers as tr

    tok = bert_tokenizer()
    config = tr.DebertaV2Config(vocab_size=len(tok), hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                                intermediate_size=64, max_position_embeddings=64, relative_attention=False,
                                pos_att_type=["p2c", "c2p"], type_vocab_size=0, pad_token_id=0,
                                initializer_range=0.3, attn_implementation="eager")
    torch.manual_seed(0)
    model = tr.DebertaV2Model(config).eval()
    assert not hasattr(model.encoder, "rel_embeddings")
    result = verify(from_pretrained_objects(model, tok, name="tiny-deberta-v2-absolute"))
    assert result.passed and result.max_abs_diff == 0.0
