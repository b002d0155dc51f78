"""From-scratch attention: swap, verify, mutants and the failure cases of shared/CASES.md.

Tiny random-init models of every supported family are built here (weights drawn with a large
``initializer_range`` so attention is sharp enough for a wrong scale or mask to show); two tests
marked ``slow`` verify the real embedded models.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner
from transformers import (
    AutoTokenizer, BertConfig, BertModel, DistilBertConfig, DistilBertModel, DynamicCache, GPT2Config,
    GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
    Qwen2ForCausalLM, RobertaConfig, RobertaModel,
)

from probe.architectures import attention_modules, get_spec, layer_modules
from probe.errors import ProbeError
from probe.hooks import Hooks
from probe.models import embedded_folder, from_pretrained_objects
from probe.reference import (
    MUTANTS, MaskError, ReferenceAttention, as_keep_mask, attention, mutant_applies, rope_inv_freq,
    swap_attention,
)
from probe.verify import BF16_ATOL, verify, verify_command

VOCAB = 30522  # the embedded MiniLM tokenizer's vocabulary


@pytest.fixture(scope="module")
def tokenizer_folder():
    folder = embedded_folder("minilm")
    if folder is None:
        pytest.skip("embedded MiniLM (its tokenizer) not installed")
    return folder


def _tok(folder):
    return AutoTokenizer.from_pretrained(folder)


def _build(kind: str, **overrides):
    """A tiny random-init model of one family (seeded, eager attention, eval mode)."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, initializer_range=0.3)
    if kind == "bert":
        cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                         max_position_embeddings=64, **common)
        model = BertModel(cfg)
    elif kind == "roberta":
        cfg = RobertaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                            max_position_embeddings=66, pad_token_id=0, **common)
        model = RobertaModel(cfg)
    elif kind == "distilbert":
        cfg = DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64, **common)
        model = DistilBertModel(cfg)
    elif kind.startswith("gpt2"):
        opts = {"gpt2": {}, "gpt2-unscaled": {"scale_attn_weights": False},
                "gpt2-layer-scaled": {"scale_attn_by_inverse_layer_idx": True},
                "gpt2-unscaled-layer-scaled": {"scale_attn_weights": False, "scale_attn_by_inverse_layer_idx": True},
                "gpt2-upcast": {"reorder_and_upcast_attn": True}}[kind]
        cfg = GPT2Config(n_embd=64, n_layer=3, n_head=4, n_positions=64, bos_token_id=101, eos_token_id=102, **opts,
                         **common)
        model = GPT2LMHeadModel(cfg)
    elif kind.startswith("llama"):
        rope = {"llama": None, "llama-linear": {"rope_type": "linear", "factor": 2.0},
                "llama-llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}[kind]
        extra = {"rope_scaling": rope} if rope else {}
        cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=128, max_position_embeddings=64, **extra, **common)
        model = LlamaForCausalLM(cfg)
    elif kind == "qwen2":
        cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                          intermediate_size=128, max_position_embeddings=64, **common)
        model = Qwen2ForCausalLM(cfg)
    elif kind == "mistral":
        cfg = MistralConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=128, max_position_embeddings=64, sliding_window=8, **common)
        model = MistralForCausalLM(cfg)
    else:
        raise ValueError(kind)
    for key, value in overrides.items():
        setattr(model.config, key, value)
    model.set_attn_implementation("eager")
    return model.eval()


ARCHS = ["bert", "roberta", "distilbert", "gpt2", "gpt2-unscaled", "gpt2-layer-scaled",
         "gpt2-unscaled-layer-scaled", "gpt2-upcast", "llama", "llama-linear", "llama-llama3", "qwen2", "mistral"]


def _lm(kind, folder):
    tok = _tok(folder)
    tok.model_max_length = 64  # RoBERTa's position table has 2 extra rows (padding_idx offset)
    return from_pretrained_objects(_build(kind), tok, name=kind)


