"""The model view: every head of every site as a small thumbnail of one example's attention map
(layers x heads; an encoder-decoder model gets one grid per site kind: encoder self-attention,
decoder self-attention, cross-attention with its rectangular target x source shape), each bordered
in its primary label's colour; clicking a thumbnail opens that head in the head view beside it.
Bertviz's model view, offline and under the report's policy (:data:`probe.view.assets.VIEW_CSP`).

A thumbnail is the map cut into blocks of ``block`` x ``block`` tokens (``block`` = ceil(longest
side / :data:`THUMB_CELLS`); 1 for short texts, so every token is one cell), each cell holding the
block's largest probability, rounded to 1/255 (one byte per cell, base64 in the page). The largest,
not the mean, so that a one-token-wide diagonal stays visible at 512 tokens.
"""

from __future__ import annotations

import base64
import html
import math
import uuid

import numpy as np
import torch

from ..report.page import LABEL_COLORS, json_for_script, label_family
from ..runfolder import replace_file
from ..sites import head_name
from ..util import plural
from .assets import view_page, view_static
from .html import HeadView, example_maps, render_fragment, result_view, site_labels

#: Most cells along a thumbnail's longer side.
THUMB_CELLS = 32
#: Levels of a cell's value (one byte): values are rounded to 1/LEVELS.
LEVELS = 255
#: Grid titles by site kind (stack, kind) of an encoder-decoder model.
GRID_TITLES = {("encoder", "self"): "encoder self-attention", ("decoder", "self"): "decoder self-attention",
               ("decoder", "cross"): "cross-attention (target x source)"}


def pool_map(m: np.ndarray, cells: int = THUMB_CELLS) -> tuple[np.ndarray, int]:
    """One head's map [query, key] -> (block maxima [ceil(query / b), ceil(key / b)], b), with
    b = ceil(max(query, key) / cells) (1: the map itself)."""
    nq, nk = m.shape
    b = max(1, math.ceil(max(nq, nk) / cells))
    rq, rk = math.ceil(nq / b), math.ceil(nk / b)
    padded = np.zeros((rq * b, rk * b), dtype=np.float32)
    padded[:nq, :nk] = m
    return padded.reshape(rq, b, rk, b).max(axis=(1, 3)), b


def pool_maps(m: np.ndarray, cells: int = THUMB_CELLS) -> tuple[np.ndarray, int]:
    """:func:`pool_map` of every head at once: maps [heads, query, key] -> (block maxima [heads,
    ceil(query / b), ceil(key / b)], b), each head's the same as :func:`pool_map` gives it."""
    H, nq, nk = m.shape
    b = max(1, math.ceil(max(nq, nk) / cells))
    rq, rk = math.ceil(nq / b), math.ceil(nk / b)
    if b == 1:
        return m.astype(np.float32, copy=True), 1
    padded = np.zeros((H, rq * b, rk * b), dtype=np.float32)
    padded[:, :nq, :nk] = m
    out = padded[:, ::b, ::b].copy()  # the maximum of the b x b strided views: a block's maximum, NaN kept
    for i in range(b):
        for j in range(b):
            if i or j:
                np.maximum(out, padded[:, i::b, j::b], out=out)
    return out, b


def model_view_data(maps, sites, *, head_labels: dict | None = None, title: str = "",
                    target: str | None = None, shown: list[int] | None = None,
                    cells: int = THUMB_CELLS) -> dict:
    """What the model view's page receives.

    Args:
        maps: per site, [heads, query, key] probabilities (numpy or torch).
        sites: the :class:`~probe.sites.Site` of each map, in forward order.
        head_labels: (site index, head) -> primary label (:func:`probe.view.html.site_labels`).
        title: shown above the grids. target: the element id of the head view a click opens
            the head in (None: no head view). shown: the site indices that head view holds.
        cells: most cells along a thumbnail's longer side.

    Returns:
        A JSON-ready dict: ``grids`` (one per site kind: ``title``, ``sites``), ``sites`` (per site:
        ``name``, ``layer``, ``rows``, ``cols``, ``block``, ``nq``, ``nk``, ``heads`` (base64 bytes,
        row-major, value = round(LEVELS * block max)), ``labels``, ``names``), ``levels``, ``colors``.

    Raises:
        ValueError: no maps, or maps and sites of different lengths (a programming mistake).
    """
    if not maps or len(maps) != len(sites):
        raise ValueError(f"the model view needs one map per site; got {len(maps)} maps for {len(sites)} sites")
    labels = head_labels or {}
    prefixed = len({(s.stack, s.kind) for s in sites}) > 1
    out_sites, grids = [], {}
    for x, (m, site) in enumerate(zip(maps, sites)):
        m = m.float().cpu().numpy() if isinstance(m, torch.Tensor) else np.asarray(m, dtype=np.float32)
        pooled, block = pool_maps(m, cells)  # [heads, rows, cols], every head at once
        shape, block = (pooled.shape[1:], block) if len(pooled) else ((0, 0), 1)
        cells_01 = np.nan_to_num(np.clip(pooled, 0, 1), nan=0.0)  # a removed head (NaN map) draws empty
        levels = np.rint(cells_01 * LEVELS).astype(np.uint8)
        thumbs = [base64.b64encode(levels[h].tobytes()).decode() for h in range(m.shape[0])]
        names = [head_name(site if prefixed else site.layer, h) for h in range(m.shape[0])]
        out_sites.append({"name": site.name, "layer": site.layer, "rows": int(shape[0]), "cols": int(shape[1]),
                          "block": int(block), "nq": int(m.shape[1]), "nk": int(m.shape[2]), "heads": thumbs,
                          "names": names, "labels": [labels.get((x, h), "") for h in range(m.shape[0])]})
        key = (site.stack, site.kind)
        grids.setdefault(key, {"title": GRID_TITLES.get(key, "") if prefixed else "", "sites": []})["sites"].append(x)
    return {"version": 1, "title": title, "grids": list(grids.values()), "sites": out_sites, "levels": LEVELS,
            "colors": {k: v for k, v in LABEL_COLORS.items()}, "target": target,
            "shown": list(range(len(sites))) if shown is None else list(shown),
            "families": {lab: label_family(lab) for s in out_sites for lab in s["labels"] if lab}}


