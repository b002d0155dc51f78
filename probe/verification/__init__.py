"""``probe verify``, one feature in one package: the battery of inputs (:mod:`.battery`: the cases
hand-written attention is known to fail on) and the comparison of the model as loaded with the
model whose attention modules are swapped for the from-scratch attention of :mod:`probe.capture.reference`
(:mod:`.compare`: layer by layer, probabilities, hidden states and outputs; the tolerances).
"""

from .battery import Case, case_names  # (the battery() function stays in .battery: its name is the module's)
from .compare import (
    BF16_ATOL,
    FP32_ATOL,
    FP32_RTOL,
    NOISE_FACTOR,
    CaseResult,
    LayerResult,
    VerifyResult,
)
from .entry import verify

__all__ = ["VerifyResult", "LayerResult", "CaseResult", "verify", "BF16_ATOL", "FP32_ATOL", "FP32_RTOL",
           "NOISE_FACTOR", "Case", "case_names"]
