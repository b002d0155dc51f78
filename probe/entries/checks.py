"""``probe verify`` as a library call (:func:`run_verify`): whether probe's attention reproduces the model,
the tolerance chosen from the model's dtype where none is given, a mutant refused where it cannot change
the model, returned as a :class:`~probe.entries.result.RunResult` whose ``measured`` is the
:class:`~probe.verification.VerifyResult` (the command writes no folder; ``save`` writes ``verify.json``).

Example::

    from probe.settings import VerifySettings
    run = probe.run_verify(lm, VerifySettings(quick=True)); run.measured.passed
"""

from __future__ import annotations

import pandas as pd
import torch

from ..capture.reference import mutant_applies
from ..errors import ProbeError
from ..settings import VerifySettings
from ..verification import BF16_ATOL, FP32_ATOL, verify
from .result import Console, RunResult, run_model


def run_verify(model, settings: VerifySettings | None = None, *, console: Console | None = None, device=None,
               dtype=None) -> RunResult:
    """``probe verify`` as one call (:func:`probe.verification.verify`).

    Args:
        model: a model name or a loaded model.
        settings: :class:`~probe.settings.VerifySettings` (atol, default 1e-05 in float32 and 0.01 in bfloat16
            or float16; rtol; a mutant; ``quick``: the 'sentence' case only).
        console: ``case``, called as each case starts and ends.
        device, dtype: where and how a named model loads.

    Returns:
        A :class:`~probe.entries.result.RunResult` (``measured``: the VerifyResult; ``tables["layers"]``,
        ``tables["cases"]``).

    Raises:
        ProbeError: a mutant that cannot change the model; as :func:`probe.verification.verify`.
    """
    s = VerifySettings() if settings is None else settings
    console = Console() if console is None else console
    lm = run_model(model, console, dtype=dtype, device=device)
    atol = s.atol
    if atol is None:
        atol = FP32_ATOL if next(lm.model.parameters()).dtype == torch.float32 else BF16_ATOL
    if s.mutant is not None and not lm.spec.discovered:  # (a discovered spec refuses mutants in verify)
        applies, why = mutant_applies(s.mutant, lm)
        if not applies:
            raise ProbeError(f"mutant {s.mutant!r} cannot change {model if isinstance(model, str) else lm.name}: "
                             f"{why}")
    result = verify(lm, atol=atol, mutant=s.mutant, rtol=s.rtol, cases=["sentence"] if s.quick else None,
                    progress=console.case)
    record = result.to_json()
    tables = {"layers": pd.DataFrame(record.get("per_layer", [])), "cases": pd.DataFrame(record.get("cases", []))}
    return RunResult("verify", s, None, result, tables=tables, timings=console.timings, tokenizer=lm.tokenizer,
                     lm=lm, started=console.started, loading_notes=list(lm.notes))
