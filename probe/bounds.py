"""Checks of numbers and texts given by a user: counts, limits, tolerances, fractions, non-empty
texts. The part of :mod:`probe.validate` that needs no heavy library: the command line checks its
options with it before torch, transformers or pandas are imported (``probe.validate`` re-exports
every function here).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

from .errors import InputError

#: Parameter dtypes a model can be loaded in (``--dtype``, ``load_model(dtype=...)``); here, where the
#: command line reads it without importing torch.
DTYPES = ("float32", "bfloat16", "float16")


def positive_int(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``.

    Raises:
        InputError: not an integer, or below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InputError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def limit(value: int | None) -> int | None:
    """``--limit``: None (no limit) or an int >= 1."""
    return None if value is None else positive_int("--limit", value)


def max_length(value: int | None, model_limit: int) -> int:
    """The token limit per sequence: ``value`` as given (default: the model's limit), never changed.

    Raises:
        InputError: ``value`` below 2 (a sequence needs at least two tokens to have attention to
            measure), or above the model's limit (its position table, or its tokenizer's
            ``model_max_length``): one line naming both.
    """
    if value is None:
        return model_limit
    positive_int("max length (tokens)", value, 2)
    if int(value) > model_limit:
        raise InputError(f"max length {int(value)} tokens is above the model's limit of {model_limit} tokens "
                         "(its position table or its tokenizer's model_max_length); give at most that")
    return int(value)


def texts(items: Iterable, what: str = "text") -> list:
    """A non-empty list of non-empty texts (strings or objects with a ``text`` attribute).

    Raises:
        InputError: no text, or an empty or whitespace-only one (numbered from 1).
    """
    items = [items] if isinstance(items, str) else list(items)
    if not items:
        raise InputError(f"no {what} given")
    for i, t in enumerate(items):
        s = t if isinstance(t, str) else getattr(t, "text", None)
        if not isinstance(s, str) or not s.strip():
            raise InputError(f"{what} {i + 1} is empty")
    return items


def tolerance(name: str, value) -> float:
    """A comparison tolerance: a finite number >= 0.

    Raises:
        InputError: negative, NaN, infinite or not a number.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise InputError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def fraction(name: str, value, *, closed_low: bool = False, closed_high: bool = False) -> float:
    """A number in (0, 1) (ends included where asked).

    Raises:
        InputError: outside the interval or not a number.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value >= 0 if closed_low else value > 0) and (value <= 1 if closed_high else value < 1)
    if not ok:
        lo, hi = "[" if closed_low else "(", "]" if closed_high else ")"
        raise InputError(f"{name} must be in {lo}0, 1{hi}, got {value!r}")
    return float(value)
