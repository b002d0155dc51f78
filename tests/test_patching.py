"""probe.effects.patching: activation patching of each head's z_h (the output projection's input slice):
the invariants (own value -> 0, clean = corrupted -> 0 without dividing by the zero gap, the whole residual
stream before the last layer -> 1), grouped KV heads patched per query head, a finite-difference check of one
head's interpolated patch, and the pair file's errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_model
from probe.architectures import site_outputs
from probe.capture.intervene import intervening
from probe.effects.patching import (
    MIN_GAP,
    Pair,
    builtin_pairs,
    encode_pairs,
    head_logit_diffs,
    logit_diffs,
    parse_pairs,
    patch_heads,
    patch_residual,
    patched_pass,
    run_z,
)
from probe.errors import InputError

PAIRS = [Pair("The cat and the dog ran to", "The dog and the cat ran to", " the", " a"),
         Pair("When Mary and John went to the store, John gave a drink to",
              "When Mary and John went to the store, Mary gave a drink to", " Mary", " John")]


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")  # 2 layers x 4 query heads, 2 key/value heads


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gpt_neox", "bloom", "gemma2"])
def test_patching_with_the_corrupted_runs_own_value_is_exactly_zero(kind):
    """Each pass continues from the patched layer's recorded input (BLOOM's ALiBi bias is [batch x heads]
    and is repeated with the copies)."""
    lm = tiny_model(kind)
    enc = encode_pairs(lm, PAIRS)
    jobs = [(layer, head, where) for where in ("all", "last") for layer in range(2) for head in range(4)]
    patched, base, _ = head_logit_diffs(lm, enc, jobs, run="corrupted", donor="corrupted", heads_per_pass=3)
    assert np.array_equal(patched, base)  # 16 jobs in passes of 3: the last pass is padded to the same shape


def test_clean_equal_to_corrupted_gives_zero_and_a_note_instead_of_dividing(llama):
    same = [Pair(p.clean, p.clean, p.answer, p.wrong) for p in PAIRS]
    frame = patch_heads(llama, same, heads_per_pass=5)
    assert (frame[["effect", "effect_last", "raw", "raw_last"]].to_numpy() == 0).all()
    assert frame.attrs["normalized"] is False
    assert frame.attrs["ld_clean"] == frame.attrs["ld_corrupted"]
    assert f"< {MIN_GAP}" in frame.attrs["notes"][0] and "raw" in frame.attrs["notes"][0]


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bloom"])
def test_residual_stream_patched_before_the_last_layer_restores_everything(kind):
    lm = tiny_model(kind)
    assert patch_residual(lm, PAIRS, lm.geometry.n_layers - 1) == 1.0


def _manual_patch_ld(lm, enc, layer: int, head: int, positions: torch.Tensor) -> float:
    """Mean LD of the corrupted run with columns [head * d_head, (head + 1) * d_head) of ``layer``'s
    output-projection input taken from the clean run at ``positions`` ([pairs, T] bool): an
    independent hook, one pass of the plain batch (under the same attention function as the
    patching: probe's, where the model calls the attention interface)."""
    dh = lm.geometry.d_head
    o = [o for _, o in site_outputs(lm.model, lm.spec)][layer]
    clean_z = run_z(lm, enc.clean, enc.mask)[1][layer]

    def hook(module, args):
        x = args[0].clone()
        cols = slice(head * dh, (head + 1) * dh)
        x[..., cols] = torch.where(positions[..., None], clean_z[..., cols], x[..., cols])
        return (x,)

    handle = o.register_forward_pre_hook(hook)
    try:
        with torch.no_grad(), intervening(lm):
            logits = lm.model(input_ids=enc.corrupted, attention_mask=enc.mask, use_cache=False).logits
    finally:
        handle.remove()
    return float(logit_diffs(logits, enc)[0].mean())


def test_grouped_kv_heads_are_patched_per_query_head(llama):
    """Query heads 0 and 1 read key/value head 0; each has its own effect, equal to an independent
    patch of its own d_head columns (all positions and the last one)."""
    lm = llama
    lm.model.double()
    try:
        enc = encode_pairs(lm, PAIRS)
        frame = patch_heads(lm, PAIRS, heads_per_pass=3)
        ld_c, ld_x = frame.attrs["ld_clean"], frame.attrs["ld_corrupted"]
        last = torch.nn.functional.one_hot(enc.last, enc.mask.shape[1]).bool()
        for head in (0, 1):
            row = frame[(frame["layer"] == 0) & (frame["head"] == head)].iloc[0]
            for col, where in (("effect", enc.mask.bool()), ("effect_last", last)):
                expected = (_manual_patch_ld(lm, enc, 0, head, where) - ld_x) / (ld_c - ld_x)
                assert row[col] == pytest.approx(expected, abs=1e-10)
        h0, h1 = (frame[(frame["layer"] == 0) & (frame["head"] == h)].iloc[0]["effect"] for h in (0, 1))
        assert abs(h0 - h1) > 1e-3
    finally:
        lm.model.float()


def test_finite_difference_of_one_heads_interpolated_patch():
    """LD(alpha) with z_h -> z_h + alpha (z_h^clean - z_h): the central difference of the patcher's
    LD at +-eps equals autograd's dLD/dalpha at 0, and alpha = 1 reproduces the patch. GPT-2 in
    float64 (LLaMA's eager softmax and RMSNorm run in float32 whatever the weights, which puts 1e-7
    noise into LD(alpha) and so 0.1 into a difference quotient at eps = 1e-6)."""
    lm = tiny_model("gpt2")
    lm.model.double()
    enc = encode_pairs(lm, PAIRS)
    layer, head, dh = 0, 2, lm.geometry.d_head
    clean_z = run_z(lm, enc.clean, enc.mask)[1]
    sel = torch.zeros(len(enc), enc.mask.shape[1], lm.geometry.n_heads, dtype=torch.bool)
    sel[:, :, head] = enc.mask.bool()

    def ld(alpha):
        logits = patched_pass(lm, enc.corrupted, enc.mask, {layer: sel}, clean_z, alpha=alpha)
        return float(logit_diffs(logits, enc)[0].mean())

    eps = 1e-5
    fd = (ld(eps) - ld(-eps)) / (2 * eps)
    alpha = torch.zeros((), dtype=torch.float64, requires_grad=True)
    o = [o for _, o in site_outputs(lm.model, lm.spec)][layer]

    def hook(module, args):
        x = args[0]
        cols = slice(head * dh, (head + 1) * dh)
        delta = torch.zeros_like(x)
        delta[..., cols] = (clean_z[layer][..., cols] - x[..., cols].detach()) * enc.mask[..., None]
        return (x + alpha * delta,)

    handle = o.register_forward_pre_hook(hook)
    try:
        logits = lm.model(input_ids=enc.corrupted, attention_mask=enc.mask, use_cache=False).logits
        logit_diffs(logits, enc)[0].mean().backward()
    finally:
        handle.remove()
    assert fd == pytest.approx(float(alpha.grad), rel=1e-6)
    frame = patch_heads(lm, PAIRS)
    row = frame[(frame["layer"] == layer) & (frame["head"] == head)].iloc[0]
    assert (ld(1.0) - frame.attrs["ld_corrupted"]) == pytest.approx(row["raw"], abs=1e-10)


def test_noising_is_one_minus_the_clean_runs_restored_share(llama):
    """Noising: the clean run with the corrupted z_h; effect = (LD_c - LD_p) / (LD_c - LD_x), = -raw / gap."""
    frame = patch_heads(llama, PAIRS, direction="noise")
    gap = frame.attrs["ld_clean"] - frame.attrs["ld_corrupted"]
    np.testing.assert_allclose(frame["effect"], -frame["raw"] / gap, rtol=1e-12)
    assert frame.attrs["direction"] == "noise"


def test_unequal_token_counts_name_both_prompts(llama):
    with pytest.raises(InputError, match=r"pair 1: .*different token counts \(\d+ and \d+\).*cat.*big dog"):
        encode_pairs(llama, [Pair("The cat ran to", "The big dog ran quickly to", " the", " a")])


def test_an_answer_of_two_tokens_is_refused(llama):
    with pytest.raises(InputError, match=r"pair 1: the answer ' she' is 2 tokens; answers must be one token each"):
        encode_pairs(llama, [Pair("The cat ran to", "The dog ran to", " she", " a")])


def test_an_answer_that_is_the_wrong_answer_is_refused(llama):
    """answer and wrong of one token: logit(answer) - logit(wrong) is 0 in the clean, corrupted and every patched run,
    so every effect was 0 (a note said the pairs barely separate); now one line naming the pair and the token. The
    same token written the same way only: ' on' and 'on' are two tokens and pass."""
    with pytest.raises(InputError, match=r"pair 2: the answer ' a' and the wrong answer ' a' are the same token "
                                         r"\(id \d+\); their logit difference is 0"):
        encode_pairs(llama, [Pair("The cat ran to", "The dog ran to", " the", " a"),
                             Pair("The cat ran to", "The dog ran to", " a", " a")])
    ids = llama.tokenizer([" a", "a"], add_special_tokens=False)["input_ids"]
    assert ids[0] != ids[1] and len(ids[0]) == len(ids[1]) == 1
    encode_pairs(llama, [Pair("The cat ran to", "The dog ran to", " a", "a")])


def test_pair_file_fields_and_the_builtin_set():
    assert parse_pairs("clean\tcorrupted\tanswer\twrong\na b\tc d\t x\t y\n", "f") == [Pair("a b", "c d", " x", " y")]
    with pytest.raises(InputError, match=r"f, line 2: 3 tab-separated fields"):
        parse_pairs("a\tb\tc\td\na\tb\tc\n", "f")
    pairs = builtin_pairs()
    assert 16 <= len(pairs) <= 24
    assert all(p.clean != p.corrupted and p.answer.startswith(" ") for p in pairs)
