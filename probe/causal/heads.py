"""Head numbers checked against a model, as every entry point that takes heads checks them: a layer or
head outside the model is refused with the valid ranges, a negative number is never wrapped, and a
per-head mask of another size is never broadcast or ignored."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import InputError
from ..sites import head_name


def head_ranges(n_layers: int, n_heads: int) -> str:
    """The valid head numbers of a model, as every refusal of a head names them: ``layers 0-1 and heads 0-3``."""
    return f"layers 0-{n_layers - 1} and heads 0-{n_heads - 1}"


def normalize_heads(heads, n_layers: int, n_heads: int) -> dict[int, tuple[int, ...]]:
    """Heads as ``{layer: (head, ...)}`` (original numbering, sorted, no empty layers), each checked
    against the model: a negative number is refused, never wrapped.

    Args:
        heads: ``{layer: [head, ...]}`` or an iterable of ``(layer, head)`` pairs.
        n_layers: layers (sites) of the model.
        n_heads: heads per layer.

    Raises:
        InputError: not integers, or a layer or head out of range (naming :func:`head_ranges`).
    """
    pairs = ([(layer, h) for layer, hs in heads.items() for h in hs] if isinstance(heads, Mapping)
             else [tuple(p) for p in heads])
    out: dict[int, set[int]] = {}
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair):
            raise InputError(f"heads must be {{layer: [head, ...]}} or (layer, head) pairs of integers, got {pair!r}")
        layer, head = pair
        if not 0 <= layer < n_layers:
            raise InputError(f"layer {layer} out of range: the model has {head_ranges(n_layers, n_heads)}")
        if not 0 <= head < n_heads:
            raise InputError(f"head {head_name(layer, head)} out of range: layers have heads 0-{n_heads - 1} "
                             f"(the model has {head_ranges(n_layers, n_heads)})")
        out.setdefault(layer, set()).add(head)
    return {layer: tuple(sorted(hs)) for layer, hs in sorted(out.items()) if hs}


def table_heads(table, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """The ``(layer, head)`` pair of each row of a heads table, in row order, each checked as
    :func:`normalize_heads` checks it.

    Args:
        table: a DataFrame with integer-valued ``layer`` and ``head`` columns.
        n_layers: layers (sites) of the model.
        n_heads: heads per layer.

    Raises:
        InputError: no ``layer`` or ``head`` column, a value that is not a whole number, or a head
            outside the model.
    """
    missing = [c for c in ("layer", "head") if c not in table]
    if missing:
        raise InputError(f"a heads table needs the columns layer and head (missing: {', '.join(missing)})")
    pairs = []
    for layer, head in zip(table["layer"].tolist(), table["head"].tolist()):
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and float(x).is_integer()
                   for x in (layer, head)):
            raise InputError(f"a heads table's layer and head must be whole numbers, got ({layer!r}, {head!r})")
        pairs.append((int(layer), int(head)))
    normalize_heads(pairs, n_layers, n_heads)
    return pairs


def check_head_mask(mask, n_layers: int, n_heads: int, what: str = "head mask") -> None:
    """Refuse a per-head mask or gate tensor that does not have one entry per head of the model.

    A [..., layers, heads] tensor of another size would be broadcast, or its extra layers never
    read: a silent no-op or a wrong head. Its last two dimensions must be exactly
    ``[n_layers, n_heads]``.

    Args:
        mask: a tensor [..., layers, heads] (bool mask or float gates).
        n_layers: layers (sites) of the model.
        n_heads: heads per layer.
        what: the name used in the message.

    Raises:
        InputError: fewer than two dimensions or other sizes, naming :func:`head_ranges`.
    """
    shape = list(getattr(mask, "shape", ()))
    if len(shape) < 2 or shape[-2:] != [n_layers, n_heads]:
        raise InputError(f"{what} of shape {shape} does not fit the model: it has {head_ranges(n_layers, n_heads)}, "
                         f"so a mask ends in [layers, heads] = [{n_layers}, {n_heads}]")
