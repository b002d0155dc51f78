"""``probe effects`` as a function: the usual analysis of the corpus (labels; the decoder circuit
probe on decoders), the ablation effects of every head and label group, the induction claim on
decoders, and the analysis a run folder is written from (report with the effects section, heads.csv with the
effect columns, effects.csv, label_effects.csv, run.json: :func:`probe.entries.ablation.run_effects` and its
``save``).
"""

from __future__ import annotations

import time

from ..errors import InputError
from ..patterns import CircuitProbe
from ..records import AnalysisResult
from ..runs.analysis import merge_head_columns
from .ablation import check_model
from .icl import icl_claim
from .induction import induction_claim, induction_group
from .measure import EFFECT_COLUMNS, EffectsResult, head_effects, labelled_heads


def effects_analysis(lm, texts: list, *, induction: bool = True, **kwargs) -> tuple[EffectsResult, AnalysisResult]:
    """Analyze ``texts`` and measure the ablation effects (:func:`~probe.effects.measure.head_effects`,
    ``kwargs`` passed on): ``(result, the analysis the run folder is written from)``, no folder written.

    Args:
        induction: on a decoder, also test the induction claim (:func:`~probe.effects.induction.induction_claim`).

    Raises:
        UnsupportedAnalysisError, InputError: as ``head_effects``.
    """
    check_model(lm)
    t = time.perf_counter()
    decoder = CircuitProbe.refusal(lm) is None
    analysis = labelled_heads(lm, texts, batch_size=kwargs.get("batch_size", 16),
                              max_length=kwargs.get("max_length"), progress=kwargs.get("progress", False))
    analyze_s = time.perf_counter() - t
    result = head_effects(lm, texts, heads=analysis.heads, **kwargs)
    if induction and decoder:
        t = time.perf_counter()
        result.induction = induction_claim(lm, analysis.heads, result.means, seeds=kwargs.get("seeds", 10),
                                           copies=kwargs.get("copies", 8))
        group, _ = induction_group(analysis.heads)
        try:
            result.induction["icl"] = icl_claim(lm, texts, group, result.means, seeds=kwargs.get("seeds", 10))
        except InputError as exc:
            result.notes.append(f"icl_score not measured: {exc}")
        result.timings["induction_s"] = round(time.perf_counter() - t, 3)
    analysis.heads = merge_head_columns(analysis.heads, result.heads,
                                        [c for c in EFFECT_COLUMNS if c in result.heads])
    analysis.results["effects"] = result
    analysis.notes += [n for n in result.notes if n not in analysis.notes]
    analysis.timings["analyze_s"] = round(analyze_s, 4)
    analysis.timings.update(result.timings)
    return result, analysis
