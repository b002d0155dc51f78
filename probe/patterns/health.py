"""Attention health checks (docs/statistics.md, "Attention health checks"): the troubleshooting table of
saturated, uniform, self-copying, duplicated heads and attention leaking onto padding.

Each check is a rule on a measured value, with a configurable threshold:

| check | rule (default) | value |
| --- | --- | --- |
| ``saturated`` | max_weight >= 0.95 | :mod:`probe.measures.stats` ``max_weight`` |
| ``uniform`` | norm_entropy >= 0.95 | ``norm_entropy`` |
| ``collapsed`` (to self) | self >= 0.8 | ``self`` |
| ``duplicates`` | distance < 0.05 for a pair of heads of one layer | Jensen-Shannon divergence (bits) |
| ``padding`` (attended) | largest probability on a padding key > 0 | :class:`HealthProbe` |

Duplicates use the per-layer distance over the whole corpus (:mod:`probe.patterns.distance`); a layer
is flagged whole when every pair of its heads is below the threshold (and not every pair is explained).

Explained by a label (decided here). ``saturated`` and ``duplicates`` point at bugs, but healthy
trained heads meet their rules too: a previous-token head puts nearly all of every row on one key
(max_weight near 1), and two attention-sink heads of one layer both put everything on the first
token (distance near 0). A head caught by ``saturated`` that holds one of :data:`EXPLAINING` (a
label whose target is one position per row: previous / next token, itself, the first token, [SEP],
punctuation) is listed as *explained* by that label instead of flagged; so is a duplicate pair whose
two heads hold the same such label. ``uniform`` and ``collapsed`` are never explained: their
statistic is the label's own (``norm_entropy`` of ``broad``, ``self`` of ``self``), so a label would
excuse every head the check catches. ``padding`` has no healthy exception.

Too little text (decided here). The per-head checks and duplicates rest on means over query rows;
on a few tokens they measure the text's shape, not the heads (a decoder's first row is one-hot by
construction; 11 tokens gave 38 "saturated" heads and 380 "duplicate" pairs on SmolLM2). Below
:data:`MIN_ROWS` query rows (real tokens of the corpus) those checks say they need more text instead
of flagging. ``padding`` is exact (any probability above 0 is a bug) and runs on any amount.

"Padding attended" (decided here): the largest attention probability on a padding key, over every
padded batch of the corpus run (the loop's batches are right-padded, so each site's probabilities
include the padded key columns) and every query row that may see at least one real key under the
site's own mask: real rows, and padding rows too, since in a right-padded causal model only padding
rows can see padding keys at all. A padding row whose sliding window holds padding only (every key
masked) has no correct answer and is left out. The threshold is fixed at 0: a correct mask gives
exactly 0 (masked scores are -inf before the softmax).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..measures.accumulators import Accumulator, present_heads
from ..measures.classify import LABEL_RULES
from ..rules import HEALTH_RULES, health_thresholds  # noqa: F401 (health_thresholds: re-exported)
from ..sites import Site, first_visible, head_name
from ..text.inputs import Batch
from ..util import plural

#: Labels that explain a saturated head or a duplicate pair: each puts a row's mass on one position.
EXPLAINING = ("previous-token", "next-token", "self", "first-token", "sep", "punctuation")
#: Query rows (real tokens over the corpus) the per-head checks and duplicates need (see the module
#: docstring): about 20 sentences; fewer and the check says it needs more text.
MIN_ROWS = 200
#: Checks that need :data:`MIN_ROWS`.
NEED_ROWS = ("saturated", "uniform", "collapsed", "duplicates")

#: Titles of the checks on the page.
TITLES = {"saturated": "saturated", "uniform": "uniform", "collapsed": "collapsed to self",
          "duplicates": "duplicate heads", "padding": "padding attended"}


class HealthProbe(Accumulator):
    """Largest attention probability on a padding key, per site, over the padded batches of a run.

    Args:
        sites: the model's attention sites.
        thresholds: health thresholds overriding the defaults (kept with the result).
        real_rows_only: read only the rows of real query tokens (a model that masks whole padding
            query rows, :attr:`~probe.architectures.ArchSpec.padding_rows_masked`: their weights spread
            evenly over every key, by design).

    Raises:
        ValueError: bad thresholds (see :func:`health_thresholds`).
    """

    name = "health"
    title = "the padding health check"
    model_kinds = ("encoder", "decoder")  # one-stack models
    site_kinds = ("self",)
    row_blocks = True  # a largest value over rows: blocks of rows give the same maximum

    def __init__(self, sites: list[Site], thresholds: dict | None = None, *, real_rows_only: bool = False) -> None:
        self.sites = list(sites)
        self.real_rows_only = real_rows_only
        self.thresholds = health_thresholds(thresholds)
        self._pos = {s: i for i, s in enumerate(self.sites)}
        self.padding_max = torch.zeros(len(self.sites), dtype=torch.float64)
        self.padded_batches = 0
        self.padding_cells = 0
        self.batches = 0
        self._pending: dict[int, torch.Tensor] = {}  # site -> largest value of this batch (model's device)
        self._present: dict[Site, torch.Tensor] = {}

    def begin_batch(self, batch: Batch) -> None:
        self.batches += 1
        if not bool(batch.real.all()):
            self.padded_batches += 1

    def _cells(self, batch: Batch, site: Site, T: int) -> torch.Tensor:
        """[batch, T, T] bool: padding keys of rows that may see at least one real key."""
        real = batch.real.cpu()[:, :T]
        lengths = real.sum(1)
        rows = first_visible(site, T)[None, :] < lengths[:, None]  # [B, T]
        if self.real_rows_only:
            rows = rows & real
        return rows[:, :, None] & ~real[:, None, :]

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, rows: tuple[int, int] | None = None,
               **_) -> None:
        """Fold in one site: ``probs`` [batch, heads, T, T], or with ``rows=(i0, i1)`` its query rows
        i0..i1-1, [batch, heads, i1 - i0, T]."""
        shortest = batch.cached("shortest", lambda: int(batch.lengths.min()))
        T = probs.shape[-1]
        if shortest >= T:  # no padding key in this batch
            return
        i0 = 0 if rows is None else int(rows[0])
        # only the key columns past the shortest row can be padding: the rest is never read
        cells = batch.cached(("padding-cells", site.causal, site.window, site.ahead, T, str(probs.device)),
                             lambda: self._cells(batch, site, T)[:, :, shortest:].to(probs.device))
        cells = cells[:, i0:i0 + probs.shape[-2]]
        values = probs.detach()[..., shortest:].transpose(0, 1)[:, cells]  # [heads, padding cells]
        if i0 == 0:
            self._present[site] = present_heads(probs)  # the first row's first key: in the first block
        values = values[self._present[site]]  # heads removed by pruning have no probabilities
        if values.numel():
            i = self._pos[site]
            top = values.max().float()
            self._pending[i] = top if i not in self._pending else torch.maximum(self._pending[i], top)
            if i == 0:
                self.padding_cells += int(values.shape[1])

    def end_batch(self, batch: Batch) -> None:
        """Read this batch's largest values (one transfer from the model's device per batch)."""
        for i, top in self._pending.items():
            self.padding_max[i] = max(float(self.padding_max[i]), float(top))
        self._pending, self._present = {}, {}

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
        explained: what the rule catches but a label explains (see the module docstring), as in
            ``flagged`` plus ``label`` and, per head, ``label_value`` (the label's statistic).
        rows: query rows the check rests on (None: not known); below :data:`MIN_ROWS` the check
            needs more text (``needs_text``) and flags nothing.
    """

    name: str
    rule: str
    threshold: float
    measured: bool = True
    flagged: list[dict] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    value: float | None = None
    note: str = ""
    explained: list[dict] = field(default_factory=list)
    rows: int | None = None
    needs_text: bool = False

    @property
    def status(self) -> str:
        """``"FLAGGED"``, ``"ok"``, ``"needs more text"`` or ``"not measured"``."""
        if self.needs_text:
            return "needs more text"
        if not self.measured:
            return "not measured"
        return "FLAGGED" if self.flagged or self.layers else "ok"

    def as_dict(self) -> dict:
        stat, _, op, points = HEALTH_RULES[self.name]
        return {"check": self.name, "title": TITLES[self.name], "rule": self.rule, "statistic": stat,
                "comparison": op, "threshold": self.threshold, "measured": self.measured, "status": self.status,
                "n_flagged": len(self.flagged), "flagged": self.flagged, "layers": self.layers,
                "n_explained": len(self.explained), "explained": self.explained, "rows": self.rows,
                "min_rows": MIN_ROWS if self.name in NEED_ROWS else None,
                "value": self.value, "points_at": points, "note": self.note}