def _capture(model, spec, **inputs):
    """Run the model with hooks on the attention modules currently in place: (probs per layer, hidden per layer, output)."""
    probs, hidden = {}, {}
    with torch.no_grad(), Hooks() as hooks:
        for i, module in enumerate(attention_modules(model, spec)):
            hooks.forward(module, lambda m, a, out, i=i: probs.__setitem__(i, out[1]))
        for i, layer in enumerate(layer_modules(model, spec)):
            hooks.forward(layer, lambda m, a, out, i=i: hidden.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        output = model(**inputs)
    n = len(probs)
    return [probs[i] for i in range(n)], [hidden[i] for i in range(n)], output


# ---------------------------------------------------------------------------------------------
# Every architecture passes; every mutant fails where it applies
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ARCHS)
def test_every_architecture_passes_verification(kind, tokenizer_folder):
    lm = _lm(kind, tokenizer_folder)
    result = verify(lm)
    assert result.passed, result.to_json()
    assert result.max_abs_diff <= 1e-5
    assert len(result.per_layer) == lm.geometry.n_layers
    names = [c.name for c in result.cases]
    if lm.causal:
        assert names == ["sentence", "right-padded", "left-padded", "kv-cache", "max-length"]
    else:
        assert names == ["sentence", "right-padded", "sentence-pair", "max-length"]
    assert result.cases[-1].shape == [1, 64]  # min(model limit 64, 1024) tokens
    data = json.loads(json.dumps(result.to_json()))
    assert set(data) >= {"model", "passed", "max_abs_diff", "per_layer", "cases"}
    assert data["passed"] is True and len(data["per_layer"]) == lm.geometry.n_layers


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
@pytest.mark.parametrize("kind", ARCHS)
def test_every_mutant_fails_where_it_applies(kind, mutant, tokenizer_folder):
    lm = _lm(kind, tokenizer_folder)
    applies, why = mutant_applies(mutant, lm)
    if mutant in ("no-causal-mask", "causal-inverted") and not lm.causal:
        assert not applies and "decoder" in why
        return
    if mutant == "no-scale" and kind == "gpt2-unscaled":
        assert not applies  # nothing to remove: GPT-2 with scale_attn_weights=False has scale 1
        return
    assert applies
    result = verify(lm, mutant=mutant)
    assert not result.passed
    assert result.max_abs_diff > 1e-3
    if mutant == "no-padding-mask":  # only padded batches can show it
        failed = {c.name for c in result.cases if not c.passed}
        assert failed == ({"left-padded"} if lm.causal else {"right-padded"})


def test_unknown_mutant_is_a_clear_error(tokenizer_folder):
    lm = _lm("bert", tokenizer_folder)
    with pytest.raises(ProbeError, match="unknown mutant 'typo'"):
        verify(lm, mutant="typo")
    with pytest.raises(ProbeError, match="unknown mutant"):
        with swap_attention(lm, "typo"):
            pass


# ---------------------------------------------------------------------------------------------
# The swap itself
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["bert", "distilbert", "gpt2", "llama"])
def test_swap_holds_the_original_projections_and_restores(kind, tokenizer_folder):
    lm = _lm(kind, tokenizer_folder)
    originals = attention_modules(lm.model, lm.spec)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    ptrs = {k: v.data_ptr() for k, v in lm.model.state_dict().items()}
    with swap_attention(lm) as swapped:
        now = attention_modules(lm.model, lm.spec)
        assert all(isinstance(m, ReferenceAttention) for m in now)
        assert swapped.originals == originals
        for layer, (ref, orig) in enumerate(zip(now, originals)):
            for name, child in ref.named_children():
                assert child is getattr(orig, name)  # the same module object, not a copy
        # same parameter names and storage: nothing copied, renamed or preprocessed (F17)
        assert {k: v.data_ptr() for k, v in lm.model.state_dict().items()} == ptrs
    assert attention_modules(lm.model, lm.spec) == originals
    after = lm.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)

    with pytest.raises(RuntimeError, match="boom"):
        with swap_attention(lm):
            raise RuntimeError("boom")
    assert attention_modules(lm.model, lm.spec) == originals
    assert not lm.model.base_model._forward_pre_hooks and not lm.model.base_model._forward_hooks


