"""Checks of numbers and texts given by a user: counts, limits, tolerances, fractions, non-empty
texts. The part of :mod:`probe.validate` that needs no heavy library: the command line checks its
options with it before torch, transformers or pandas are imported (``probe.validate`` re-exports
every function here).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Sequence

from .errors import InputError, UnsupportedAnalysisError
from .rules import validate_thresholds

#: Parameter dtypes a model can be loaded in (``--dtype``, ``load_model(dtype=...)``); here, where the
#: command line reads it without importing torch.
DTYPES = ("float32", "bfloat16", "float16")


def shown(value) -> str:
    """A refused value as the user typed it: JSON's spelling for true, false and null (a live request's
    body), ``repr`` for the rest."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(value)


def positive_int(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``.

    Raises:
        InputError: not an integer, or below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputError(f"{name} must be an integer, got {shown(value)}")
    if value < minimum:
        raise InputError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def limit(value: int | None) -> int | None:
    """``--limit``: None (no limit) or an int >= 1."""
    return None if value is None else positive_int("--limit", value)


def max_length(value: int | None, model_limit: int, option: str = "max length") -> int:
    """The token limit per sequence: ``value`` as given (default: the model's limit), never changed;
    ``option`` names it in the error (``--max-tokens`` for ``probe live``).

    Raises:
        InputError: ``value`` below 2 (a sequence needs at least two tokens to have attention to
            measure), or above the model's limit (its position table, or its tokenizer's
            ``model_max_length``): one line naming both.
    """
    if value is None:
        return model_limit
    positive_int(f"{option} (tokens)", value, 2)
    if int(value) > model_limit:
        raise InputError(f"{option} {int(value)} tokens is above the model's limit of {model_limit} tokens "
                         "(its position table or its tokenizer's model_max_length); give at most that")
    return int(value)


def texts(items: Iterable, what: str = "text") -> list:
    """A non-empty list of non-empty texts (strings or objects with a ``text`` attribute).

    Raises:
        InputError: no text, or an empty or whitespace-only one (numbered from 1 where a list was given).
    """
    one = isinstance(items, str)
    items = [items] if one else list(items)
    if not items:
        raise InputError(f"no {what} given")
    for i, t in enumerate(items):
        s = t if isinstance(t, str) else getattr(t, "text", None)
        if not isinstance(s, str) or not s.strip():
            raise InputError(f"{what} is empty" if one else f"{what} {i + 1} is empty")
    return items


def tolerance(name: str, value) -> float:
    """A comparison tolerance: a finite number >= 0.

    Raises:
        InputError: negative, NaN, infinite or not a number.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise InputError(f"{name} must be a finite number >= 0, got {shown(value)}")
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


def thresholds(values: dict | None) -> dict[str, float]:
    """Label thresholds (label -> number in (0, 1]; :data:`probe.rules.LABEL_RULES`).

    Raises:
        InputError: an unknown label or a value outside (0, 1].
    """
    try:
        validate_thresholds(values)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return {k: float(v) for k, v in (values or {}).items()}


#: The ablations of a head (:mod:`probe.effects.ablation`, ``--ablation``), in the order they are run.
ABLATION_KINDS = ("zero", "mean", "resample")


def ablation_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    """``kinds`` in :data:`ABLATION_KINDS` order, each once.

    Raises:
        InputError: none, or an unknown kind.
    """
    bad = [k for k in kinds if k not in ABLATION_KINDS]
    if bad or not kinds:
        raise InputError(f"unknown ablation {', '.join(map(repr, bad)) or '(none)'}; choose from "
                         f"{', '.join(ABLATION_KINDS)}")
    return tuple(k for k in ABLATION_KINDS if k in kinds)


#: A head's name (``L5H1``: layer and head, 0-based), and a receiver's input (``L9H6.q``, ``L9KV1.k``).
HEAD_NAME = re.compile(r"L(\d+)H(\d+)")
INPUT_NAME = re.compile(r"L(\d+)(H|KV)(\d+)\.(q|k|v)")


def head_names(option: str, text: str) -> None:
    """The form of ``--senders`` (``L5H1,L5H2``) or ``--receivers`` (``logits``, ``L9H6.q``, ``L9KV1.k``),
    before any model is loaded (whether each name exists is checked once the model is there).

    Raises:
        InputError: an empty list, or a name of another form.
    """
    form = HEAD_NAME if option == "--senders" else INPUT_NAME
    for part in (p.strip() for p in text.split(",")):
        if not (form.fullmatch(part) or (option == "--receivers" and part == "logits")):
            example = "L5H1,L5H2" if option == "--senders" else "logits,L9H6.q,L9H6.k,L9KV1.v"
            raise InputError(f"{option}: {part!r} is not a name of that form ({example})")


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


#: The orders heads are pruned in (:mod:`probe.pruning.curves`, ``--order``).
PRUNING_ORDERS = ("importance", "redundancy", "random")

#: What ``probe patch --component`` patches (:data:`probe.effects.components.COMPONENTS`, same names).
COMPONENT_NAMES = ("z", "q", "k", "v", "pattern", "resid", "mlp")


def components(text: str) -> tuple[str, ...]:
    """``--component``: comma-separated names of :data:`COMPONENT_NAMES`, in the order given, each once.

    Raises:
        InputError: an unknown or empty name.
    """
    names = [n.strip() for n in text.split(",")]
    bad = [n for n in names if n not in COMPONENT_NAMES]
    if not names or bad:
        raise InputError(f"--component {text!r}: comma-separated, from {', '.join(COMPONENT_NAMES)}")
    return tuple(dict.fromkeys(names))


def int_range(name: str, value, low: int, high: int) -> int:
    """``value`` as an int in [``low``, ``high``].

    Raises:
        InputError: not an integer, or outside the range.
    """
    positive_int(name, value, low)
    if value > high:
        raise InputError(f"{name} must be at most {high}, got {value}")
    return int(value)


def choice(name: str, value, choices: Sequence[str]) -> str:
    """``value``, one of ``choices``.

    Raises:
        InputError: another value.
    """
    if value not in choices:
        raise InputError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def listed(value) -> list[str]:
    """A comma-separated string (an option as typed) or a sequence of strings, as a list of stripped items."""
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(item).strip() for item in items if str(item).strip()]


def pruning_orders(value) -> tuple[str, ...]:
    """``--order``: distinct orders of :data:`PRUNING_ORDERS`, comma-separated or a sequence, in the order given.

    Raises:
        InputError: none, an unknown or a repeated order.
    """
    orders = listed(value)
    if not orders or any(o not in PRUNING_ORDERS for o in orders) or len(set(orders)) != len(orders):
        shown = value if isinstance(value, str) else ",".join(map(str, value))
        raise InputError(f"{shown!r}: a comma-separated list of distinct orders from {', '.join(PRUNING_ORDERS)}")
    return tuple(orders)


def shares(value) -> tuple[float, ...]:
    """``--shares``: numbers in (0, 1], comma-separated or a sequence.

    Raises:
        InputError: none, a value that is not a number, or one outside (0, 1].
    """
    if isinstance(value, str):
        try:
            numbers_ = [float(v) for v in value.split(",") if v.strip()]
        except ValueError:
            numbers_ = []
    else:
        numbers_ = list(value)
    if not numbers_:
        raise InputError(f"--shares must be comma-separated numbers in (0, 1], got {value!r}")
    return tuple(fraction("--shares", v, closed_high=True) for v in numbers_)


#: The site kinds that may start a ``probe why --head`` (an encoder-decoder model's stacks and cross-attention).
HEAD_PREFIXES = ("enc", "dec", "cross")


def head_form(value: str) -> str:
    """The form of ``probe why --head`` (L5H1, or with an encoder-decoder model's site kind first: cross
    L5H1), before any model is loaded (whether it exists is checked once it is).

    Raises:
        InputError: another form.
    """
    text = value if isinstance(value, str) else ""
    prefix, _, rest = text.strip().partition(" ")
    name = (rest if prefix.lower() in HEAD_PREFIXES and rest else text).strip().upper()
    if not (name.startswith("L") and "H" in name[1:] and name[1:].replace("H", "", 1).isdigit()):
        raise InputError(f"{value!r} is not a head of the form L5H1 (layer and head, 0-based; an encoder-decoder "
                         "model's cross-attention head: 'cross L5H1')")
    return value


def why_head_kind(value: str) -> None:
    """Refuse a ``probe why --head`` that names a self-attention head of an encoder-decoder model (``enc
    L0H1``, ``dec L0H1``), from the name alone, before torch is imported and any config is read (the
    command answers in a fraction of a second; reading the config first cost the 2 s of torch's import,
    and loading the model 26 s on whisper-tiny-en). Such a head is refused on every model: probe why
    splits an encoder-decoder model's cross-attention heads (``cross L0H1``) and other models' heads
    (``L0H1``); the loaded model's check (:func:`probe.qk.score.check_cross`) says the same.

    Args:
        value: as ``--head`` gives it (its form already checked by :func:`head_form`).

    Raises:
        UnsupportedAnalysisError: an ``enc`` or ``dec`` head.
    """
    prefix, _, rest = str(value).strip().partition(" ")
    kind = prefix.lower()
    if kind in ("enc", "dec") and rest.strip():
        raise UnsupportedAnalysisError(f"why: {value!r} is a self-attention head of an encoder-decoder model; probe "
                                       "splits the scores of its cross-attention heads (cross L0H1), and of other "
                                       f"models' heads (L0H1); {kind} self-attention heads are not split yet")


def image_size(value) -> tuple[int, int] | None:
    """``--image-size``: ``"224x320"`` or ``(224, 320)`` as (height, width) in pixels; None stays None.

    Raises:
        InputError: not two positive whole numbers joined by ``x``.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        if (isinstance(value, (tuple, list)) and len(value) == 2
                and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in value)):
            return int(value[0]), int(value[1])
        value = "x".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", value)
    if not m or not int(m.group(1)) or not int(m.group(2)):
        raise InputError(f"--image-size must be HEIGHTxWIDTH in pixels, e.g. 224x320; got {value!r}")
    return int(m.group(1)), int(m.group(2))


