"""The attention of a few images kept for pictures: one query row per head and layer, and the
head-averaged maps that attention rollout (:mod:`probe.measures.rollout`) multiplies and attention flow
(:mod:`probe.measures.flow`) takes as capacities.

Flow costs one maximum flow per key for the drawn row (T solves on a graph of (L + 1) T nodes and
up to L T^2 edges), T^2 for the mean over every query row. Measured on this project's 2-core
machine (one thread, other jobs running): a 12-layer ViT-B/16 grid at 224 pixels (197 tokens,
dense maps) takes 0.06 s per solve, about 12 s for the class token's row (34 s with the machine
loaded); the cost grows as T^3.
Hence :data:`MAX_FLOW_SOLVES`: above it the flow is left out and the pictures say why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..measures.accumulators import Accumulator
from ..measures.flow import flow_values, normalise_rows
from ..measures.rollout import residual_maps, rollout_matrix
from ..sites import Site
from ..text.inputs import Batch

#: Most maximum-flow solves drawn per image (T for one query row, T^2 for the mean over queries):
#: one row of a 320-token grid (ViT-B/16 and DINOv2-B/14 at 224 pixels are 197 and 257 tokens).
MAX_FLOW_SOLVES = 320


@dataclass
class ImageExample:
    """One image with the attention drawn over it.

    Attributes:
        index: position of the image among the inputs.
        name: its file name (or ``image N``).
        pixels: [height, width, 3] uint8, the image as the model saw it (resized).
        grid: (rows, columns) of patches.
        specials: names of the special tokens before the patches.
        query: the query row drawn: a token position (0: ``[CLS]``), or None for the mean over every
            query row (models without a class token).
        rows: [layers, heads, T] float32, the query row's attention over every key, per layer and head.
        means: [layers, T, T] float64, each layer's map averaged over its heads (for rollout and flow).
        flow_limit: most maximum-flow solves :meth:`flow` runs (:data:`MAX_FLOW_SOLVES`).
    """

    index: int
    name: str
    pixels: np.ndarray
    grid: tuple[int, int]
    specials: tuple[str, ...]
    query: int | None
    rows: np.ndarray
    means: np.ndarray
    flow_limit: int = MAX_FLOW_SOLVES
    _flow: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def query_name(self) -> str:
        """What the drawn row is, in words (``[CLS]``, ``patch (r, c)``, ``mean over queries``)."""
        if self.query is None:
            return "mean over queries"
        s = len(self.specials)
        if self.query < s:
            return self.specials[self.query]
        r, c = divmod(self.query - s, self.grid[1])
        return f"patch ({r}, {c})"

    def patches(self, row: np.ndarray) -> np.ndarray:
        """[rows, columns] the patch part of a row over every key ([T]), on the grid (p = r * C + c)."""
        return np.asarray(row)[len(self.specials):].reshape(self.grid)

    def rollout(self) -> np.ndarray:
        """[T] the drawn query's row of attention rollout (:func:`probe.measures.rollout.rollout_matrix` on
        ``A~_l = 0.5 * mean_h A_l + 0.5 * I``); for the mean over queries, the mean of R's rows."""
        r = rollout_matrix(residual_maps(self.means[:, None]))
        return r.mean(0) if self.query is None else r[self.query]

    @property
    def flow_solves(self) -> int:
        """Maximum-flow solves :meth:`flow` needs: T for one query row, T^2 for the mean over queries."""
        T = self.means.shape[-1]
        return T if self.query is not None else T * T

    def flow(self) -> np.ndarray | None:
        """[T] the drawn query's row of attention flow (:func:`probe.measures.flow.flow_values` on the
        same ``A~_l`` as :meth:`rollout`, the row divided by its sum; Abnar & Zuidema 2020, sec. 3); for
        the mean over queries, the mean of the normalised rows. None when it needs more than
        :attr:`flow_limit` solves (:attr:`flow_solves`). Computed once, then kept."""
        if self.flow_solves > self.flow_limit:
            return None
        if "row" not in self._flow:
            tilde = residual_maps(self.means[:, None])
            rows = None if self.query is None else [self.query]
            flow = normalise_rows(flow_values(tilde, rows))
            self._flow["row"] = flow.mean(0) if self.query is None else flow[self.query]
        return self._flow["row"]

    def flow_note(self) -> str:
        """Why the flow is not drawn ('' when it is)."""
        if self.flow_solves <= self.flow_limit:
            return ""
        what = "the mean over every query row" if self.query is None else f"{self.query_name}'s row"
        return (f"flow left out: {what} needs {self.flow_solves} maximum-flow solves over "
                f"{self.means.shape[-1]} tokens, above the limit of {self.flow_limit}")


class ImageMaps(Accumulator):
    """Keeps, for the first ``n`` images, one query row per layer and head and the head means.

    Args:
        sites: the model's sites (self-attention, first layer first).
        specials: names of the special tokens before the patches.
        n: images kept.
        query: the token position drawn (default: ``[CLS]`` where the model has one, else the mean
            over every query row); a (row, column) pair picks a patch.
        flow_limit: most maximum-flow solves per image for its flow (:data:`MAX_FLOW_SOLVES`).
    """

    name = "image_maps"
    title = "image attention pictures"
    model_kinds = ("encoder",)
    site_kinds = ("self",)

    def __init__(self, sites: list[Site], specials: tuple[str, ...], n: int = 2, query=None,
                 flow_limit: int = MAX_FLOW_SOLVES) -> None:
        self.sites = [s for s in sites if s.kind == "self"]
        self.specials = tuple(specials)
        self.n, self.query, self.flow_limit = n, query, flow_limit
        self.kept: dict[int, dict] = {}

    def _query(self, grid: tuple[int, int]) -> int | None:
        if isinstance(self.query, (tuple, list)):
            r, c = self.query
            return len(self.specials) + int(r) * grid[1] + int(c)
        if self.query is not None:
            return int(self.query)
        return self.specials.index("[CLS]") if "[CLS]" in self.specials else None

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, rows=None) -> None:
        """Keep the rows and head means of the chosen images in ``batch`` (probs [batch, heads, T, T])."""
        if site not in self.sites or not hasattr(batch, "grid"):
            return
        q = self._query(batch.grid)
        for row, idx in enumerate(batch.index):
            if idx >= self.n:
                continue
            if idx not in self.kept:
                self.kept[idx] = {"name": batch.texts[row].text, "pixels": batch.images[row], "grid": batch.grid,
                                  "query": q, "rows": [], "means": []}
            a = probs[row].double().cpu().numpy()  # [heads, T, T]
            present = ~np.isnan(a).all(axis=(-2, -1))
            self.kept[idx]["rows"].append((a[:, q] if q is not None else a.mean(1)).astype(np.float32))
            self.kept[idx]["means"].append(a[present].mean(0))

    def merge(self, other: ImageMaps) -> ImageMaps:
        for idx, kept in other.kept.items():
            self.kept.setdefault(idx, kept)
        return self

    def result(self) -> list[ImageExample]:
        """The kept images, in input order."""
        return [ImageExample(idx, k["name"], k["pixels"], k["grid"], self.specials, k["query"], np.stack(k["rows"]),
                             np.stack(k["means"]), self.flow_limit) for idx, k in sorted(self.kept.items())]