def test_bert_output_projection_stays_outside(tokenizer_folder):
    lm = _lm("bert", tokenizer_folder)
    with swap_attention(lm) as swapped:
        assert sorted(n for n, _ in swapped.modules[0].named_children()) == ["key", "query", "value"]


def test_swapped_module_works_when_the_original_runs_sdpa(tokenizer_folder):
    """The reference returns probabilities whatever implementation the model is set to (F02)."""
    lm = _lm("llama", tokenizer_folder)
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    eager_probs, _, eager_out = _capture(lm.model, lm.spec, input_ids=ids, use_cache=False)
    lm.model.set_attn_implementation("sdpa")
    with swap_attention(lm):
        probs, _, out = _capture(lm.model, lm.spec, input_ids=ids, use_cache=False)
    assert len(probs) == 2 and all(p.shape == (1, 4, 6, 6) for p in probs)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(probs, eager_probs))
    assert torch.allclose(out.logits, eager_out.logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "mistral"])
def test_generate_with_left_padding_is_unchanged(kind, tokenizer_folder):
    """generate() runs through the swap (2D mask, position ids and cache handled each step)."""
    lm = _lm(kind, tokenizer_folder)
    lm.tokenizer.padding_side = "left"
    enc = lm.tokenizer(["Hello there my good friend", "A b"], return_tensors="pt", padding=True,
                       return_token_type_ids=False)
    assert not bool(enc["attention_mask"].all())
    original = lm.model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=0)
    with swap_attention(lm):
        swapped = lm.model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert original.shape == (2, enc["input_ids"].shape[1] + 12)
    assert torch.equal(swapped, original)


def test_mistral_sliding_window_is_applied(tokenizer_folder):
    lm = _lm("mistral", tokenizer_folder)  # sliding_window = 8
    ids = torch.randint(1000, 5000, (1, 20))
    _, _, original = _capture(lm.model, lm.spec, input_ids=ids, use_cache=False)
    with swap_attention(lm) as swapped:
        assert [m.window for m in swapped.modules] == [8, 8]
        probs, _, out = _capture(lm.model, lm.spec, input_ids=ids, use_cache=False)
        assert torch.allclose(out.logits, original.logits, atol=1e-5, rtol=0)
        assert torch.count_nonzero(probs[0][0, :, 19, :12]) == 0  # key 12 is the oldest of query 19's window
        assert bool((probs[0][0, :, 19, 12:] > 0).all())
        for m in swapped.modules:
            m.window = None  # without the window the outputs change
        _, _, no_window = _capture(lm.model, lm.spec, input_ids=ids, use_cache=False)
    assert not torch.allclose(no_window.logits, original.logits, atol=1e-3)


def test_verify_runs_eager_for_the_original_and_restores_sdpa(tokenizer_folder):
    lm = _lm("bert", tokenizer_folder)
    lm.model.set_attn_implementation("sdpa")
    result = verify(lm, cases=["sentence", "right-padded"])
    assert result.passed and [c.name for c in result.cases] == ["sentence", "right-padded"]
    assert any("switched attention implementation from 'sdpa' to 'eager'" in n for n in result.notes)
    assert lm.model.config._attn_implementation == "sdpa"
    with pytest.raises(ProbeError, match="unknown case"):
        verify(lm, cases=["kv-cache"])  # decoders only


# ---------------------------------------------------------------------------------------------
# CASES.md
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_f01_unpadded_decoder_weights_above_diagonal_are_zero(kind, tokenizer_folder):
    lm = _lm(kind, tokenizer_folder)
    ids = torch.tensor([[101, 1996, 4937, 2938, 2006, 102]])  # 6 tokens, no padding, no mask given
    eager_probs, eager_hidden, eager_out = _capture(lm.model, lm.spec, input_ids=ids, use_cache=False)
    with swap_attention(lm):
        probs, hidden, out = _capture(lm.model, lm.spec, input_ids=ids, use_cache=False)
    above = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    for p, e in zip(probs, eager_probs):
        assert p.shape == (1, 4, 6, 6)
        assert torch.count_nonzero(p[..., above]) == 0  # exactly 0 above the diagonal
        assert torch.allclose(p, e, atol=1e-5, rtol=0)
    for h, e in zip(hidden, eager_hidden):
        assert torch.allclose(h, e, atol=1e-5, rtol=0)
    assert torch.allclose(out.logits, eager_out.logits, atol=1e-5, rtol=0)


