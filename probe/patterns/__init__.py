"""Head groups, pattern types, attention health checks and decoder circuits.

Each analysis is an accumulator of the one analysis loop (:func:`probe.runs.analysis.run`), run in the
same pass as the per-head statistics, except the decoder circuit probe, which runs on its own
inputs (repeated random tokens) and joins the result through ``analyze(finished=[...])``:

* :mod:`~probe.patterns.distance` - Jensen-Shannon divergence between heads (:class:`HeadDistances`);
* :mod:`~probe.patterns.groups` - 2-D map (MDS) and groups (clustering, k by silhouette);
* :mod:`~probe.patterns.kovaleva` - Kovaleva et al. 2019 pattern types (:class:`PatternTypes`);
* :mod:`~probe.patterns.health` - saturated / uniform / collapsed / duplicate heads and padding
  attended (:class:`HealthProbe`, :func:`health_checks`);
* :mod:`~probe.patterns.circuits` - induction, duplicate-token and previous-token scores on repeated
  random tokens, attention sinks with and without BOS (:func:`circuit_probe`);
* :mod:`~probe.patterns.report` - the report sections.

Usage::

    from probe import analyze, load_model
    from probe.patterns import circuit_probe, pattern_accumulators

    lm = load_model("smollm2")
    result = analyze(lm, texts, accumulators=pattern_accumulators(lm),
                     finished=[circuit_probe(lm, sink_texts=texts)])
"""

from __future__ import annotations

from .circuits import CircuitProbe, CircuitResult, circuit_probe, repeated_random_tokens
from .distance import MAP_ROWS, MAP_SAMPLE_ROWS, MAP_SEQUENCES, SAMPLE_ROWS, DistanceResult, HeadDistances
from .groups import HeadGroups, head_groups
from .health import HEALTH_RULES, Check, HealthProbe, health_checks, health_of, health_thresholds
from .kovaleva import TYPES, PatternTypes


def pattern_accumulators(lm, *, distance: bool = True, map_sequences: int = MAP_SEQUENCES,
                         map_rows: int = MAP_ROWS, types: bool = True, health: bool = True,
                         thresholds: dict | None = None, sample_rows: int | None = SAMPLE_ROWS,
                         map_sample_rows: int | None = MAP_SAMPLE_ROWS) -> list:
    """The accumulators of this package for one model, to pass to ``analyze(accumulators=...)``.

    Each says which models it measures (``model_kinds``, ``site_kinds``; all of them one-stack
    models, encoders and decoders): ``analyze`` refuses one that does not fit ``lm``
    (:class:`~probe.errors.UnsupportedAnalysisError`), so a caller keeps those whose
    ``refusal(lm)`` is None, as the CLI does.

    Args:
        lm: a loaded model.
        distance: head distances (per layer over the corpus; model-wide over rows 0..map_rows-1 of
            the first ``map_sequences`` sequences), hence groups, the map and the duplicates check.
        sample_rows, map_sample_rows: query rows per sequence the distances are estimated from (a
            fixed-seed sample; None: every row, exact); the standard errors are in the result.
        types: Kovaleva pattern types. health: the padding measurement of the health checks (the
            other checks read the statistics and distances).
        thresholds: health-check threshold overrides (:data:`HEALTH_RULES`).

    Raises:
        InputError: bad health thresholds, or fewer than 2 sampled rows per sequence.
    """
    sites, heads = lm.sites, lm.geometry.n_heads
    out = []
    if distance:
        out.append(HeadDistances(sites, heads, map_sequences=map_sequences, map_rows=map_rows,
                                 sample_rows=sample_rows, map_sample_rows=map_sample_rows))
    if types:
        out.append(PatternTypes(sites, heads, lm.tokenizer))
    if health:
        out.append(HealthProbe(sites, thresholds, real_rows_only=lm.spec.padding_rows_masked))
    return out


__all__ = [
    "CircuitProbe", "CircuitResult", "Check", "DistanceResult", "HEALTH_RULES", "HeadDistances", "HeadGroups",
    "HealthProbe", "MAP_ROWS", "MAP_SEQUENCES", "PatternTypes", "TYPES", "circuit_probe", "head_groups",
    "health_checks", "health_of", "health_thresholds", "pattern_accumulators", "repeated_random_tokens",
]
