"""The intervention point on the hand families whose transformers modules do not call the attention
interface in the installed release (measured; BLOOM, DeBERTa-v2, GPT-Neo, MPNet in 5.25, Falcon too until
5.24): probe's reference module, swapped in, calls
probe's attention function, so every point exists; identity edits change nothing bit for bit, the
model's own outputs are kept at every real position, zeroing a head's output is weight surgery on
W_O, the pattern read there is the model's own eager map (each to float32 rounding: bit for bit on
the swap check's batch, and on other batches on some CPUs; a few ulps where a CPU's matrix kernels
add another shape in another order, 1e-6 measured for DeBERTa-v2 and Falcon on an AMD EPYC); where
the reference does not reproduce the model as it runs, only the output point exists (the output
projection's pre-hook)."""

from __future__ import annotations

import pytest
import torch

from conftest import OWN_ATTENTION_CANDIDATES, outside_interface, tiny_model, unreproduced
from probe.architectures import site_outputs
from probe.capture.interface import POINTS
from probe.capture.intervene import Cache, intervening, zero
from probe.capture.maps import encode, forward
from probe.capture.reference import ReferenceAttention
from probe.capture.swapped import is_swapped, reference_agrees
from probe.errors import ProbeError

TEXTS = ["The cat sat on the mat.", "A dog ran home"]
OUTSIDE = outside_interface()
#: The same families where the installed release moved them onto the interface.
MOVED = tuple(k for k in OWN_ATTENTION_CANDIDATES if k not in OUTSIDE)


def _logits(lm, batch):
    out = forward(lm, batch)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _real(batch) -> torch.Tensor:
    return batch.model_inputs()["attention_mask"].bool()


@pytest.fixture(scope="module", params=OUTSIDE)
def lm(request):
    return tiny_model(request.param)


def test_the_reference_reproduces_the_model_and_serves_every_point(lm):
    assert reference_agrees(lm)
    batch = encode(lm, TEXTS)
    real = _real(batch)
    with torch.no_grad():
        own = _logits(lm, batch)
        with intervening(lm) as iv:
            assert iv.native and is_swapped(lm)
            ref = _logits(lm, batch)
            for point in POINTS:
                iv.edit(point, lambda site: (lambda t, call: t.clone()))
            same = _logits(lm, batch)
    assert not is_swapped(lm)  # the model's own modules are back
    torch.testing.assert_close(ref[real], own[real], rtol=1e-5, atol=1e-5)
    assert torch.equal(same, ref)


def test_zeroing_a_heads_output_equals_zeroing_its_rows_of_w_o(lm):
    batch = encode(lm, TEXTS)
    real = _real(batch)
    o = dict((s.layer, m) for s, m in site_outputs(lm.model, lm.spec))[1]
    d = lm.geometry.d_head
    saved = o.weight.detach().clone()
    try:
        with torch.no_grad():
            o.weight[:, 2 * d:3 * d] = 0.0  # nn.Linear: weight [out, in]
            surgery = _logits(lm, batch)
    finally:
        with torch.no_grad():
            o.weight.copy_(saved)
    with torch.no_grad(), intervening(lm) as iv:
        base = _logits(lm, batch)
        iv.edit("output", lambda site: zero(heads=[2]) if site.layer == 1 else None)
        zeroed = _logits(lm, batch)
    assert (zeroed - base)[real].abs().max() > 1e-3  # the head matters
    torch.testing.assert_close(zeroed[real], surgery[real], rtol=1e-5, atol=1e-5)


def test_the_pattern_read_at_the_function_is_the_models_own_eager_map(lm):
    batch = encode(lm, TEXTS)
    real = _real(batch)
    with torch.no_grad():
        own = forward(lm, batch, output_attentions=True).attentions[0]  # [batch, heads, query, key]
        cache = Cache()
        with intervening(lm) as iv:
            iv.edit("pattern", lambda site: cache.reader(site, "pattern") if site.layer == 0 else None)
            _logits(lm, batch)
    ours = cache[lm.sites[0]]
    for b in range(len(TEXTS)):
        rows = real[b].nonzero().flatten()
        torch.testing.assert_close(ours[b][:, rows][..., rows], own[b][:, rows][..., rows], rtol=0, atol=1e-5)


def test_a_zeroed_value_head_silences_the_query_heads_it_serves():
    lm = tiny_model("falcon")  # multi-query: one key/value head serves the four query heads
    batch = encode(lm, TEXTS)
    with torch.no_grad(), intervening(lm) as iv:
        iv.edit("value", lambda site: zero("value", heads=[0]) if site.layer == 0 else None)
        by_value = _logits(lm, batch)
        iv.hooks.remove()
        iv.edit("output", lambda site: zero(heads=[0, 1, 2, 3]) if site.layer == 0 else None)
        by_output = _logits(lm, batch)
    torch.testing.assert_close(by_value, by_output, rtol=0, atol=1e-6)


def test_nested_contexts_swap_once_and_restore_the_models_modules():
    lm = tiny_model("gpt_neo")
    sites = [m for _, m in site_outputs(lm.model, lm.spec)]
    with intervening(lm), intervening(lm) as inner:
        assert inner.native
        assert sum(isinstance(m, ReferenceAttention) for m in lm.model.modules()) == len(lm.sites)
    assert not any(isinstance(m, ReferenceAttention) for m in lm.model.modules())
    assert [m for _, m in site_outputs(lm.model, lm.spec)] == sites


def test_where_the_reference_does_not_reproduce_the_model_only_the_output_point_exists():
    """A model the reference does not reproduce as it runs (the user's own hook scales each attention
    module's output; the swapped reference would skip it): not swapped, q/k/v/pattern refused in one line,
    the output projection's hook stays and works."""
    lm = unreproduced(OUTSIDE[0])
    batch = encode(lm, TEXTS)
    assert not reference_agrees(lm)
    with torch.no_grad(), intervening(lm) as iv:
        assert not iv.native and not is_swapped(lm)
        with pytest.raises(ProbeError, match="does not reproduce it"):
            iv.edit("query", lambda site: zero("query"))
        base = _logits(lm, batch)
        iv.edit("output", lambda site: zero(heads=[1]) if site.layer == 0 else None)
        assert (_logits(lm, batch) - base).abs().max() > 1e-3


@pytest.mark.parametrize("kind", MOVED or ["none"])
def test_a_family_moved_onto_the_interface_runs_probes_function_without_a_swap(kind):
    """Where a release moved a hand family onto the interface (Falcon in 5.25), probe follows it there with no
    code change: every point exists without the reference module, identity edits change nothing bit for bit."""
    if kind == "none":
        pytest.skip("no hand family of this release moved onto the interface")
    lm = tiny_model(kind)
    batch = encode(lm, TEXTS)
    with torch.no_grad():
        own = _logits(lm, batch)
        with intervening(lm) as iv:
            assert iv.native and not is_swapped(lm)
            for point in POINTS:
                iv.edit(point, lambda site: (lambda t, call: t.clone()))
            same = _logits(lm, batch)
    assert torch.equal(same, own)