def render_model_view(data: dict, view_id: str | None = None) -> str:
    """The model view as an HTML fragment (``static/modelview.js`` mounts it; tokens never appear)."""
    view_id = view_id or f"probe-mv-{uuid.uuid4().hex[:12]}"
    return (f'<div class="probe-mv" id="{html.escape(view_id)}"><style>{view_static("modelview.css")}</style>'
            f'<div class="mv-fallback">probe model view: its script has not run (in Jupyter, run the cell or '
            f'trust the notebook).</div>'
            f'<script type="application/json" class="probe-mv-data">{json_for_script(data)}</script>'
            f'<script>{view_static("modelview.js")}</script></div>')


class ModelView:
    """A model view with the head view its clicks open (Jupyter: ``_repr_html_``; ``.save(path)``).

    Attributes:
        data: the model view's data (:func:`model_view_data`); head_view: the :class:`HeadView`.
    """

    def __init__(self, data: dict, head_view: HeadView, head_view_id: str) -> None:
        self.data, self.head_view, self.head_view_id = data, head_view, head_view_id

    def _repr_html_(self) -> str:
        return render_model_view(self.data) + render_fragment(self.head_view.data, self.head_view_id)

    def save(self, path):
        """Write a whole offline page with the model view and its head view; return its path."""
        return replace_file(path, view_page(self._repr_html_(), self.data.get("title") or "probe model view"))

    def __repr__(self) -> str:
        n = sum(len(s["heads"]) for s in self.data["sites"])
        return f"ModelView({plural(len(self.data['sites']), 'site')}, {plural(n, 'head')})"


def build_model_view(maps, sites, head_view: HeadView, *, heads_table=None, cells: int = THUMB_CELLS) -> ModelView:
    """The model view of one text's (or one example's) maps, with the head view a click opens.

    Args:
        maps: per site, [heads, query, key] probabilities (numpy or torch), every site.
        sites: the :class:`~probe.sites.Site` of each map, in forward order.
        head_view: the :class:`HeadView` of the same text (its title is the model view's).
        heads_table: a heads DataFrame whose primary labels colour the borders (None: no colours).
        cells: most cells per thumbnail side.

    Raises:
        ValueError: no maps, or maps and sites of different lengths (a programming mistake).
    """
    hv_id = f"probe-hv-{uuid.uuid4().hex[:12]}"
    data = model_view_data(maps, sites, head_labels=site_labels(heads_table, sites),
                           title=head_view.data.get("title", ""), target=hv_id, shown=head_view.data["layers"],
                           cells=cells)
    return ModelView(data, head_view, hv_id)


def result_model_view(result, *, tokenizer=None, example: int = 0, heads_table=None,
                      cells: int = THUMB_CELLS) -> ModelView:
    """The model view of an analysis example (its maps as the analysis kept them; nothing runs).

    Args:
        result: an analysis result (:class:`probe.records.AnalysisResult`, or one read back).
        tokenizer: for a result without stored token labels. example: which example of the result.
        heads_table: a heads DataFrame whose primary labels colour the borders (default: the result's own).
        cells: most cells per thumbnail side.

    Raises:
        InputError: an example that was not kept.
    """
    hv = result_view(result, tokenizer=tokenizer, example=example)
    maps, sites = example_maps(result.examples[example], bool(result.model.get("causal")))
    return build_model_view(maps, sites, hv, heads_table=result.heads if heads_table is None else heads_table,
                            cells=cells)
