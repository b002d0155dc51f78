"""probe's attention function inside transformers' AttentionInterface (probe/capture/interface.py): the maths
against independent computations, the keyword arguments it refuses, the listener registry, row blocks
and the implementation switch of ``measuring``."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import tolerance
from probe.capture import interface
from probe.capture.hooks import Hooks, ModelState, measuring
from probe.capture.interface import HARMLESS, NAME, install, listen, probe_attention, row_blocks
from probe.errors import InterfaceError


class Module(nn.Module):
    """A stand-in attention module (the function reads only ``training``)."""


def qkv(B=2, H=4, KV=2, T=5, d=8, dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, d, generator=g), torch.randn(B, KV, T, d, generator=g),
            torch.randn(B, KV, T, dv or d, generator=g))


def direct(q, k, v, keep, scale, bias=None, sinks=None):
    """softmax(q k^T * scale + bias, masked) (with one sink logit per head) written out, float64."""
    H = q.shape[1]
    k = k.double().repeat_interleave(H // k.shape[1], 1)
    v = v.double().repeat_interleave(H // v.shape[1], 1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k) * scale
    if bias is not None:
        s = s + bias.double()
    s = s.masked_fill(~keep, -math.inf)
    if sinks is not None:
        e = torch.exp(s - s.amax(-1, keepdim=True))
        sink = torch.exp(sinks.double()[None, :, None] - s.amax(-1))
        p = e / (e.sum(-1) + sink)[..., None]
    else:
        p = torch.softmax(s, -1)
    return p, torch.einsum("bhqk,bhkd->bqhd", p, v)


def padded_causal(B, T, lengths):
    keep = torch.ones(B, 1, T, T, dtype=torch.bool).tril()
    for b, n in enumerate(lengths):
        keep[b, :, :, n:] = False
    return keep


def test_grouped_causal_padded_attention_is_the_formula():
    q, k, v = qkv(dv=6)  # value heads narrower than query/key heads (MLA)
    keep = padded_causal(2, 5, [5, 3])
    out, probs = probe_attention(Module().eval(), q, k, v, keep, scaling=0.3)
    p, o = direct(q, k, v, keep, 0.3)
    assert out.shape == (2, 5, 4, 6) and probs.shape == (2, 4, 5, 5)
    torch.testing.assert_close(probs.double(), p, **tolerance("probability"))
    torch.testing.assert_close(out.double(), o, **tolerance("scaled"))
    assert bool((probs[1, :, :, 3:] == 0).all())  # padded keys: exactly 0


def test_additive_mask_gives_the_same_as_boolean():
    q, k, v = qkv()
    keep = padded_causal(2, 5, [4, 2])
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    a = probe_attention(Module(), q, k, v, keep, scaling=0.25)
    b = probe_attention(Module(), q, k, v, additive, scaling=0.25)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_position_bias_softcap_and_sinks():
    q, k, v = qkv(KV=4)
    keep = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    bias = torch.randn(1, 4, 5, 5, generator=torch.Generator().manual_seed(1))
    _, probs = probe_attention(Module(), q, k, v, keep, scaling=1.0, position_bias=bias)
    torch.testing.assert_close(probs.double(), direct(q, k, v, keep, 1.0, bias)[0], **tolerance("probability"))
    _, capped = probe_attention(Module(), q, k, v, keep, scaling=1.0, softcap=2.0)
    s = (q @ k.transpose(-1, -2)).double()
    torch.testing.assert_close(capped.double(), torch.softmax(2.0 * torch.tanh(s / 2.0), -1),
                               **tolerance("probability"))
    sinks = torch.tensor([0.0, 1.0, -1.0, 3.0])
    _, sunk = probe_attention(Module(), q, k, v, keep, scaling=0.5, s_aux=sinks)
    torch.testing.assert_close(sunk.double(), direct(q, k, v, keep, 0.5, sinks=sinks)[0], **tolerance("probability"))
    assert bool((sunk.sum(-1) < 1).all())  # the sink takes a share of every row


def test_a_sink_logit_per_head_and_query_row_is_the_formula_whole_and_in_row_blocks():
    """Inkling 2's sinks: [batch, heads, query, 1], a logit projected from each query token."""
    q, k, v = qkv(T=7, KV=4)
    keep = padded_causal(2, 7, [7, 4])
    sinks = torch.randn(2, 4, 7, 1, generator=torch.Generator().manual_seed(3))
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * 0.5
    s = torch.cat([s.masked_fill(~keep, -math.inf), sinks.double()], -1)  # the sink as one more key
    expected = torch.softmax(s, -1)[..., :-1]
    module = Module()
    out, probs = probe_attention(module, q, k, v, keep, scaling=0.5, sinks=sinks)
    torch.testing.assert_close(probs.double(), expected, **tolerance("probability"))
    torch.testing.assert_close(out.double(), torch.einsum("bhqk,bhkd->bqhd", expected, v.double()),
                               **tolerance("scaled"))
    blocks = []
    with Hooks() as hooks, row_blocks(3):
        hooks.own(listen(module, lambda call: blocks.append(call.probs)))
        out_b, _ = probe_attention(module, q, k, v, keep, scaling=0.5, sinks=sinks)
    torch.testing.assert_close(torch.cat(blocks, 2), probs, **tolerance("probability"))
    torch.testing.assert_close(out_b, out, **tolerance("scaled"))