def _explaining_label(row) -> str | None:
    """The label of :data:`EXPLAINING` a head holds (its primary label if that is one), or None."""
    held = [lab for lab in str(getattr(row, "labels", "") or "").split(";") if lab in EXPLAINING]
    primary = getattr(row, "label", None)
    return primary if primary in held else (held[0] if held else None)


def _head_checks(heads, thresholds: dict[str, float]) -> list[Check]:
    out = []
    for name in ("saturated", "uniform", "collapsed"):
        stat, _, op, _ = HEALTH_RULES[name]
        thr = thresholds[name]
        check = Check(name, f"{stat} {op} {thr:g}", thr)
        if stat not in heads.columns or heads[stat].isna().all():
            check.measured, check.note = False, f"{stat} not measured"
        else:
            for r in heads[heads[stat] >= thr].sort_values(stat, ascending=False).itertuples():
                item = {"layer": int(r.layer), "head": int(r.head), "value": float(getattr(r, stat))}
                label = _explaining_label(r) if name == "saturated" else None
                if label is None:
                    check.flagged.append(item)
                else:
                    value = getattr(r, LABEL_RULES[label][0])
                    check.explained.append({**item, "label": label, "label_value": float(value)})
        out.append(check)
    return out


def _duplicates(distances, thresholds: dict[str, float], heads=None) -> Check:
    thr = thresholds["duplicates"]
    check = Check("duplicates", f"distance < {thr:g} (pairs of one layer; a layer whose every pair is below)", thr)
    if distances is None:
        check.measured, check.note = False, "head distances were not measured (--no-distance)"
        return check
    label_of = {} if heads is None else {(int(r.layer), int(r.head)): _explaining_label(r)
                                         for r in heads.itertuples() if "stack" not in heads or r.stack != "decoder"}
    for site, d in zip(distances.sites, distances.layer):
        if np.isnan(d).all():
            continue
        H = d.shape[0]
        pairs = [(float(d[h, g]), h, g) for h in range(H) for g in range(h + 1, H) if d[h, g] < thr]
        explained = 0
        for v, h, g in sorted(pairs):
            item = {"layer": site.layer, "heads": [h, g], "value": v}
            label = label_of.get((site.layer, h))
            if label is not None and label == label_of.get((site.layer, g)):
                check.explained.append({**item, "label": label})
                explained += 1
            else:
                check.flagged.append(item)
        if H > 1 and len(pairs) == H * (H - 1) // 2 and explained < len(pairs):
            check.layers.append(site.layer)
    return check