def test_f04_mask_conventions_give_identical_probabilities():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]])
    forms = {
        "int": keep,
        "float01": keep.float(),
        "bool": keep.bool(),
        "additive-inf": torch.zeros(2, 5).masked_fill(keep == 0, -math.inf),
        "additive-finfo": torch.zeros(2, 5).masked_fill(keep == 0, torch.finfo(torch.float32).min),
        "additive-finfo-fp16": torch.zeros(2, 5, dtype=torch.float16).masked_fill(keep == 0, torch.finfo(torch.float16).min),
    }
    results = {name: attention(q, k, v, mask=m) for name, m in forms.items()}
    y0, p0 = results["bool"]
    for name, (y, p) in results.items():
        assert torch.equal(p, p0), name
        assert torch.equal(y, y0), name
    masked = (keep == 0)[:, None, None, :].expand_as(p0)
    assert torch.count_nonzero(p0[masked]) == 0  # masked keys get exactly 0
    assert torch.allclose(p0.sum(-1), torch.ones(2, 3, 5), atol=1e-6)
    # the same masks as [batch, query, key] and [batch, 1, query, key]
    y3, p3 = attention(q, k, v, mask=keep[:, None, :].expand(2, 5, 5))
    assert torch.equal(p3, p0)


@pytest.mark.parametrize("bad", [
    torch.tensor([[1.0, 0.5, 1.0]]),  # fractional
    torch.tensor([[0.0, -1e4, 0.0]]),  # additive with a made-up constant
    torch.tensor([[0.0, -1e9, 0.0]]),
    torch.tensor([[2.0, 0.0, 1.0]]),
    torch.zeros(1, 3),  # ambiguous: additive keep-all or 0/1 keep-none
    torch.tensor([[0.0, 1.0, -math.inf]]),  # mixed conventions
])
def test_f04_other_float_masks_are_rejected(bad):
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="mask"):
        attention(q, q, q, mask=bad)
    with pytest.raises(MaskError):
        as_keep_mask(bad)


def test_f04_integer_masks_must_be_zero_one():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(MaskError, match="only 0"):
        attention(q, q, q, mask=torch.tensor([[1, 2, 0]]))
    with pytest.raises(MaskError, match="covers 2 keys but there are 3"):
        attention(q, q, q, mask=torch.tensor([[1, 1]]))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_f05_changing_token_5_leaves_positions_0_to_4_bit_identical(kind, tokenizer_folder):
    lm = _lm(kind, tokenizer_folder)
    ids = torch.tensor([[101, 1996, 4937, 2938, 2006, 1996, 13523, 102]])  # 8 tokens
    changed = ids.clone()
    changed[0, 5] = 3899
    with swap_attention(lm):
        p1, h1, o1 = _capture(lm.model, lm.spec, input_ids=ids, use_cache=False)
        p2, h2, o2 = _capture(lm.model, lm.spec, input_ids=changed, use_cache=False)
    assert torch.equal(o1.logits[:, :5], o2.logits[:, :5])
    assert not torch.equal(o1.logits[:, 5:], o2.logits[:, 5:])
    for a, b in zip(p1, p2):
        assert torch.equal(a[:, :, :5], b[:, :, :5])  # rows 0-4, every key, every head
    for a, b in zip(h1, h2):
        assert torch.equal(a[:, :5], b[:, :5])
    # the inverted-polarity bug is caught by this very check
    with swap_attention(lm, "causal-inverted"):
        _, _, m1 = _capture(lm.model, lm.spec, input_ids=ids, use_cache=False)
        _, _, m2 = _capture(lm.model, lm.spec, input_ids=changed, use_cache=False)
    assert not torch.equal(m1.logits[:, :5], m2.logits[:, :5])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["gpt2", "gpt2-upcast", "llama"])
