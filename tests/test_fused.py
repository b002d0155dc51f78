"""The statistics fed from what probe's attention function computed (issue "at the floor").

- ``norm_mass`` read from each head's output as the function returned it (no second product of the
  probabilities with the values) equals the one computed again from the probabilities, on whole
  maps and on row blocks, for a model with grouped key/value heads; a half-precision model's
  rounded outputs are not used.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from generic_models import generic_lm

from probe.capture import values as values_module
from probe.runs.analysis import analyze

TEXTS = ["The cat sat on the mat and looked around the room, quietly.", "A dog.",
         "Numbers like 3.14 and 2.71 appear here; so do commas, colons: and dashes - too."]


@pytest.fixture(scope="module")
def grouped():
    """A discovered decoder with 4 query heads on 2 key/value heads (runs probe's function)."""
    lm = generic_lm("granite")
    assert lm.spec.discovered and lm.geometry.n_kv_heads < lm.geometry.n_heads
    return lm


def _heads(lm, **kw):
    return analyze(lm, TEXTS, n_examples=0, **kw).heads


@pytest.mark.parametrize("query_block", [0, 3], ids=["whole", "blocks"])
def test_norm_mass_from_the_functions_outputs_equals_it_computed_again(grouped, query_block, monkeypatch):
    """The fused ``norm_mass`` (and every value-weighted column) equals the one computed again from
    the probabilities and values, and the fused path ran once per call or block."""
    calls = {"n": 0}
    original = values_module.head_output_norms

    def counted(z, gram):
        calls["n"] += 1
        return original(z, gram)

    monkeypatch.setattr(values_module, "head_output_norms", counted)
    fused = _heads(grouped, query_block=query_block)
    assert calls["n"] > 0
    monkeypatch.setattr(values_module, "WIDE", ())  # no output kept: norm_mass from probs @ v again
    calls["n"] = 0
    again = _heads(grouped, query_block=query_block)
    assert calls["n"] == 0
    columns = [c for c in fused.columns if c.endswith("_by_norm") or c == "norm_mass"]
    assert "norm_mass" in columns
    for c in columns:
        np.testing.assert_allclose(fused[c].to_numpy(float), again[c].to_numpy(float), rtol=1e-5, atol=1e-7,
                                   err_msg=c)
    assert float(fused["norm_mass"].min()) > 0


def test_a_half_models_rounded_outputs_are_not_used(grouped, monkeypatch):
    """In bfloat16 each head's output is rounded to the dtype: norm_mass comes from the
    probabilities in float32 (the path of a hand-spec model under eager attention)."""
    calls = {"n": 0}
    monkeypatch.setattr(values_module, "head_output_norms", lambda z, g: calls.__setitem__("n", 1))
    grouped.model.to(torch.bfloat16)
    try:
        heads = _heads(grouped)
    finally:
        grouped.model.float()
    assert calls["n"] == 0 and bool(np.isfinite(heads["norm_mass"]).all())


def test_an_output_editor_leaves_norm_mass_as_the_probabilities_give_it(grouped, monkeypatch):
    """Under an editor at the ``"output"`` point (heads scaled by 0.5 inside :func:`intervening`), the
    function's output is no longer the probabilities times the values: ``norm_mass`` is computed from
    the probabilities and values (the same as with no output kept), not read from the edited output."""
    from probe.capture.intervene import intervening, scale

    def under_editor():
        with intervening(grouped) as iv:
            iv.edit("output", lambda site: scale(0.5))
            return _heads(grouped)

    edited = under_editor()
    monkeypatch.setattr(values_module, "WIDE", ())
    again = under_editor()
    np.testing.assert_allclose(edited["norm_mass"].to_numpy(), again["norm_mass"].to_numpy(), rtol=1e-6)
