"""The label rules and the health checks' rules (docs/statistics.md, "Labels" and "Health checks"):
which statistic and default threshold give each label or flag each check, and the checks of a user's
thresholds. No heavy library: the command line checks ``--threshold`` and ``--health-threshold`` with
it before torch, transformers or pandas are imported; :mod:`probe.measures.classify` and
:mod:`probe.patterns.health` apply the rules.
"""

from __future__ import annotations

import numbers

from .errors import InputError

#: label -> (statistic, default threshold). Thresholds are configurable and recorded with results.
LABEL_RULES: dict[str, tuple[str, float]] = {
    "previous-token": ("prev", 0.5),
    "next-token": ("next", 0.5),
    "self": ("self", 0.5),
    "first-token": ("first", 0.5),
    "sep": ("sep", 0.5),
    "punctuation": ("punct", 0.5),
    "broad": ("norm_entropy", 0.8),
    "long-range": ("long", 0.5),
    # decoder circuits on repeated random tokens (docs/statistics.md; columns from probe.patterns.circuit_probe)
    "induction": ("induction", 0.4),
    "duplicate-token": ("duplicate", 0.4),
}

MIXED = "mixed"
#: The label of a head physically removed from the model (probe.pruning): it has no statistics.
REMOVED = "removed"


def default_thresholds() -> dict[str, float]:
    """label -> threshold, the defaults (docs/statistics.md, "Labels")."""
    return {label: thr for label, (_, thr) in LABEL_RULES.items()}


def validate_thresholds(thresholds: dict[str, float] | None) -> None:
    """Check label -> threshold overrides.

    Raises:
        ValueError: an unknown label, or a threshold that is not a number in (0, 1] (every
            labelling statistic is a probability or a normalized entropy).
    """
    for name, value in (thresholds or {}).items():
        if name not in LABEL_RULES:
            raise ValueError(f"unknown label {name!r}; labels: {', '.join(LABEL_RULES)}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) <= 1:
            raise ValueError(f"threshold of {name!r} must be in (0, 1] (every labelling statistic is a "
                             f"probability or a normalized entropy), got {value!r}")


#: Heads of one layer closer than this (bits) are near-duplicates: the health check's
#: ``duplicates`` and pruning's redundancy (:mod:`probe.patterns.distance`) both read it here.
NEAR_DUPLICATE = 0.05

#: check -> (statistic, default threshold, comparison, what it points at). Order = report order.
HEALTH_RULES: dict[str, tuple[str, float, str, str]] = {
    "saturated": ("max_weight", 0.95, ">=", "one-hot softmax: missing or wrong score scale, very large logits"),
    "uniform": ("norm_entropy", 0.95, ">=", "scores too small (scale applied twice), dead head"),
    "collapsed": ("self", 0.8, ">=", "a head that only copies its own token"),
    "duplicates": ("distance", NEAR_DUPLICATE, "<", "redundant heads, pruning candidates"),
    "padding": ("padding", 0.0, ">", "a mask bug: must be exactly 0"),
}


def health_thresholds(overrides: dict | None = None) -> dict[str, float]:
    """check -> threshold: the defaults (docs/statistics.md) with ``overrides``.

    Raises:
        InputError: an unknown check, ``padding`` (fixed at 0), or a value outside (0, 1].
    """
    out = {name: rule[1] for name, rule in HEALTH_RULES.items()}
    for name, value in (overrides or {}).items():
        if name not in HEALTH_RULES:
            raise InputError(f"unknown health check {name!r}; checks: {', '.join(HEALTH_RULES)}")
        if name == "padding":
            raise InputError("the padding check has no threshold: any probability on a padding key is a mask bug")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) <= 1:
            raise InputError(f"health threshold of {name!r} must be in (0, 1], got {value!r}")
        out[name] = float(value)
    return out