def test_f06_half_precision_left_padding_has_no_nan(kind, dtype, tokenizer_folder):
    model = _build(kind).to(dtype)
    lm = from_pretrained_objects(model, _tok(tokenizer_folder), name=kind)
    tok = lm.tokenizer
    tok.padding_side = "left"
    enc = tok(["The cat sat on the mat.", "A much longer sentence with quite a few more tokens in it."],
              return_tensors="pt", padding=True)
    tok.padding_side = "right"
    keep = enc["attention_mask"].bool()
    assert not keep.all()  # there is left padding
    try:
        with swap_attention(lm):
            probs, hidden, out = _capture(lm.model, lm.spec, **enc, use_cache=False)
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
    # the fill value is the dtype's own minimum, set (not added), so a fully masked row stays finite
    q = torch.full((1, 1, 2, 4), 100.0, dtype=dtype)
    y, p = attention(q, q, q, mask=torch.tensor([[[[True, False], [False, False]]]]))
    assert torch.isfinite(p).all() and torch.isfinite(y).all()
    assert p[0, 0, 1].tolist() == [0.0, 0.0] and p[0, 0, 0].tolist() == [1.0, 0.0]


def test_f06_bf16_verification_passes_with_the_documented_tolerance(tokenizer_folder):
    model = _build("llama")
    inv_freq = model.model.rotary_emb.inv_freq.clone()
    model = model.to(torch.bfloat16)
    # from_pretrained(dtype=bfloat16) keeps RoPE's inv_freq buffer in float32; .to() would round it to
    # bfloat16 and the model's own RoPE would lose precision. Keep it as loading does.
    model.model.rotary_emb.inv_freq = inv_freq
    lm = from_pretrained_objects(model, _tok(tokenizer_folder), name="llama-bf16")
    result = verify(lm, atol=BF16_ATOL)
    assert result.passed and result.dtype == "bfloat16"
    assert result.max_abs_diff <= BF16_ATOL


def test_f07_fully_masked_row_gives_zero_not_nan():
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 2, :] = False  # query 2 sees no key
    y, p = attention(q, k, v, mask=mask)
    assert not torch.isnan(p).any() and not torch.isnan(y).any()
    assert torch.count_nonzero(p[:, :, 2]) == 0 and torch.count_nonzero(y[:, :, 2]) == 0
    assert torch.allclose(p[:, :, [0, 1, 3]].sum(-1), torch.ones(1, 2, 3), atol=1e-6)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # the oracle, test only
    assert torch.allclose(y, torch.nan_to_num(sdpa), atol=1e-6)
    # an additive mask and the causal mask together leave the same row empty
    add = torch.zeros(1, 1, 4, 4).masked_fill(~mask, -math.inf)
    y2, p2 = attention(q, k, v, mask=add, causal=True)
    assert torch.count_nonzero(p2[:, :, 2]) == 0 and not torch.isnan(y2).any()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_f09_kv_cache_steps(kind, tokenizer_folder):
    lm = _lm(kind, tokenizer_folder)
    torch.manual_seed(3)
    ids = torch.randint(1000, 5000, (2, 9))
    full_probs, _, full_out = _capture(lm.model, lm.spec, input_ids=ids, use_cache=False)

    def incremental():
        """A 6-token prefix, then 3 one-token steps with the cache: (probs per step, logits per step)."""
        cache = DynamicCache(config=lm.model.config)
        _capture(lm.model, lm.spec, input_ids=ids[:, :6], attention_mask=torch.ones(2, 6, dtype=torch.long),
                 cache=cache, use_cache=True)
        steps, logits = [], []
        for step in range(1, 4):
            end = 6 + step
            probs, _, out = _capture(lm.model, lm.spec, input_ids=ids[:, end - 1:end],
                                     attention_mask=torch.ones(2, end, dtype=torch.long), cache=cache, use_cache=True)
            steps.append(probs)
            logits.append(out.logits)
        return steps, torch.cat(logits, 1), cache

    _, original_logits, _ = incremental()
    with swap_attention(lm):
        steps, logits, cache = incremental()
        for step, probs in enumerate(steps, start=1):
            assert [tuple(p.shape) for p in probs] == [(2, 4, 1, 6 + step)] * lm.geometry.n_layers  # [batch, heads, 1, 6 + k]
            for layer, p in enumerate(probs):
                row = full_probs[layer][:, :, 5 + step, : 6 + step]  # the matching row of one full pass
                assert torch.allclose(p[:, :, 0], row, atol=1e-5, rtol=0)
        assert torch.allclose(logits, original_logits, atol=1e-5, rtol=0)  # the original, step by step
        # against one full pass: one-row and full-sequence GEMMs round differently in fp32 (logits up
        # to ~12 with these weights; the original model differs from its own full pass just as much)
        assert torch.allclose(logits, full_out.logits[:, 6:], atol=1e-4, rtol=0)

        # a mask covering only the new token is a clear error, not a shape error deep inside
        with pytest.raises(MaskError, match=r"attention_mask has 1 columns but the keys are 10 \(9 cached \+ 1 new"):
            lm.model(input_ids=ids[:, :1], attention_mask=torch.ones(2, 1, dtype=torch.long), cache=cache,
                     use_cache=True)
    assert torch.allclose(original_logits, full_out.logits[:, 6:], atol=1e-4, rtol=0)


