"""probe.causal.gates: head gates on the output projection's input (a closed head's output is
really removed: no backend ignores the gate, as fast backends ignored head masks), under eager and
sdpa attention, differentiable, per sequence, and always removed."""

from __future__ import annotations

import pytest
import torch

from conftest import hook_snapshot, tiny_model
from probe.architectures import site_outputs
from probe.capture.maps import encode, forward
from probe.causal.gates import gated, ones
from probe.pruning.removal import remove_heads

TEXTS = ["The cat sat on the mat.", "A dog barked at the moon tonight."]


def _o_inputs(lm, layer: int):
    """Record the input one layer's output projection computes with (a forward hook sees the
    arguments as every pre-hook, the gates included, left them)."""
    seen = []
    o = [o for _, o in site_outputs(lm.model, lm.spec)][layer]
    handle = o.register_forward_hook(lambda m, args, out: seen.append(args[0].detach().clone()))
    return seen, handle


def _out(lm, batch):
    out = forward(lm, batch)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_masked_head_contributes_zero_under_eager_and_sdpa(kind):
    """head 3 of layer 0 masked: its slice of the output projection's input is exactly 0 under
    both implementations; both outputs agree with each other and differ from the unmasked output."""
    lm = tiny_model(kind)
    batch = encode(lm, TEXTS)
    d = lm.geometry.d_head
    mask = ones(lm)
    mask[0, 3] = 0.0
    outs = {}
    for impl in ("eager", "sdpa"):
        lm.model.set_attn_implementation(impl)
        with torch.no_grad():
            plain = _out(lm, batch)
            seen, handle = _o_inputs(lm, 0)
            try:
                with gated(lm, mask):
                    outs[impl] = _out(lm, batch)
            finally:
                handle.remove()
        x = seen[-1]  # [batch, T, heads * d_head] (gated() first checks on its own short input that gates act)
        assert x[..., 3 * d:4 * d].eq(0).all()
        assert x[..., :3 * d].abs().sum() > 0
        real = batch.real
        assert (outs[impl] - plain)[real].abs().max() > 1e-3  # the head mattered
    lm.model.set_attn_implementation("eager")
    torch.testing.assert_close(outs["eager"][batch.real], outs["sdpa"][batch.real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["bert", "phi3"])
def test_all_ones_gates_change_nothing_and_hooks_go_away(kind):
    """(Every family: tests/test_pruning_removal.py gates each one.)"""
    lm = tiny_model(kind)
    batch = encode(lm, TEXTS)
    before = hook_snapshot(lm.model)
    with torch.no_grad():
        plain = _out(lm, batch)
        with gated(lm, ones(lm)):
            same = _out(lm, batch)
    assert torch.equal(plain, same)
    assert hook_snapshot(lm.model) == before
    with pytest.raises(RuntimeError), gated(lm, ones(lm)):
        raise RuntimeError("boom")
    assert hook_snapshot(lm.model) == before


def test_gates_are_differentiable_and_per_sequence_gates_separate_sequences():
    lm = tiny_model("bert")
    batch = encode(lm, TEXTS)
    L, H = lm.geometry.n_layers, lm.geometry.n_heads
    g = torch.ones(2, L, H, requires_grad=True)
    with gated(lm, g):
        out = _out(lm, batch)
    loss0 = out[0][batch.real[0]].sum()  # depends on sequence 0 only
    (grad,) = torch.autograd.grad(loss0, g)
    assert grad[0].abs().sum() > 0
    assert grad[1].eq(0).all()  # sequence 1's gates do not touch sequence 0
    # a [batch, layers, heads] gate equal to a [layers, heads] one gives the same output
    mask = ones(lm)
    mask[1, 2] = 0.0
    with torch.no_grad():
        with gated(lm, mask):
            a = _out(lm, batch)
        with gated(lm, mask.expand(2, L, H).clone()):
            b = _out(lm, batch)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_gates_follow_original_numbering_on_a_pruned_model():
    """On a model whose head 1 of layer 0 is gone, gating original head 2 of layer 0 hits the slot
    that holds head 2 (slot 1), not the head now in position 2."""
    lm = tiny_model("bert")
    batch = encode(lm, TEXTS)
    d = lm.geometry.d_head
    remove_heads(lm, {0: [1]})
    mask = ones(lm)
    assert mask[0].tolist() == [1, 0, 1, 1]
    mask[0, 2] = 0.0
    seen, handle = _o_inputs(lm, 0)
    try:
        with torch.no_grad(), gated(lm, mask):
            _out(lm, batch)
    finally:
        handle.remove()
    x = seen[-1]  # the last pass is this test's (gated() first checks on its own input that gates act)
    assert x.shape[-1] == 3 * d
    assert x[..., d:2 * d].eq(0).all() and x[..., :d].abs().sum() > 0 and x[..., 2 * d:].abs().sum() > 0
