"""One validator for each check of user input, shared by the Python API and the command line.

The checks of numbers and texts live in :mod:`probe.bounds` (which imports no heavy library, so the
command line checks its options without torch) and are re-exported here. Each raises
:class:`~probe.errors.InputError` with a one-line message; the CLI turns the same
errors from option values into usage errors (exit status 2) with
:func:`probe.cli.options.click_callback`.
"""

from __future__ import annotations

from .bounds import fraction, limit, max_length, positive_int, texts, tolerance
from .errors import InputError
from .measures.classify import validate_thresholds
from .reference.mutants import MUTANTS

__all__ = ["fraction", "limit", "max_length", "positive_int", "texts", "tolerance", "mutant", "thresholds",
           "value_weighting", "LABELS_BY"]


def mutant(name: str | None) -> str | None:
    """A mutant name from :data:`probe.reference.MUTANTS` (or None).

    Raises:
        InputError: an unknown name (the message lists the known ones).
    """
    if name is not None and name not in MUTANTS:
        raise InputError(f"unknown mutant {name!r}; choose from {', '.join(MUTANTS)}")
    return name


def thresholds(values: dict | None) -> dict[str, float]:
    """Label thresholds (label -> number in (0, 1]).

    Raises:
        InputError: an unknown label or a value outside (0, 1].
    """
    try:
        validate_thresholds(values)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return {k: float(v) for k, v in (values or {}).items()}


#: What labels may rest on (``analyze(labels_by=...)``, ``--labels-by``).
LABELS_BY = ("weight", "norm")


def value_weighting(value_weighted: bool, labels_by: str) -> dict:
    """``{"value_weighted": ..., "labels_by": ...}`` after checking ``labels_by``: ``"weight"`` (the
    attention statistics) or ``"norm"`` (their value-weighted forms).

    Raises:
        InputError: another value, or ``"norm"`` with the value-weighted statistics turned off.
    """
    if labels_by not in LABELS_BY:
        raise InputError(f"labels by must be one of {', '.join(LABELS_BY)}, got {labels_by!r}")
    if labels_by == "norm" and not value_weighted:
        raise InputError("labels by norm need the value-weighted statistics; they are turned off (--no-norm)")
    return {"value_weighted": bool(value_weighted), "labels_by": labels_by}
