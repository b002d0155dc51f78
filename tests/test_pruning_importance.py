"""probe.pruning.importance: Michel et al.'s |dL/d gate| against finite differences, the per-layer
normalization, the Gauss-Newton form for the fidelity objective against an exact Jacobian, and the
errors for models without gradients."""

from __future__ import annotations

import itertools

import pytest
import torch

from conftest import tiny_model
from probe.causal.gates import gated, ones
from probe.causal.objectives import CausalLM, Fidelity, Objective
from probe.errors import ProbeError
from probe.pruning.importance import head_importance, normalize_per_layer
from probe.text.inputs import Text, iter_batches

TEXTS = ["The cat sat on the mat.", "A dog barked at the moon.", "Birds sing.", "It rained all day long."]
#: The heads checked against finite differences (a few, to keep the test fast).
CHECKED = [(0, 0), (0, 3), (1, 1), (1, 2)]


def _batches(lm):
    return list(iter_batches(lm, [Text(t) for t in TEXTS], batch_size=2))


def test_gradient_importance_equals_finite_differences():
    """I_h = sum over batches of |dL/dxi_h| (L: the batch's mean next-token loss), checked against
    central differences of the loss in float64."""
    lm = tiny_model("gpt2")
    lm.model.double()
    batches = _batches(lm)
    obj = CausalLM()
    obj.setup(lm, batches)
    mask = ones(lm)
    mask[0, 2] = 0.0  # one head already pruned: its gate stays 0 and its importance is 0
    with gated(lm, mask) as state:
        got = head_importance(lm, batches, obj, state, mask)
        want = torch.zeros_like(got)
        eps = 1e-5
        with torch.no_grad():
            for (layer, h), batch in itertools.product(CHECKED, batches):
                vals = []
                for sign in (1, -1):
                    g = mask.double().clone()
                    g[layer, h] += sign * eps
                    state.values = g
                    vals.append(float(obj.losses(lm, batch).mean()))
                want[layer, h] += abs(vals[0] - vals[1]) / (2 * eps)
    assert got[0, 2] == 0.0
    rows, cols = zip(*CHECKED)
    torch.testing.assert_close(got[rows, cols], want[rows, cols], rtol=1e-5, atol=1e-8)
    assert got.min() >= 0 and (got > 0).sum() == mask.sum()


def test_normalize_per_layer_hand_computed():
    imp = torch.tensor([[3.0, 4.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    out = normalize_per_layer(imp, mask)
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.8, 0.0], [2 ** -0.5, 2 ** -0.5, 0.0], [0.0, 0.0, 0.0]],
                                                 dtype=torch.float64))


def test_fidelity_importance_is_the_gauss_newton_term():
    """For fidelity, dL/dxi = 0 at the unpruned model; the importance is sum over batches of the
    mean over sequences of |de/dxi_h|^2 / 2 (e = unit sentence embedding), estimated with random
    projections; checked against the exact Jacobian from central differences."""
    lm = tiny_model("bert")
    lm.model.double()
    batches = _batches(lm)
    obj = Fidelity()
    obj.setup(lm, batches)
    mask = ones(lm)
    L, H = mask.shape
    with gated(lm, mask) as state:
        # the first derivative really is ~0 here
        g = mask.double().clone().requires_grad_(True)
        state.values = g
        (grad,) = torch.autograd.grad(obj.losses(lm, batches[0]).mean(), g)
        assert grad.abs().max() < 1e-8
        exact = torch.zeros(L, H, dtype=torch.float64)
        eps = 1e-5
        with torch.no_grad():
            for batch, (layer, h) in itertools.product(batches, CHECKED):
                vecs = []
                for sign in (1, -1):
                    gg = torch.ones(len(batch), L, H, dtype=torch.float64)
                    gg[:, layer, h] += sign * eps  # each sequence has its own gate
                    state.values = gg
                    vecs.append(obj.vector(lm, batch))
                jac = (vecs[0] - vecs[1]) / (2 * eps)  # [batch, d_model]
                exact[layer, h] += (jac.pow(2).sum(-1) / 2).mean()
        estimate = head_importance(lm, batches, obj, state, mask, probes=100, seed=0)
    rows, cols = zip(*CHECKED)
    assert exact[rows, cols].min() > 0
    # 100 projections x 4 sequences: relative standard error about sqrt(2 / 400) = 7%
    torch.testing.assert_close(estimate[rows, cols], exact[rows, cols], rtol=0.25, atol=0)


class _Detached(Objective):
    name, unit = "detached", "x"

    def losses(self, lm, batch):
        return torch.ones(len(batch), requires_grad=True)


def test_no_gradient_and_integer_parameters_are_clear_errors():
    lm = tiny_model("bert")
    batches = _batches(lm)
    with gated(lm, ones(lm)) as state, pytest.raises(ProbeError, match="get no gradient"):
        head_importance(lm, batches, _Detached(), state, ones(lm))
    lm.model.register_parameter("quantized", torch.nn.Parameter(torch.zeros(3, dtype=torch.int8),
                                                                requires_grad=False))
    with gated(lm, ones(lm)) as state, pytest.raises(ProbeError, match="int8 parameters"):
        head_importance(lm, batches, Fidelity(), state, ones(lm))


def test_parameters_keep_their_requires_grad_flags():
    lm = tiny_model("gpt2")
    batches = _batches(lm)
    obj = CausalLM()
    obj.setup(lm, batches)
    flags = [p.requires_grad for p in lm.model.parameters()]
    with gated(lm, ones(lm)) as state:
        head_importance(lm, batches, obj, state, ones(lm))
    assert [p.requires_grad for p in lm.model.parameters()] == flags
    assert all(p.grad is None for p in lm.model.parameters())
