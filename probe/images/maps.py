"""The attention of a few images kept for pictures: one query row per head and layer, and the
head-averaged maps that attention rollout multiplies (:mod:`probe.measures.rollout`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..measures.accumulators import Accumulator
from ..measures.rollout import residual_maps, rollout_matrix
from ..sites import Site
from ..text.inputs import Batch


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
        means: [layers, T, T] float64, each layer's map averaged over its heads (for rollout).
    """

    index: int
    name: str
    pixels: np.ndarray
    grid: tuple[int, int]
    specials: tuple[str, ...]
    query: int | None
    rows: np.ndarray
    means: np.ndarray

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


class ImageMaps(Accumulator):
    """Keeps, for the first ``n`` images, one query row per layer and head and the head means.

    Args:
        sites: the model's sites (self-attention, first layer first).
        specials: names of the special tokens before the patches.
        n: images kept.
        query: the token position drawn (default: ``[CLS]`` where the model has one, else the mean
            over every query row); a (row, column) pair picks a patch.
    """

    name = "image_maps"
    title = "image attention pictures"
    model_kinds = ("encoder",)
    site_kinds = ("self",)

    def __init__(self, sites: list[Site], specials: tuple[str, ...], n: int = 2, query=None) -> None:
        self.sites = [s for s in sites if s.kind == "self"]
        self.specials = tuple(specials)
        self.n, self.query = n, query
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
                             np.stack(k["means"])) for idx, k in sorted(self.kept.items())]
