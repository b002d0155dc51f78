"""``verify``: the one entry point, for hand-written and discovered specs alike."""

from __future__ import annotations

from collections.abc import Callable

from .. import validate
from ..architectures.discovered import refuse_capture_only
from ..capture.failures import forward_failures
from ..capture.reference.mutants import check_mutant
from ..core import LoadedModel
from ..errors import ProbeError
from .compare import FP32_ATOL, FP32_RTOL, CaseResult, VerifyResult
from .compare import verify as verify_reference
from .generic import verify_generic


def verify(lm: LoadedModel, atol: float = FP32_ATOL, mutant: str | None = None, *, rtol: float = FP32_RTOL,
           cases: list[str] | None = None,
           progress: Callable[[int, int, str, CaseResult | None], None] | None = None) -> VerifyResult:
    """Check that probe's attention reproduces the model.

    A model with a hand-written spec: its attention modules swapped for probe's from-scratch
    attention, layer by layer, on the battery of inputs
    (:func:`probe.verification.compare.verify`, where the arguments are described). A model with a
    discovered spec (no hand-written one): probe's attention function against the model's own eager
    function call by call, and the whole model against eager and sdpa attention
    (:func:`probe.verification.generic.verify_generic`).

    Raises:
        InputError: unknown mutant, negative or non-finite tolerance.
        ProbeError: unknown case name or no case; a mutant asked of a model without a hand spec.
        ModelForwardError: the model's own forward pass raised an exception on one of the inputs
            (MiniMax refuses transformers' key/value cache), named as verification's step.
    """
    refuse_capture_only(lm.spec, "probe verify")
    with forward_failures(STEP, lm.model):
        return _verify(lm, atol, mutant, rtol, cases, progress)


#: The step a model's own exception is reported in (:mod:`probe.capture.failures`).
STEP = "verification (the battery of inputs through probe's attention and the model's own)"


def _verify(lm: LoadedModel, atol: float, mutant: str | None, rtol: float, cases: list[str] | None,
            progress) -> VerifyResult:
    if not lm.spec.discovered:
        return verify_reference(lm, atol, mutant, rtol=rtol, cases=cases, progress=progress)
    check_mutant(mutant)
    atol, rtol = validate.tolerance("atol", atol), validate.tolerance("rtol", rtol)
    if mutant is not None:
        raise ProbeError(f"mutants break probe's from-scratch attention module, which needs a hand-written spec; "
                         f"{lm.model_type} has none (its attention is verified through probe's attention function)")
    return verify_generic(lm, atol, rtol, cases, progress)  # its cases chosen by battery.select_cases