def test_f09_reference_module_called_directly_checks_mask_length():
    model = _build("gpt2")
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


def test_f14_every_head_of_a_12_head_encoder_matches(tokenizer_folder):
    torch.manual_seed(4)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=96, num_hidden_layers=3, num_attention_heads=12,
                     intermediate_size=128, initializer_range=0.3)
    lm = from_pretrained_objects(BertModel(cfg).eval(), _tok(tokenizer_folder), name="bert-12")
    ids = torch.randint(1000, 5000, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    original, _, _ = _capture(lm.model, lm.spec, input_ids=ids, attention_mask=mask)
    with swap_attention(lm):
        swapped, _, _ = _capture(lm.model, lm.spec, input_ids=ids, attention_mask=mask)
    for layer, (a, b) in enumerate(zip(swapped, original)):
        assert a.shape == (2, 12, 7, 7)
        for head in range(12):
            assert torch.allclose(a[:, head], b[:, head], atol=1e-6, rtol=0), (layer, head)
    with swap_attention(lm, "merge-without-transpose"):
        broken, _, _ = _capture(lm.model, lm.spec, input_ids=ids, attention_mask=mask)
    assert torch.allclose(broken[0], original[0], atol=1e-6)  # layer 0's probabilities are still right ...
    assert not torch.allclose(broken[1], original[1], atol=1e-3)  # ... the mixed-up output shows from layer 1


def test_f15_scale_is_one_over_sqrt_d_head(tokenizer_folder):
    torch.manual_seed(5)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=768, num_hidden_layers=2, num_attention_heads=12,
                     intermediate_size=64, max_position_embeddings=32, initializer_range=0.1)
    lm = from_pretrained_objects(BertModel(cfg).eval(), _tok(tokenizer_folder), name="bert-768")
    with swap_attention(lm) as swapped:
        assert swapped.modules[0].d_head == 64
        assert swapped.modules[0].scale == 1 / math.sqrt(64) == 0.125
    assert verify(lm).passed
    with swap_attention(lm, "scale-d-model") as swapped:
        assert swapped.modules[0].scale == pytest.approx(1 / math.sqrt(768), rel=1e-12)
    result = verify(lm, mutant="scale-d-model")
    assert not result.passed
    assert result.per_layer[0].attn_max_abs > 1e-3