def _needs_text(check: Check, rows: int | None) -> Check:
    """The check with its row count; below :data:`MIN_ROWS` it flags nothing and says why."""
    check.rows = rows
    if rows is None or rows >= MIN_ROWS or not check.measured:
        return check
    caught = len(check.flagged) + len(check.explained)
    check.needs_text, check.flagged, check.explained, check.layers = True, [], [], []
    check.note = (f"needs more text: {rows} query rows measured, the check needs at least {MIN_ROWS} (on less text "
                  f"a mean over rows measures the text's shape, not the heads; {caught} would have been caught)")
    return check


def _padding(probe: dict | None) -> Check:
    check = Check("padding", "largest probability on a padding key > 0", 0.0)
    if probe is None:
        check.measured, check.note = False, "not measured"
        return check
    if probe["padded_batches"] == 0:
        check.measured = False
        check.note = (f"no padded batch in this run ({plural(probe['batches'], 'batch', 'batches')} of equal-length "
                      "sequences): use a batch size above 1 on texts of different lengths")
        return check
    check.value = probe["padding_max"]
    check.flagged = [{"layer": layer, "value": v} for layer, v in zip(probe["layers"], probe["per_site"]) if v > 0]
    check.note = padding_note(probe["padded_batches"], probe["batches"], probe["padding_cells"])
    return check


def padding_note(padded: int, batches: int, cells: int) -> str:
    """What the padding check looked at, in words: ``padded: every one of the run's 2 batches; 14
    (row, padding key) cells per head`` (not "2 padded batches of 2")."""
    which = "every one" if padded == batches else ("one" if padded == 1 else f"{padded}")
    return (f"padded: {which} of the run's {plural(batches, 'batch', 'batches')}; "
            f"{cells:,} (row, padding key) cells per head")