def path_reads(senders: str, receivers: str) -> None:
    """Refuse a receiver head that reads none of the senders (``probe path``'s ``--senders`` and
    ``--receivers``, from the names alone). A head reads the stream as it enters its layer, which holds
    the outputs of the layers below only, so a receiver at or below the layer of every sender gets exactly
    0 from each of them, in every row it is in (``logits`` read everything).

    Args:
        senders, receivers: as ``--senders`` and ``--receivers`` give them (names of another form are
            left to :func:`head_names`).

    Raises:
        InputError: a receiver at or below every sender's layer (naming both).
    """
    heads = [(int(m[1]), int(m[2]), m[0])  # (layer, head, the name as typed)
             for m in map(HEAD_NAME.fullmatch, (p.strip() for p in senders.split(","))) if m]
    if not heads:
        return
    lowest = min(heads)
    for part in (p.strip() for p in receivers.split(",")):
        m = INPUT_NAME.fullmatch(part)
        if m is not None and int(m[1]) <= lowest[0]:
            raise InputError(f"--receivers: {part} reads nothing the senders write: it is at layer {int(m[1])} and "
                             f"the lowest sender, {lowest[2]}, at layer {lowest[0]} (a head reads only "
                             "what the layers below it wrote), so every effect into it would be exactly 0; choose "
                             "receivers above a sender, or logits")
