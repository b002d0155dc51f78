"""Attention health checks (METRICS.md "Attention health checks"): the troubleshooting table of
saturated, uniform, self-copying, duplicated heads and attention leaking onto padding.

Each check is a rule on a measured value, with a configurable threshold:

| check | rule (default) | value |
| --- | --- | --- |
| ``saturated`` | max_weight >= 0.95 | :mod:`probe.stats` ``max_weight`` |
| ``uniform`` | norm_entropy >= 0.95 | ``norm_entropy`` |
| ``collapsed`` (to self) | self >= 0.8 | ``self`` |
| ``duplicates`` | distance < 0.05 for a pair of heads of one layer | Jensen-Shannon divergence (bits) |
| ``padding`` (attended) | largest probability on a padding key > 0 | :class:`HealthProbe` |

Duplicates use the per-layer distance over the whole corpus (:mod:`probe.patterns.distance`); a layer
is flagged whole when every pair of its heads is below the threshold.

"Padding attended" (decided here): the largest attention probability on a padding key, over every
padded batch of the corpus run (the loop's batches are right-padded, so each site's probabilities
include the padded key columns) and every query row that may see at least one real key under the
site's own mask: real rows, and padding rows too, since in a right-padded causal model only padding
rows can see padding keys at all. A padding row whose sliding window holds padding only (every key
masked) has no correct answer and is left out. The threshold is fixed at 0: a correct mask gives
exactly 0 (masked scores are -inf before the softmax).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np
import torch

from ..accumulators import Accumulator, present_heads
from ..inputs import Batch
from ..sites import Site
from .distance import NEAR_DUPLICATE

#: check -> (statistic, default threshold, comparison, what it points at). Order = report order.
HEALTH_RULES: dict[str, tuple[str, float, str, str]] = {
    "saturated": ("max_weight", 0.95, ">=", "one-hot softmax: missing or wrong score scale, very large logits"),
    "uniform": ("norm_entropy", 0.95, ">=", "scores too small (scale applied twice), dead head"),
    "collapsed": ("self", 0.8, ">=", "a head that only copies its own token"),
    "duplicates": ("distance", NEAR_DUPLICATE, "<", "redundant heads, pruning candidates"),
    "padding": ("padding", 0.0, ">", "a mask bug: must be exactly 0"),
}

#: Titles of the checks on the page.
TITLES = {"saturated": "saturated", "uniform": "uniform", "collapsed": "collapsed to self",
          "duplicates": "duplicate heads", "padding": "padding attended"}


def health_thresholds(overrides: dict | None = None) -> dict[str, float]:
    """check -> threshold: METRICS.md's defaults with ``overrides``.

    Raises:
        ValueError: an unknown check, ``padding`` (fixed at 0), or a value outside (0, 1].
    """
    out = {name: rule[1] for name, rule in HEALTH_RULES.items()}
    for name, value in (overrides or {}).items():
        if name not in HEALTH_RULES:
            raise ValueError(f"unknown health check {name!r}; checks: {', '.join(HEALTH_RULES)}")
        if name == "padding":
            raise ValueError("the padding check has no threshold: any probability on a padding key is a mask bug")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) <= 1:
            raise ValueError(f"health threshold of {name!r} must be in (0, 1], got {value!r}")
        out[name] = float(value)
    return out


class HealthProbe(Accumulator):
    """Largest attention probability on a padding key, per site, over the padded batches of a run.

    Args:
        sites: the model's attention sites.
        thresholds: health thresholds overriding the defaults (kept with the result).

    Raises:
        ValueError: bad thresholds (see :func:`health_thresholds`).
    """

    name = "health"
    title = "the padding health check"
    model_kinds = ("encoder", "decoder")  # one-stack models
    site_kinds = ("self",)

    def __init__(self, sites: list[Site], thresholds: dict | None = None) -> None:
        self.sites = list(sites)
        self.thresholds = health_thresholds(thresholds)
        self._pos = {s: i for i, s in enumerate(self.sites)}
        self.padding_max = torch.zeros(len(self.sites), dtype=torch.float64)
        self.padded_batches = 0
        self.padding_cells = 0
        self.batches = 0

    def begin_batch(self, batch: Batch) -> None:
        self.batches += 1
        if not bool(batch.real.all()):
            self.padded_batches += 1

    def _cells(self, batch: Batch, site: Site, T: int) -> torch.Tensor:
        """[batch, T, T] bool: padding keys of rows that may see at least one real key."""
        def build():
            real = batch.real.cpu()[:, :T]
            lengths = real.sum(1)
            pos = torch.arange(T)
            first_visible = (pos - site.window + 1).clamp(min=0) if (site.causal and site.window) else torch.zeros(T)
            rows = first_visible[None, :] < lengths[:, None]  # [B, T]
            return rows[:, :, None] & ~real[:, None, :]
        return batch.cached(("padding-cells", site.causal, site.window, T), build)

    def update(self, site: Site, probs: torch.Tensor, batch: Batch) -> None:
        """Fold in one site: ``probs`` [batch, heads, T, T]."""
        if bool(batch.real.all()):
            return
        cells = self._cells(batch, site, probs.shape[-1]).to(probs.device)
        values = probs.detach().float().transpose(0, 1)[:, cells]  # [heads, padding cells]
        values = values[present_heads(probs)]  # heads removed by pruning have no probabilities
        if values.numel():
            i = self._pos[site]
            self.padding_max[i] = max(float(self.padding_max[i]), float(values.max()))
            if i == 0:
                self.padding_cells += int(values.shape[1])

    def merge(self, other: HealthProbe) -> HealthProbe:
        if other.sites != self.sites:
            raise ValueError("cannot merge health probes of different models")
        self.padding_max = torch.maximum(self.padding_max, other.padding_max)
        self.padded_batches += other.padded_batches
        self.padding_cells += other.padding_cells
        self.batches += other.batches
        return self

    def result(self) -> dict:
        """``padding_max`` (largest value, all sites), ``per_site``, ``padded_batches``, ``batches``,
        ``padding_cells`` (padding keys x rows checked per head of one site), ``layers`` (of the sites)
        and ``thresholds``."""
        return {"padding_max": float(self.padding_max.max()) if len(self.sites) else 0.0,
                "per_site": self.padding_max.tolist(), "layers": [s.layer for s in self.sites],
                "padded_batches": self.padded_batches,
                "batches": self.batches, "padding_cells": self.padding_cells, "thresholds": dict(self.thresholds)}


@dataclass
class Check:
    """One health check's outcome.

    Attributes:
        name: key in :data:`HEALTH_RULES`.
        rule: the rule in words (``"max_weight >= 0.95"``).
        threshold: the threshold used.
        measured: False when the check could not run (no padded batch, no distances).
        flagged: what the rule flags: ``{"layer", "head", "value"}`` per head, ``{"layer", "heads",
            "value"}`` per duplicate pair, ``{"layer", "value"}`` per site for padding.
        layers: layers flagged whole (duplicates: every pair of heads below the threshold).
        value: the one measured value where there is one (padding: largest probability).
        note: why it was not measured, or context.
    """

    name: str
    rule: str
    threshold: float
    measured: bool = True
    flagged: list[dict] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    value: float | None = None
    note: str = ""

    def as_dict(self) -> dict:
        stat, _, op, points = HEALTH_RULES[self.name]
        return {"check": self.name, "title": TITLES[self.name], "rule": self.rule, "statistic": stat,
                "comparison": op, "threshold": self.threshold, "measured": self.measured,
                "n_flagged": len(self.flagged), "flagged": self.flagged, "layers": self.layers,
                "value": self.value, "points_at": points, "note": self.note}


def _head_checks(heads, thresholds: dict[str, float]) -> list[Check]:
    out = []
    for name in ("saturated", "uniform", "collapsed"):
        stat, _, op, _ = HEALTH_RULES[name]
        thr = thresholds[name]
        check = Check(name, f"{stat} {op} {thr:g}", thr)
        if stat not in heads.columns or heads[stat].isna().all():
            check.measured, check.note = False, f"{stat} not measured"
        else:
            hit = heads[heads[stat] >= thr].sort_values(stat, ascending=False)
            check.flagged = [{"layer": int(r.layer), "head": int(r.head), "value": float(getattr(r, stat))}
                             for r in hit.itertuples()]
        out.append(check)
    return out


def _duplicates(distances, thresholds: dict[str, float]) -> Check:
    thr = thresholds["duplicates"]
    check = Check("duplicates", f"distance < {thr:g} (pairs of one layer; a layer whose every pair is below)", thr)
    if distances is None:
        check.measured, check.note = False, "head distances were not measured (--no-distance)"
        return check
    for site, d in zip(distances.sites, distances.layer):
        if np.isnan(d).all():
            continue
        H = d.shape[0]
        pairs = [(float(d[h, g]), h, g) for h in range(H) for g in range(h + 1, H) if d[h, g] < thr]
        check.flagged += [{"layer": site.layer, "heads": [h, g], "value": v} for v, h, g in sorted(pairs)]
        if H > 1 and len(pairs) == H * (H - 1) // 2:
            check.layers.append(site.layer)
    return check


def _padding(probe: dict | None) -> Check:
    check = Check("padding", "largest probability on a padding key > 0", 0.0)
    if probe is None:
        check.measured, check.note = False, "not measured"
        return check
    if probe["padded_batches"] == 0:
        check.measured = False
        check.note = (f"no padded batch in this run ({probe['batches']} batch(es) of equal-length sequences): "
                      "use a batch size above 1 on texts of different lengths")
        return check
    check.value = probe["padding_max"]
    check.flagged = [{"layer": layer, "value": v} for layer, v in zip(probe["layers"], probe["per_site"]) if v > 0]
    check.note = (f"{probe['padded_batches']} padded batch(es) of {probe['batches']}; "
                  f"{probe['padding_cells']} (row, padding key) cells per head")
    return check


def health_checks(heads, distances=None, probe: dict | None = None,
                  thresholds: dict | None = None) -> list[Check]:
    """Every check of :data:`HEALTH_RULES` on one run.

    Args:
        heads: the per-head DataFrame (``max_weight``, ``norm_entropy``, ``self`` columns).
        distances: a :class:`~probe.patterns.distance.DistanceResult`, or None (duplicates not measured).
        probe: :meth:`HealthProbe.result`, or None (padding not measured).
        thresholds: overrides (default: the probe's, else METRICS.md's).

    Returns:
        One :class:`Check` per check, in :data:`HEALTH_RULES` order.

    Raises:
        ValueError: bad thresholds.
    """
    thr = health_thresholds(thresholds if thresholds is not None else
                            {k: v for k, v in (probe or {}).get("thresholds", {}).items() if k != "padding"})
    checks = _head_checks(heads, thr)
    checks.append(_duplicates(distances, thr))
    checks.append(_padding(probe))
    return checks


def health_of(result) -> list[Check] | None:
    """The checks of an :class:`~probe.analysis.AnalysisResult` whose run had a :class:`HealthProbe`
    (None otherwise)."""
    probe = result.results.get("health")
    if probe is None:
        return None
    return health_checks(result.heads, result.results.get("distances"), probe)