def health_checks(heads, distances=None, probe: dict | None = None,
                  thresholds: dict | None = None, rows: int | None = None) -> list[Check]:
    """Every check of :data:`HEALTH_RULES` on one run.

    Args:
        heads: the per-head DataFrame (``max_weight``, ``norm_entropy``, ``self`` columns; ``label``
            and ``labels`` for the explanations, and the labels' statistics).
        distances: a :class:`~probe.patterns.distance.DistanceResult`, or None (duplicates not measured).
        probe: :meth:`HealthProbe.result`, or None (padding not measured).
        thresholds: overrides (default: the probe's, else the defaults).
        rows: query rows of the run (its real tokens); below :data:`MIN_ROWS` the checks of
            :data:`NEED_ROWS` need more text. None: not known, no minimum.

    Returns:
        One :class:`Check` per check, in :data:`HEALTH_RULES` order.

    Raises:
        ValueError: bad thresholds.
    """
    thr = health_thresholds(thresholds if thresholds is not None else
                            {k: v for k, v in (probe or {}).get("thresholds", {}).items() if k != "padding"})
    checks = _head_checks(heads, thr)
    checks.append(_duplicates(distances, thr, heads))
    checks = [_needs_text(c, rows) for c in checks]
    checks.append(_padding(probe))
    return checks


#: What :func:`health_of` says about a result without the health measurement.
NOT_MEASURED = ("this analysis has no health checks: run it with analyze(lm, texts, "
                "accumulators=probe.patterns.pattern_accumulators(lm)) (a HealthProbe measures padding; "
                "HeadDistances the duplicates)")


def health_of(result) -> list[Check]:
    """The checks of an :class:`~probe.records.AnalysisResult` whose run had a :class:`HealthProbe`
    (its real tokens are the query rows).

    Raises:
        ValueError: the run had no :class:`HealthProbe` (the message says how to add one).
    """
    probe = result.results.get("health")
    if probe is None:
        raise ValueError(NOT_MEASURED)
    return health_checks(result.heads, result.results.get("distances"), probe, rows=result.counts.get("tokens"))


def describe(check: Check, show: int = 12) -> str:
    """One line on a check's outcome, the same on the page and in the CLI: the flagged heads with
    their values (at most ``show``, then how many more), and what their labels explain."""
    if check.status in ("not measured", "needs more text"):
        return check.note
    if check.name == "padding":
        return f"largest value {check.value:.3g}" + (f" ({check.note})" if check.note else "")

    def name(f):
        if "heads" in f:
            return f"{head_name(f['layer'], f['heads'][0])} and {head_name(f['layer'], f['heads'][1])}"
        return head_name(f["layer"], f["head"])

    def listed(items, extra):
        more = f" and {len(items) - show} more" if len(items) > show else ""
        return ", ".join(f"{name(f)} ({f['value']:.3f}{extra(f)})" for f in items[:show]) + more

    parts = [listed(check.flagged, lambda f: "")] if check.flagged else ["none flagged"]
    if check.layers:
        parts.append(f"whole layers: {', '.join(map(str, check.layers))}")
    if check.explained:
        counts: dict[str, int] = {}
        for f in check.explained:
            counts[f["label"]] = counts.get(f["label"], 0) + 1
        what = "pair" if check.name == "duplicates" else "head"
        parts.append(f"{plural(len(check.explained), what)} explained by their label (not flagged): "
                     + ", ".join(f"{n} {label}" for label, n in counts.items()))
    return "; ".join(parts)


def summary_line(checks: list[Check]) -> str:
    """The CLI's health line: each check's status, with the counts of flagged and explained."""
    parts = []
    for c in checks:
        text = f"{TITLES[c.name]} {c.status}"
        if c.status == "FLAGGED":
            text += f" ({len(c.flagged)}" + (f", {len(c.explained)} explained by their label)" if c.explained else ")")
        elif c.explained:
            text += f" ({len(c.explained)} explained by their label)"
        elif c.status == "needs more text":
            text += f" ({c.rows} of {MIN_ROWS} query rows)"
        parts.append(text)
    return "health: " + "; ".join(parts)
