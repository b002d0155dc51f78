"""Per-head measures of attention on an image's patch grid, and the labels vision work uses.

For each head, over the query rows that are patches (patch q at row r_q = q // C, column
c_q = q % C of an R x C grid), with A the row of probabilities over every key:

- ``grid_distance``: sum over patch keys k of A[q, k] * ||(r_q, c_q) - (r_k, c_k)||_2, divided by
  the row's patch mass sum_k A[q, k] (patches, Euclidean; rows with no patch mass are left out);
- ``cls_share``: A[q, CLS] (NaN for a model without a class token);
- ``register_share``: the sum over register tokens (NaN without registers);
- ``local_share``: the mass on the 8-neighbourhood of q and q itself;
- ``row_share`` / ``column_share``: the mass on the other patches of q's row / column;
- ``patch_share``: the mass on all patches.

Rows are averaged over every patch query row of every image, as the text statistics are
(:mod:`probe.measures.stats`). ``uniform_distance`` is the grid distance of uniform attention on the same
grids, the yardstick of the ``global`` label. The definitions: docs/images.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..architectures.vision import REGISTER
from ..measures.accumulators import Accumulator, present_heads
from ..sites import Site
from ..text.inputs import Batch

#: The measures, in column order.
MEASURES = ("grid_distance", "cls_share", "register_share", "local_share", "row_share", "column_share",
            "patch_share")
#: label -> (measure, bar): a head holds the label when the measure reaches the bar; ``global``
#: compares ``grid_distance / uniform_distance`` and needs a ``patch_share`` of at least 0.5.
GRID_LABELS: dict[str, tuple[str, float]] = {
    "cls-stripe": ("cls_share", 0.5),
    "register-sink": ("register_share", 0.5),
    "local": ("local_share", 0.5),
    "row": ("row_share", 0.5),
    "column": ("column_share", 0.5),
    "global": ("distance_ratio", 0.9),
}


def grid_geometry(rows: int, cols: int) -> dict[str, torch.Tensor]:
    """[P, P] float64 weights of an R x C grid (P = R * C, patch p at (p // C, p % C)): ``distance``
    (Euclidean, in patches), ``local`` (1 where |dr| <= 1 and |dc| <= 1, self included), ``row`` /
    ``column`` (1 on the other patches of the same row / column)."""
    p = torch.arange(rows * cols)
    r, c = (p // cols).double(), (p % cols).double()
    dr, dc = r[:, None] - r[None, :], c[:, None] - c[None, :]
    eye = torch.eye(rows * cols, dtype=torch.float64)
    return {"distance": torch.sqrt(dr ** 2 + dc ** 2), "local": ((dr.abs() <= 1) & (dc.abs() <= 1)).double(),
            "row": (dr == 0).double() - eye, "column": (dc == 0).double() - eye}


class GridAttention(Accumulator):
    """Per-head grid distance and CLS, register, local, row and column shares over patch query rows.

    Args:
        sites: the model's sites (an image encoder's self-attention layers).
        n_heads: heads per layer.
        specials: names of the special tokens before the patches (``lm.tokenizer.specials``:
            ``[CLS]``, ``[REG]`` ...).

    Batches must be image batches (:class:`probe.images.batches.ImageBatch`); others are skipped.
    """

    name = "grid"
    title = "attention on the patch grid"
    model_kinds = ("encoder",)
    site_kinds = ("self",)

    def __init__(self, sites: list[Site], n_heads: int, specials: tuple[str, ...]) -> None:
        self.sites = [s for s in sites if s.kind == "self"]
        self.n_heads = n_heads
        self.cls = specials.index("[CLS]") if "[CLS]" in specials else None
        self.registers = [i for i, s in enumerate(specials) if s == REGISTER]
        # per site: [heads, measures + uniform distance] sums, [heads, 2] counts (rows, rows with patch mass)
        self.sums = {s: np.zeros((n_heads, len(MEASURES) + 1)) for s in self.sites}
        self.counts = {s: np.zeros((n_heads, 2)) for s in self.sites}

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, rows=None) -> None:
        """Fold in one site's probabilities [batch, heads, T, T] of an image batch."""
        if site not in self.sums or not hasattr(batch, "grid"):
            return
        s, (R, C) = batch.n_special, batch.grid
        geo = batch.cached(("grid", R, C), lambda: grid_geometry(R, C))
        geo = {k: v.to(probs.device) for k, v in geo.items()}
        a = probs[:, :, s:, :].double()  # patch query rows, every key: [B, H, P, T]
        patch = a[..., s:]  # [B, H, P, P]
        mass = patch.sum(-1)
        has = mass > 0
        dist = torch.where(has, (patch * geo["distance"]).sum(-1) / mass.clamp_min(1e-300), 0.0)
        nan = torch.full_like(mass, float("nan"))
        cls = a[..., self.cls] if self.cls is not None else nan
        reg = a[..., self.registers].sum(-1) if self.registers else nan
        parts = [dist, cls, reg, (patch * geo["local"]).sum(-1), (patch * geo["row"]).sum(-1),
                 (patch * geo["column"]).sum(-1), mass]
        uniform = geo["distance"].mean(-1)  # [P]: grid distance of uniform attention from each patch
        per_head = torch.stack([x.sum((0, 2)) for x in parts] + [(has.double() * uniform).sum((0, 2))], -1)
        keep = present_heads(probs).cpu().numpy()
        sums = per_head.cpu().numpy()
        self.sums[site][keep] += sums[keep]
        self.counts[site][keep] += np.stack([np.full(len(keep), a.shape[0] * a.shape[2]),
                                             has.sum((0, 2)).cpu().numpy()], -1)[keep]

    def merge(self, other: GridAttention) -> GridAttention:
        for site in self.sums:
            self.sums[site] += other.sums[site]
            self.counts[site] += other.counts[site]
        return self

    def result(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head``, the :data:`MEASURES`, ``uniform_distance`` and
        ``distance_ratio`` (grid distance / uniform distance); NaN where nothing was measured."""
        rows = []
        for site in self.sites:
            for h in range(self.n_heads):
                n, n_mass = self.counts[site][h]
                sums = self.sums[site][h]
                with np.errstate(invalid="ignore", divide="ignore"):
                    values = {m: sums[i] / (n_mass if m == "grid_distance" else n) for i, m in enumerate(MEASURES)}
                    values["uniform_distance"] = sums[-1] / n_mass
                    values["distance_ratio"] = values["grid_distance"] / values["uniform_distance"]
                rows.append({"layer": site.layer, "head": h, **{k: float(v) for k, v in values.items()}})
        return pd.DataFrame(rows)

    def columns(self) -> pd.DataFrame:
        return self.result()

    def head_labels(self) -> list[tuple[int, int, str, float]]:
        """``(layer, head, label, strength)`` for every label of :data:`GRID_LABELS` a head holds."""
        out = []
        for row in self.result().to_dict("records"):
            for label, (measure, bar) in GRID_LABELS.items():
                value = row[measure]
                if label == "global" and not row["patch_share"] >= 0.5:
                    continue
                if value == value and value >= bar:
                    out.append((row["layer"], row["head"], label, value / bar))
        return out