@pytest.mark.parametrize("kind", ["gpt2", "llama", "distilbert"])
def test_f17_raw_outputs_match_without_preprocessing(kind, tokenizer_folder):
    lm = _lm(kind, tokenizer_folder)
    enc = lm.tokenizer(["The cat sat on the mat.", "Dogs bark."], return_tensors="pt", padding=True)
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if lm.causal:
        inputs["use_cache"] = False
    _, hidden, out = _capture(lm.model, lm.spec, **inputs)
    with swap_attention(lm):
        _, hidden2, out2 = _capture(lm.model, lm.spec, **inputs)
    keep = enc["attention_mask"].bool()
    final = "logits" if lm.causal else "last_hidden_state"
    assert torch.allclose(getattr(out2, final)[keep], getattr(out, final)[keep], atol=1e-5, rtol=0)
    for a, b in zip(hidden2, hidden):
        assert torch.allclose(a[keep], b[keep], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# RoPE from scratch
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["llama", "llama-linear", "llama-llama3"])
def test_rope_frequencies_match_the_model(kind):
    model = _build(kind)
    rotary = model.model.rotary_emb
    ours = rope_inv_freq(model.config, 16)
    assert ours.shape == (8,)
    assert torch.allclose(ours, rotary.inv_freq, rtol=1e-6, atol=0)
    if kind == "llama-llama3":  # the three regimes are all present in this tiny config
        base = rope_inv_freq(_build("llama").config, 16)
        ratio = (base / ours).tolist()  # wavelengths 2*pi*10000^(i/8): 6.3, 20, 63, ... tokens
        assert ratio[0] == 1.0  # shorter than original_max / high_freq_factor = 8 tokens: unchanged
        assert 1.0 < ratio[1] < 8.0  # between 8 and 32 tokens: interpolated
        assert ratio[2:] == pytest.approx([8.0] * 6)  # longer than 32 tokens: divided by factor 8


def test_unimplemented_rope_type_falls_back_with_a_note(tokenizer_folder):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                      rope_scaling={"rope_type": "dynamic", "factor": 2.0}, initializer_range=0.3)
    lm = from_pretrained_objects(LlamaForCausalLM(cfg).eval(), _tok(tokenizer_folder), name="llama-dynamic")
    result = verify(lm, cases=["sentence", "right-padded"])
    assert result.passed
    assert any("'dynamic' is not implemented from scratch" in n for n in result.notes)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def test_cli_verify_on_a_local_folder(tmp_path, tokenizer_folder):
    model = _build("gpt2")
    model.save_pretrained(tmp_path)
    _tok(tokenizer_folder).save_pretrained(tmp_path)
    runner = CliRunner()
    ok = runner.invoke(verify_command, ["--model", str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    assert "PASS: max abs diff" in ok.output and "layer" in ok.output and ok.output.count("PASS") >= 3 + 5
    bad = runner.invoke(verify_command, ["--model", str(tmp_path), "--mutant", "no-causal-mask", "--json"])
    assert bad.exit_code == 1
    data = json.loads(bad.output)
    assert data["passed"] is False and data["mutant"] == "no-causal-mask" and len(data["per_layer"]) == 3
    encoder = tmp_path / "bert"
    _build("bert").save_pretrained(encoder)
    _tok(tokenizer_folder).save_pretrained(encoder)
    moot = runner.invoke(verify_command, ["--model", str(encoder), "--mutant", "causal-inverted"])
    assert moot.exit_code == 1
    assert moot.output.strip() == f"Error: mutant 'causal-inverted' cannot change {encoder}: causal-inverted applies to decoders only"
    missing = runner.invoke(verify_command, ["--model", str(tmp_path / "nope")])
    assert missing.exit_code == 1
    assert missing.output.startswith("Error: ") and len(missing.output.strip().splitlines()) == 1
    for option, value in (("--atol", "-1"), ("--rtol", "-0.5"), ("--atol", "nan")):
        bad_tol = runner.invoke(verify_command, ["--model", str(tmp_path), option, value])
        assert bad_tol.exit_code == 1
        assert bad_tol.output.strip().startswith(f"Error: {option} must be a finite number >= 0")
        assert "PASS" not in bad_tol.output and "FAIL" not in bad_tol.output  # nothing ran


# ---------------------------------------------------------------------------------------------
# Real embedded models
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("alias", ["minilm", "smollm2"])
def test_embedded_models_pass_verification(alias):
    from probe.models import load_model

    if embedded_folder(alias) is None:
        pytest.skip(f"embedded model {alias} not installed")
    result = verify(load_model(alias))
    assert result.passed, result.to_json()
    assert result.max_abs_diff <= 1e-5
    assert result.cases[-1].shape == [1, 512 if alias == "minilm" else 1024]
