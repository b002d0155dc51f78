"""The intervention point (probe.capture.intervene, editors inside probe.capture.interface.probe_attention): identity
edits change nothing, zeroing a head's output is weight surgery on W_O, an unchanged pattern gives
the same output, q/k/v editors see the key/value heads as the model has them, gradients flow, and
patching every head from another run gives that run's logits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import outside_interface, tiny_model, unreproduced
from probe.architectures import site_outputs
from probe.capture.hooks import Hooks
from probe.capture.interface import _EDITORS, POINTS, row_blocks
from probe.capture.intervene import Cache, intervening, mean, patch, replace, scale, zero
from probe.capture.maps import encode, forward
from probe.errors import InterfaceError, ProbeError

TEXTS = ["The cat sat on the mat.", "A dog ran home"]


def _logits(lm, batch):
    out = forward(lm, batch)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.fixture(scope="module", params=["gpt2", "llama", "bloom"])
def lm(request):
    return tiny_model(request.param)


def test_identity_edits_at_every_point_change_nothing_bit_for_bit(lm):
    batch = encode(lm, TEXTS)
    with torch.no_grad(), intervening(lm) as iv:
        ref = _logits(lm, batch)
        for point in POINTS:  # BLOOM: probe's reference module calls the function
            iv.edit(point, lambda site: (lambda t, call: t.clone()))
        same = _logits(lm, batch)
    assert torch.equal(same, ref)


def test_probe_function_matches_the_models_own_attention(lm):
    batch = encode(lm, TEXTS)
    with torch.no_grad():
        own = _logits(lm, batch)
        with intervening(lm):
            ours = _logits(lm, batch)
    torch.testing.assert_close(ours, own, rtol=0, atol=1e-5)


def _surgery(lm, layer: int, head: int, alpha: float = 0.0):
    """W_O's rows reading head ``head`` of ``layer`` multiplied by ``alpha`` (a copy of the weight kept
    to restore)."""
    o = dict((s.layer, m) for s, m in site_outputs(lm.model, lm.spec))[layer]
    d = lm.geometry.d_head
    saved = o.weight.detach().clone()
    with torch.no_grad():
        if lm.spec.conv1d:  # GPT-2's Conv1D: weight [in, out]
            o.weight[head * d:(head + 1) * d] *= alpha
        else:  # nn.Linear: weight [out, in]
            o.weight[:, head * d:(head + 1) * d] *= alpha
    return o, saved


def test_zeroing_a_heads_output_equals_zeroing_its_rows_of_w_o(lm):
    batch = encode(lm, TEXTS)
    o, saved = _surgery(lm, 1, 2)
    try:
        with torch.no_grad():
            surgery = _logits(lm, batch)
    finally:
        with torch.no_grad():
            o.weight.copy_(saved)
    with torch.no_grad(), intervening(lm) as iv:
        base = _logits(lm, batch)
        iv.edit("output", lambda site: zero(heads=[2]) if site.layer == 1 else None)
        zeroed = _logits(lm, batch)
    assert (zeroed - base).abs().max() > 1e-3  # the head matters
    torch.testing.assert_close(zeroed, surgery, rtol=0, atol=1e-6)


def test_scaling_a_heads_output_by_alpha_equals_scaling_its_rows_of_w_o(lm):
    """The worked example of docs/contributing.md: a setter checked against weight surgery."""
    batch = encode(lm, TEXTS)
    o, saved = _surgery(lm, 0, 1, alpha=2.5)
    try:
        with torch.no_grad(), intervening(lm):
            surgery = _logits(lm, batch)
    finally:
        with torch.no_grad():
            o.weight.copy_(saved)
    with torch.no_grad(), intervening(lm) as iv:
        iv.edit("output", lambda site: scale(2.5, heads=[1]) if site.layer == 0 else None)
        scaled = _logits(lm, batch)
    torch.testing.assert_close(scaled, surgery, rtol=0, atol=1e-5)


def test_scaling_a_head_by_zero_is_zeroing_it_and_by_one_changes_nothing(lm):
    batch = encode(lm, TEXTS)
    with torch.no_grad(), intervening(lm) as iv:
        base = _logits(lm, batch)
        iv.edit("output", lambda site: scale(1.0, heads=[0, 3]))
        one = _logits(lm, batch)
        iv.hooks.remove()
        iv.edit("output", lambda site: scale(torch.tensor([0.0, 1.0]), heads=[0, 3]))
        scaled = _logits(lm, batch)
        iv.hooks.remove()
        iv.edit("output", lambda site: zero(heads=[0]))
        zeroed = _logits(lm, batch)
    assert torch.equal(one, base)
    torch.testing.assert_close(scaled, zeroed, rtol=0, atol=0)


def test_editing_with_the_original_pattern_gives_the_same_output():
    lm = tiny_model("llama")
    batch = encode(lm, TEXTS)
    with torch.no_grad(), intervening(lm) as iv:
        ref = _logits(lm, batch)
        iv.edit("pattern", lambda site: (lambda p, call: p * 1.0))
        same = _logits(lm, batch)
        iv.hooks.remove()
        iv.edit("pattern", lambda site: zero("pattern", heads=[1]) if site.layer == 0 else None)
        other = _logits(lm, batch)
    assert torch.equal(same, ref)
    assert (other - ref).abs().max() > 1e-3  # the edited pattern is what weights the values


def test_qkv_editors_see_the_key_value_heads_as_the_model_has_them():
    lm = tiny_model("llama")  # 4 query heads sharing 2 key/value heads
    assert (lm.geometry.n_heads, lm.geometry.n_kv_heads) == (4, 2)
    seen = {}
    batch = encode(lm, TEXTS)
    with torch.no_grad(), intervening(lm) as iv:
        for point in POINTS:
            iv.edit(point, lambda site, point=point: (lambda t, call: seen.setdefault((site.layer, point), t)))
        _logits(lm, batch)
    B, T = batch.input_ids.shape
    d = lm.geometry.d_head
    assert seen[(0, "query")].shape == (B, 4, T, d)
    assert seen[(0, "key")].shape == seen[(0, "value")].shape == (B, 2, T, d)
    assert seen[(1, "pattern")].shape == (B, 4, T, T)
    assert seen[(1, "output")].shape == (B, T, 4, d)


def test_zeroing_a_key_value_head_is_zeroing_both_query_heads_it_serves():
    lm = tiny_model("llama")
    batch = encode(lm, TEXTS)
    with torch.no_grad(), intervening(lm) as iv:
        iv.edit("value", lambda site: zero("value", heads=[1]) if site.layer == 0 else None)
        by_value = _logits(lm, batch)
        iv.hooks.remove()
        iv.edit("output", lambda site: zero(heads=[2, 3]) if site.layer == 0 else None)
        by_output = _logits(lm, batch)
    torch.testing.assert_close(by_value, by_output, rtol=0, atol=1e-6)


def test_gradients_flow_through_a_scaled_heads_output():
    lm = tiny_model("gpt2")
    batch = encode(lm, TEXTS)
    alpha = torch.ones(4, requires_grad=True)
    with intervening(lm) as iv:
        iv.edit("output", lambda site: scale(alpha) if site.layer == 1 else None)
        _logits(lm, batch)[..., 7].sum().backward()
        eps, grads = 1e-2, []
        with torch.no_grad():
            for h in range(4):
                values = []
                for sign in (1, -1):
                    alpha.data = torch.ones(4)
                    alpha.data[h] += sign * eps
                    values.append(_logits(lm, batch)[..., 7].sum())
                grads.append((values[0] - values[1]) / (2 * eps))
    assert alpha.grad is not None and alpha.grad.abs().max() > 0
    torch.testing.assert_close(alpha.grad, torch.stack(grads), rtol=2e-2, atol=2e-2)


def test_patching_a_head_from_another_run_equals_replacing_its_slice_of_w_os_input():
    lm = tiny_model("gpt2")
    clean = encode(lm, ["The cat sat on the mat"])
    ids = clean.input_ids.clone()
    ids[0, 1] = (ids[0, 1] + 1) % lm.model.config.vocab_size
    corrupt = dataclasses.replace(clean, input_ids=ids)
    d, o = lm.geometry.d_head, dict((s.layer, m) for s, m in site_outputs(lm.model, lm.spec))[1]
    taken = {}
    with torch.no_grad(), Hooks() as hooks:  # the independent way: the output projection's input
        hooks.forward_pre(o, lambda mod, args: taken.setdefault("x", args[0].clone()))
        _logits(lm, clean)

        def put(mod, args):
            x = args[0].clone()
            x[..., 2 * d:3 * d] = taken["x"][..., 2 * d:3 * d]
            return (x,)
        hooks.remove()
        hooks.forward_pre(o, put)
        want = _logits(lm, corrupt)
    cache = Cache()
    with torch.no_grad(), intervening(lm) as iv:
        iv.edit("output", lambda site: cache.reader(site))
        _logits(lm, clean)
        iv.hooks.remove()
        iv.edit("output", lambda site: patch(cache, site, heads=[2]) if site.layer == 1 else None)
        got = _logits(lm, corrupt)
        iv.hooks.remove()
        plain = _logits(lm, corrupt)
    assert (got - plain).abs().max() > 1e-4
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_a_cache_under_row_blocks_holds_the_whole_map_and_replace_cuts_the_blocks():
    lm = tiny_model("llama")
    batch = encode(lm, TEXTS)
    whole, blocked = Cache(), Cache()
    with torch.no_grad(), intervening(lm) as iv:
        iv.edit("output", lambda site: whole.reader(site))
        iv.edit("pattern", lambda site: whole.reader((site, "p"), "pattern"))
        ref = _logits(lm, batch)
        iv.hooks.remove()
        iv.edit("output", lambda site: blocked.reader(site))
        iv.edit("output", lambda site: replace(whole[site]))
        with row_blocks(3):
            again = _logits(lm, batch)
    for site in lm.sites:
        torch.testing.assert_close(blocked[site], whole[site], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, ref, rtol=0, atol=1e-5)


def test_mean_sets_every_position_to_the_heads_mean_vector():
    lm = tiny_model("gpt2")
    batch = encode(lm, TEXTS)
    after = Cache()
    means = torch.randn(2, lm.geometry.d_head)
    with torch.no_grad(), intervening(lm) as iv:
        iv.edit("output", lambda site: mean(means, heads=[1, 3]))
        iv.edit("output", lambda site: after.reader(site))
        _logits(lm, batch)
    z = after[lm.sites[0]]
    assert torch.equal(z[:, :, [1, 3]], means.expand(*z.shape[:2], 2, -1))


def test_bad_edits_are_refused_in_one_line_and_editors_are_gone_afterwards():
    outside, llama = unreproduced(outside_interface()[0]), tiny_model("llama")
    with intervening(outside) as iv:  # the reference does not reproduce it (a hook of the user's own)
        with pytest.raises(ProbeError, match="attention interface"):
            iv.edit("query", lambda site: zero("query"))
        with pytest.raises(ValueError, match="no edit point"):
            iv.edit("keys", lambda site: zero("query"))
    with intervening(llama) as iv:
        iv.edit("output", lambda site: (lambda t, call: t[:, :1]))
        with pytest.raises(InterfaceError, match="returned shape"):
            _logits(llama, encode(llama, TEXTS))
    assert not any(m in _EDITORS for m in llama.model.modules())
    assert llama.model.config._attn_implementation == "eager"
