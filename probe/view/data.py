"""Data of the interactive head view: one example's attention probabilities, rounded and packed.

What the page receives (JSON, inlined; :func:`view_data`):

- ``tokens``: readable labels (:func:`probe.text.tokens.display_tokens`), drawn as canvas text (never
  parsed as HTML).
- ``sides`` and ``axes``: the token sides (each ``tokens``, ``units``, ``unitLabels``; side 0 is
  ``tokens``) and, per included layer, its (query side, key side). A one-stack model has one side;
  an encoder-decoder model two: the source (0) and the decoder's input (1: its start token and
  the target), so that decoder self-attention is drawn target x target and cross-attention
  target (queries) x source (keys) (:func:`probe.loading.seq2seq.sides`).
- ``headNames[l][h]`` / ``layerTitles[l]``: display names (:func:`probe.sites.head_name`:
  ``L4H5``, ``enc L4H5``, ``dec L4H5``, ``cross L4H5``).
- ``maps[l][h]``: the [query, key] attention probabilities of head ``h`` of included layer ``l``,
  row-major, **rounded to 3 decimals and stored as integers in thousandths** (``scale`` = 1000, the
  precision of the report's heatmaps), with every run of zeros written as one negative number
  (-k = k zeros: the upper triangle of a causal map and the empty keys of a focused head cost one
  number per run). ``None`` marks a head that is not there (a removed head: its probabilities are
  NaN, :mod:`probe.pruning`).
- ``units`` (word-level mode): per token, the index of its unit; a unit is a word (all tokens with
  the same word id, :attr:`probe.text.inputs.Batch.word_ids`) or a token with no word (special tokens,
  whitespace-only tokens), each its own unit, so word-level rows still sum to 1 (docs/statistics.md,
  "Word-level attention"). The page aggregates: attention *to* a unit is the sum over its tokens,
  attention *from* a unit the mean over its tokens (:func:`word_attention` is the same in Python).

Size: the page holds layers x heads x n^2 numbers. A 512-token example of a 6 x 12 model is 19 M
numbers (about 40 MB of JSON), so a view keeps at most ``max_values`` numbers (default
:data:`MAX_VALUES`, at most about 8 MB of page): when all layers do not fit, it includes evenly
spaced layers (first and last among them, at least one) and says so in the view.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..sites import head_name, site_prefix

#: Probabilities are stored as integers in units of 1 / SCALE (3 decimals).
SCALE = 1000

#: Most numbers (layers x heads x n^2) one view holds; more layers than fit are left out (evenly spaced).
MAX_VALUES = 4_000_000

#: Lines are drawn for attention probabilities at or above this (the heatmap strip shows every weight).
LINE_THRESHOLD = 0.01


def zero_runs(values: np.ndarray) -> list[int]:
    """Encode non-negative integers with each run of zeros written as -(its length).

    Example: ``[5, 0, 0, 0, 7, 0]`` -> ``[5, -3, 7, -1]``. Decoding (the page's ``decode``): a
    non-negative number is one value, -k is k zeros.
    """
    x = np.asarray(values, dtype=np.int64).ravel()
    if x.size == 0:
        return []
    zero = x == 0
    edges = np.flatnonzero(np.diff(np.concatenate(([0], zero.view(np.int8), [0]))))
    starts, ends = edges[0::2], edges[1::2]
    out = x.copy()
    out[starts] = -(ends - starts)
    keep = ~zero
    keep[starts] = True
    return out[keep].tolist()


def decode_zero_runs(encoded: Sequence[int], size: int) -> np.ndarray:
    """Inverse of :func:`zero_runs`: [size] int array."""
    out = np.zeros(size, dtype=np.int64)
    p = 0
    for v in encoded:
        if v < 0:
            p -= v
        else:
            out[p] = v
            p += 1
    if p != size:
        raise ValueError(f"encoded data cover {p} values, expected {size}")
    return out


def word_units(word_ids: Sequence[int], labels: Sequence[str], text: str | None = None,
               offsets: Sequence[tuple[int, int]] | None = None) -> tuple[list[int], list[str]]:
    """Group tokens into units for word-level attention.

    Args:
        word_ids: per token, its word index (-1: no word: special or whitespace-only tokens).
        labels: per token, its display label (the label of a unit that is one token).
        text, offsets: the text and each token's characters, to label a word by the text it spans
            (else its tokens' labels are joined, WordPiece '##' markers removed).

    Returns:
        ``(unit_of_token, unit_labels)``: units numbered in order of their first token; every
        word is one unit, every token without a word its own unit.
    """
    unit_of_token: list[int] = []
    unit_labels: list[str] = []
    unit_of_word: dict[int, int] = {}
    members: list[list[int]] = []
    for t, w in enumerate(word_ids):
        w = int(w)
        if w >= 0 and w in unit_of_word:
            u = unit_of_word[w]
            members[u].append(t)
        else:
            u = len(members)
            members.append([t])
            if w >= 0:
                unit_of_word[w] = u
        unit_of_token.append(u)
    for toks in members:
        if int(word_ids[toks[0]]) < 0 or len(toks) == 1:
            unit_labels.append(labels[toks[0]])
            continue
        label = ""
        if text is not None and offsets is not None:
            start = min(offsets[t][0] for t in toks)
            end = max(offsets[t][1] for t in toks)
            label = text[start:end].strip()
        unit_labels.append(label or "".join(labels[t].removeprefix("##") for t in toks))
    return unit_of_token, unit_labels


def word_attention(probs: np.ndarray, unit_of_token: Sequence[int]) -> np.ndarray:
    """Word-level attention of one head (docs/statistics.md, "Word-level attention"; Clark et al. 2019).

    Args:
        probs: [query, key] attention probabilities (token level).
        unit_of_token: per token, its unit (:func:`word_units`).

    Returns:
        [units, units]: attention from unit u to unit v = mean over u's tokens (queries) of the sum
        over v's tokens (keys). Rows still sum to 1 when the token rows do.
    """
    units = np.asarray(unit_of_token)
    n_units = int(units.max()) + 1
    onehot = np.zeros((len(units), n_units))
    onehot[np.arange(len(units)), units] = 1.0
    to_units = np.asarray(probs, dtype=np.float64) @ onehot          # [query tokens, units]: sum over keys
    return (onehot.T @ to_units) / onehot.sum(0)[:, None]             # mean over the unit's queries


def choose_layers(n_layers: int, n_heads: int, n_tokens: int, max_values: int = MAX_VALUES) -> list[int]:
    """Layers a view can hold within ``max_values`` numbers: all if they fit, else evenly spaced
    layers (first and last included when two or more fit; at least one)."""
    per_layer = max(1, n_heads * n_tokens * n_tokens)
    k = max(1, min(n_layers, max_values // per_layer))
    if k >= n_layers:
        return list(range(n_layers))
    if k == 1:
        return [0]
    return sorted({int(round(i * (n_layers - 1) / (k - 1))) for i in range(k)})


def budget_note(layers: Sequence[int], n_layers: int, n_heads: int, n: int, max_values: int) -> str:
    """The note a view shows when it holds only some layers."""
    return (f"layers {', '.join(map(str, layers))} of {n_layers} included: all layers of {n} tokens would be "
            f"{n_layers * n_heads * n * n:,} numbers (the view holds at most {max_values:,}); "
            "choose others with layers=[...]")


def _side(tokens, word_ids=None, text=None, offsets=None, name: str = "") -> dict:
    """One side's labels and word units (units None without word ids)."""
    units = unit_labels = None
    if word_ids is not None and any(int(w) >= 0 for w in word_ids):
        units, unit_labels = word_units(word_ids, tokens, text, offsets)
    return {"name": name, "tokens": list(tokens), "units": units, "unitLabels": unit_labels}


def _names(sites, prefixed: bool, n_layers: int, n_heads: int, layer_names) -> tuple[list, list, list]:
    """Per entry of probs: the layer title, its heads' display names and its tooltip name."""
    titles, heads, names = [], [], []
    for x in range(n_layers):
        site = sites[x] if sites is not None else None
        if site is not None and prefixed:
            titles.append(f"{site_prefix(site.stack, site.kind)} layer {site.layer}")
            heads.append([head_name(site, h) for h in range(n_heads)])
        else:
            layer = site.layer if site is not None else x
            titles.append(f"layer {layer}")
            heads.append([head_name(layer, h) for h in range(n_heads)])
        names.append(str(layer_names[x]) if layer_names else site.name if site is not None else f"layer {x}")
    return titles, heads, names


def _selection(present, n_layers: int, n_heads: int, n: int, layers, layer, heads, max_values: int,
               notes: list[str]) -> tuple[list[int], int, list[int]]:
    """(included layers, index of the initial one, initial heads); layers chosen within
    ``max_values`` when not given (with a note appended to ``notes``).

    Raises:
        InputError: a layer that is not there, an initial layer not included, a head out of range.
    """
    if layers is None:
        layers = [x for x in choose_layers(n_layers, n_heads, n, max_values) if x in present] or present[:1]
        if len(layers) < n_layers:
            notes.append(budget_note(layers, n_layers, n_heads, n, max_values))
    layers = [int(x) for x in layers]
    if not layers or any(x not in present for x in layers):
        raise InputError(f"layers must be among {present} (the layers of the view), got {list(layers)}")
    if layer is not None and int(layer) not in layers:
        raise InputError(f"layer {layer} is not among the included layers {layers}")
    chosen = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    if any(not 0 <= h < n_heads for h in chosen):
        raise InputError(f"no head {next(h for h in chosen if not 0 <= h < n_heads)}: layers have heads "
                         f"0-{n_heads - 1}, got heads={list(heads)}")
    return layers, layers.index(int(layer)) if layer is not None else 0, chosen


def _pack(probs, layers, axes, sides, n_heads: int) -> tuple[list, list, int]:
    """Each included layer's maps rounded to 1 / SCALE and zero-run encoded (None: a removed head),
    the removed flags, and the number of values held.

    Raises:
        InputError: a map that is not [heads, query, key] with the lengths of its sides.
    """
    maps, removed, values = [], [], 0
    for li in layers:
        block = np.asarray(probs[li])
        qs, ks = axes[li]
        shape = (n_heads, len(sides[qs]["tokens"]), len(sides[ks]["tokens"]))
        if block.shape != shape:
            raise InputError(f"attention probabilities of layer {li} must be [heads, query, key] = {list(shape)}, "
                             f"got {list(block.shape)}")
        gone = np.isnan(block).all(axis=(1, 2))
        q = np.clip(np.rint(np.nan_to_num(block.astype(np.float64), nan=0.0) * SCALE), 0, SCALE).astype(np.int64)
        maps.append([None if gone[h] else zero_runs(q[h]) for h in range(n_heads)])
        removed.append([bool(g) for g in gone])
        values += block.size
    return maps, removed, values


def check_budget(layers: Sequence[int], values: int, max_values: int) -> None:
    """Refuse explicitly chosen layers that hold more numbers than the view's cap (the cap that
    chooses layers by itself when none are given).

    Raises:
        InputError: ``values`` > ``max_values``.
    """
    if values > max_values:
        raise InputError(f"layers {list(layers)} hold {values:,} numbers (layers x heads x query x key tokens); a view "
                         f"holds at most {max_values:,} (about 8 MB of page at the default): give fewer layers, or "
                         f"raise the cap with max_values={values}")


@dataclass(frozen=True)
class Alignment:
    """How side 0's tokens line up with its words and its text (:func:`view_data`'s ``alignment``).

    Fields:
        word_ids: per token (n of them), its word index (-1: none, e.g. a special token); None
            disables word-level mode (no ``units``).
        text: the example's text, to label each word by its characters (None: by its joined tokens).
        offsets: per token, its (start, end) character offsets into ``text`` (end exclusive).
    """

    word_ids: Sequence[int] | None = None
    text: str | None = None
    offsets: Sequence[tuple[int, int]] | None = None


@dataclass(frozen=True)
class Display:
    """What a head view shows beside the maps and how far it thins them (:func:`view_data`'s ``display``).

    Fields:
        max_values: a count of numbers (layers x heads x query x key) the view holds at most: without
            explicit ``layers`` the layers that fit are chosen (evenly spaced); explicit ``layers``
            beyond it are refused. Default :data:`MAX_VALUES`.
        threshold: a probability: lines are drawn for attention probabilities >= this
            (0 < threshold <= 1; the heatmap strip shows every weight). Default :data:`LINE_THRESHOLD`.
        title, note: text shown above the view ("": none).
        layer_names: a name per layer (site) of ``probs``, shown as a tooltip (None: the site name,
            ``encoder.3.self``).
        head_labels: (layer, head) -> label (e.g. ``previous-token``), shown beside each head; the
            layer is the position in ``probs`` (the site), never a layer number of a stack.
    """

    max_values: int = MAX_VALUES
    threshold: float = LINE_THRESHOLD
    title: str = ""
    note: str = ""
    layer_names: Sequence[str] | None = None
    head_labels: dict[tuple[int, int], str] | None = None


def view_data(probs, tokens: Sequence[str], *, alignment: Alignment | None = None,
              layers: Sequence[int] | None = None, layer: int | None = None, heads: Sequence[int] | None = None,
              causal: bool = False, sides: Sequence[dict] | None = None, axes: Sequence[tuple[int, int]] | None = None,
              sites: Sequence | None = None, prefixed: bool = False, display: Display | None = None) -> dict:
    """The JSON-ready data of one head view.

    Args:
        probs: per layer (site), the [heads, query, key] attention probabilities of one example
            (NaN for a removed head): a [layers, heads, n, n] array, or a list with None for
            layers that are not included.
        tokens: n display labels (side 0: the one input of a one-stack model, an
            encoder-decoder model's source).
        alignment: side 0's word ids, text and token offsets (:class:`Alignment`); None: no
            word-level mode.
        layers: layers to include (default: all that fit in ``display.max_values``, :func:`choose_layers`).
        layer, heads: the initial selection (default: the first included layer, all its heads).
        causal: the model is a decoder (keys after the query are masked).
        sides: further token sides, each a dict with ``tokens`` and optional ``word_ids``,
            ``text``, ``offsets``, ``name`` (an encoder-decoder model's target: side 1).
        axes: per layer (site), its (query side, key side) (default (0, 0) for every site):
            encoder self-attention (0, 0), decoder self-attention (1, 1), cross-attention (1, 0).
        sites: per layer, its :class:`probe.sites.Site` (names the layers and heads).
        prefixed: name heads with their site kind (``enc L4H5``; an encoder-decoder model).
        display: the values budget, line threshold, title, note, layer names and head labels
            (:class:`Display`; None: its defaults).

    Returns:
        A dict (see the module docstring); ``values`` counts the numbers held.

    Raises:
        InputError: an included layer's map is not [heads, query, key] with the lengths of its
            sides, a layer or head out of range, explicit ``layers`` holding more than
            ``max_values`` numbers, or a threshold outside (0, 1].
    """
    al, d = alignment or Alignment(), display or Display()
    word_ids, text, offsets = al.word_ids, al.text, al.offsets
    max_values, threshold, title, note = d.max_values, d.threshold, d.title, d.note
    n_layers = len(probs)
    all_sides = [_side(tokens, word_ids, text, offsets, "source" if sides else "")]
    all_sides += [_side(sd["tokens"], sd.get("word_ids"), sd.get("text"), sd.get("offsets"), sd.get("name", ""))
                  for sd in (sides or [])]
    axes = [tuple(map(int, a)) for a in axes] if axes is not None else [(0, 0)] * n_layers
    n = max(len(sd["tokens"]) for sd in all_sides)
    present = [x for x in range(n_layers) if probs[x] is not None]
    if not present:
        raise InputError("no attention probabilities to show")
    n_heads = int(np.shape(probs[present[0]])[0])
    if not (isinstance(threshold, (int, float)) and 0 < threshold <= 1):
        raise InputError(f"line threshold must be in (0, 1], got {threshold!r}")
    notes = [note] if note else []
    explicit = layers is not None
    layers, first, chosen = _selection(present, n_layers, n_heads, n, layers, layer, heads, max_values, notes)
    maps, removed, values = _pack(probs, layers, axes, all_sides, n_heads)
    if explicit:
        check_budget(layers, values, max_values)
    titles, head_names, names = _names(sites, prefixed, n_layers, n_heads, d.layer_names)
    head_labels = d.head_labels or {}
    side0 = all_sides[0]
    return {
        "version": 2, "n": len(side0["tokens"]), "tokens": side0["tokens"], "layers": layers, "heads": n_heads,
        "scale": SCALE, "layerNames": [names[x] for x in layers], "layerTitles": [titles[x] for x in layers],
        "headNames": [head_names[x] for x in layers],
        "headLabels": [[head_labels.get((x, h), "") for h in range(n_heads)] for x in layers],
        "maps": maps, "removed": removed, "units": side0["units"], "unitLabels": side0["unitLabels"],
        "sides": all_sides, "axes": [list(axes[x]) for x in layers],
        "initial": {"layer": first, "heads": [h for h in chosen if not removed[first][h]]},
        "threshold": float(threshold), "title": title, "notes": notes, "causal": bool(causal),
        "values": int(values),
    }


def axis_tokens(data: dict, layer_index: int) -> tuple[list[str], list[str]]:
    """(query tokens, key tokens) of an included layer of a view's data: its rows and columns."""
    qs, ks = data["axes"][layer_index]
    return data["sides"][qs]["tokens"], data["sides"][ks]["tokens"]


def decoded_map(data: dict, layer_index: int, head: int) -> np.ndarray:
    """[query, key] probabilities of one head as the page holds them (rounded to 1 / SCALE); NaN if
    removed."""
    nq, nk = (len(t) for t in axis_tokens(data, layer_index))
    enc = data["maps"][layer_index][head]
    if enc is None:
        return np.full((nq, nk), math.nan)
    return decode_zero_runs(enc, nq * nk).reshape(nq, nk) / data["scale"]