def test_an_unknown_argument_that_could_change_the_maths_is_refused_by_name():
    q, k, v = qkv()
    with pytest.raises(InterfaceError, match="'head_mask'") as err:
        probe_attention(Module(), q, k, v, None, head_mask=torch.ones(4))
    assert "\n" not in str(err.value) and "Module" in str(err.value)
    probe_attention(Module(), q, k, v, None, head_mask=None)  # None cannot change anything
    probe_attention(Module(), q, k, v, None, **{name: 1 for name in ("position_ids", "sliding_window", "use_cache")})
    assert {"position_ids", "cache_position", "output_attentions", "use_cache"} <= HARMLESS


def test_dropout_in_train_mode_is_refused():
    q, k, v = qkv()
    probe_attention(Module().eval(), q, k, v, None, dropout=0.1)  # eval: no dropout
    with pytest.raises(InterfaceError, match="dropout"):
        probe_attention(Module().train(), q, k, v, None, dropout=0.1)


def test_listeners_get_each_call_and_leave_with_their_hooks():
    q, k, v = qkv()
    a, b = Module(), Module()
    seen = []
    with Hooks() as hooks:
        hooks.own(listen(a, lambda call: seen.append(("a", call.module))))
        hooks.own(listen(None, lambda call: seen.append(("any", call.module))))
        probe_attention(a, q, k, v, None)
        probe_attention(b, q, k, v, None)
    probe_attention(a, q, k, v, None)  # nobody listens any more
    assert seen == [("any", a), ("a", a), ("any", b)]
    assert not interface._EVERY and not interface._LISTENERS.get(a)


def test_row_blocks_hand_the_whole_maps_rows_and_the_same_output():
    q, k, v = qkv(T=7)
    keep = padded_causal(2, 7, [7, 4])
    bias = torch.randn(1, 4, 7, 7, generator=torch.Generator().manual_seed(2))
    module = Module()
    out, probs = probe_attention(module, q, k, v, keep, scaling=0.3, position_bias=bias)
    blocks = []
    with Hooks() as hooks, row_blocks(3):
        hooks.own(listen(module, lambda call: blocks.append((call.rows, call.probs))))
        out_b, none = probe_attention(module, q, k, v, keep, scaling=0.3, position_bias=bias)
    assert none is None and [r for r, _ in blocks] == [(0, 3), (3, 6), (6, 7)]
    torch.testing.assert_close(torch.cat([p for _, p in blocks], 2), probs, **tolerance("probability"))
    torch.testing.assert_close(out_b, out, **tolerance("scaled"))


def test_measuring_switches_to_the_function_and_restores_the_implementation(tiny_generic):
    lm = tiny_generic("olmo")
    model = lm.model
    before = ModelState.of(model).config
    with measuring(model) as m:
        assert model.config._attn_implementation == NAME
        assert m.notes == []  # from eager: the same arithmetic, nothing to tell
    assert model.config._attn_implementation == "eager"
    assert ModelState.of(model).config == before
    model.set_attn_implementation("sdpa")  # a user's choice: no probabilities, so the switch is said
    with measuring(model) as m:
        assert model.config._attn_implementation == NAME
        assert any("'sdpa'" in n and repr(NAME) in n and "restored" in n for n in m.notes)
    assert model.config._attn_implementation == "sdpa"


def test_install_registers_the_function_and_its_mask():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert install() == NAME
    assert AttentionInterface._global_mapping[NAME] is probe_attention
    mask = ALL_MASK_ATTENTION_FUNCTIONS[NAME](batch_size=1, q_length=4, kv_length=4,
                                               attention_mask=torch.tensor([[1, 1, 1, 0]]).bool())
    assert mask.dtype == torch.bool  # never skipped: causality and padding always in the mask
    assert torch.equal(mask[0, 0], torch.ones(4, 4, dtype=torch.bool).tril() & torch.tensor([1, 1, 1, 0]).bool())
