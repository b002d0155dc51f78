"""Pruning curves: heads removed step by step in one order, the objective measured on held-out
text after each step (Michel et al. 2019, sec. 4.1, Fig. 3; Voita et al. 2019, sec. 6).

Orders:
- ``importance``: the heads with the lowest normalized importance (:mod:`probe.pruning.importance`)
  go first; importance is scored again on the scoring part after every step;
- ``redundancy``: the less important head of the closest pair in one layer goes first
  (:func:`probe.pruning.redundancy.redundancy_pick`); distances and importance are measured again
  after every step, in the same scoring pass;
- ``random``: a random order of the heads per seed (``torch.randperm`` with
  ``torch.Generator().manual_seed(seed)``); the curve is the mean and the sample standard
  deviation (ddof = 1) over the seeds.

Steps: after step i of K, round(n0 + i * (round(F * N) - n0) / K) of the N heads are pruned (n0 =
heads already removed from the model, F = the final fraction). Step 0 is the model as it is.
Every value of a curve is the objective on the held-out batches only.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from ..bounds import PRUNING_ORDERS
from ..causal.objectives import ZERO_WITHIN
from ..errors import InputError
from ..patterns.distance import HeadDistances
from ..runs.pace import Tally
from .importance import head_importance, normalize_per_layer
from .redundancy import redundancy_pick

#: The orders heads are pruned in (named where the command line reads them without torch).
ORDERS = PRUNING_ORDERS


def schedule(n_total: int, n_start: int, fraction: float, steps: int) -> list[int]:
    """Cumulative heads pruned after each of the ``steps`` steps (original heads counted).

    Raises:
        InputError: the final fraction prunes no more heads than are already removed, or there are
            fewer heads to prune than steps.
    """
    target = round(fraction * n_total)
    if target <= n_start:
        raise InputError(f"--fraction {fraction:g} prunes {target} of {n_total} heads, but {n_start} are already "
                         "removed from this model: give a larger fraction")
    if steps > target - n_start:
        n = target - n_start
        raise InputError(f"{steps} steps for {n} heads to prune: use --steps {n} or fewer")
    return [n_start + round(i * (target - n_start) / steps) for i in range(1, steps + 1)]


#: The kinds of calls a :class:`~probe.runs.pace.Tally` of the experiment times: a scoring pass over the scoring
#: batches (forward and backward, :func:`~probe.pruning.importance.head_importance`), an evaluation of the objective
#: over the held-out batches (forward only).
SCORING, EVALUATION = "scoring passes", "evaluations"


def planned_calls(orders: Sequence[str], points: int, seeds: int) -> dict[str, int]:
    """How many scoring passes and evaluations :func:`run_orders` with these orders, ``points`` steps after step 0
    and ``seeds`` random orders, and the scoring of the model as given, will make: a greedy order scores
    before each of its steps (the model as given once, shared by every greedy order: it is memoized) and
    evaluates after each; random evaluates after each step of each seed; step 0 is evaluated once. Where no
    greedy order runs, the model as given is scored once (for its importance column)."""
    greedy = sum(order != "random" for order in orders)
    scoring = greedy * points - (greedy - 1) if greedy else 1
    evaluations = 1 + points * (greedy + (seeds if "random" in orders else 0))
    return {SCORING: scoring, EVALUATION: evaluations}


def timed(tally: Tally | None, kind: str):
    """``tally.call(kind)``, or a context that does nothing without a tally."""
    return nullcontext() if tally is None else tally.call(kind)


@dataclass
class Context:
    """What every curve of one experiment shares.

    Attributes:
        lm, objective, state: the model, the :class:`~probe.causal.objectives.Objective`, and the
            :class:`~probe.causal.gates.Gates` of the enclosing ``gated`` context.
        score, held_out: scoring and held-out batches (disjoint texts).
        start: [layers, heads] gates of the model as given (0 = already removed).
        counts: cumulative heads pruned after each step (:func:`schedule`).
        probes, seed: importance settings (:func:`~probe.pruning.importance.head_importance`).
        with_distances: measure distances too when scoring the model as given (they are reported).
        bar: ``bar(total, desc)`` -> a tqdm-like bar, or None.
        tally: a :class:`~probe.runs.pace.Tally` timing the scoring passes and evaluations (its totals:
            :func:`planned_calls`), or None.
    """

    lm: object
    objective: object
    state: object
    score: Sequence
    held_out: Sequence
    start: torch.Tensor
    counts: list[int]
    probes: int = 2
    seed: int = 0
    bar: object = None
    with_distances: bool = False
    cache: dict = field(default_factory=dict)
    tally: object = None

    def progress(self, total: int, desc: str):
        return None if self.bar is None else self.bar(total, desc)

    def score_heads(self, mask: torch.Tensor, distances: bool) -> tuple:
        """(normalized importance [layers, heads], raw importance, Jensen-Shannon distances
        [layers, heads, heads] or None) of the model gated by ``mask``, on the scoring part; memoized."""
        distances = distances or (self.with_distances and torch.equal(mask, self.start))
        key = (mask.numpy().tobytes(), distances)
        if key not in self.cache:
            # the within-layer distance only (no model-wide map)
            accs = [HeadDistances(self.lm.sites, self.lm.geometry.n_heads, map_sequences=0)] if distances else []
            bar = self.progress(len(self.score), "scoring")
            try:
                with timed(self.tally, SCORING):
                    raw = head_importance(self.lm, self.score, self.objective, self.state, mask, probes=self.probes,
                                          seed=self.seed, accumulators=accs, progress=bar)
            finally:
                if bar is not None:
                    bar.close()
            layer = torch.from_numpy(accs[0].result().layer) if accs else None  # [layers, heads, heads] bits
            self.cache[key] = (normalize_per_layer(raw, mask), raw, layer)
            if distances:  # the same importance serves a later request without distances
                self.cache[(key[0], False)] = self.cache[key]
        return self.cache[key]


def evaluate(ctx: Context, mask: torch.Tensor) -> float:
    """The objective's unit-weighted mean over the held-out batches with gates ``mask`` (0 where
    it is within float32 rounding of 0, :data:`ZERO_WITHIN`)."""
    ctx.state.values = mask.float()
    total, count = 0.0, 0
    with torch.no_grad(), timed(ctx.tally, EVALUATION):
        for batch in ctx.held_out:
            losses = ctx.objective.losses(ctx.lm, batch)
            total += float(losses.double().sum())
            count += losses.numel()
    mean = total / max(count, 1)
    return 0.0 if abs(mean) < ZERO_WITHIN else mean


@dataclass
class Curve:
    """One order's curve.

    Attributes:
        order: ``importance``, ``redundancy`` or ``random``.
        n_pruned: heads pruned at each point (step 0 first).
        values: objective at each point ([points], or [seeds, points] for random).
        added: heads pruned at each step, (layer, head) in original numbering ([] for step 0; for
            random, seed 0's).
    """

    order: str
    n_pruned: list[int]
    values: np.ndarray
    added: list[list[tuple[int, int]]]

    @property
    def pruned(self) -> list[tuple[int, int]]:
        """Every head this order prunes by its last step."""
        return [h for step in self.added for h in step]


def _prune(mask: torch.Tensor, heads) -> None:
    for layer, h in heads:
        mask[layer, h] = 0.0


def _lowest(scores: torch.Tensor, mask: torch.Tensor, k: int) -> list[tuple[int, int]]:
    present = mask.bool().nonzero().tolist()
    present.sort(key=lambda lh: (float(scores[lh[0], lh[1]]), lh[0], lh[1]))
    return [(int(layer), int(h)) for layer, h in present[:k]]


def _greedy_curve(ctx: Context, order: str, base: float) -> Curve:
    mask = ctx.start.clone()
    n0 = int((mask == 0).sum())
    values, added, counts = [base], [[]], [n0]
    bar = ctx.progress(len(ctx.counts), f"{order} curve")
    for target in ctx.counts:
        k = target - int((mask == 0).sum())
        imp, _, dist = ctx.score_heads(mask, distances=order == "redundancy")
        heads = _lowest(imp, mask, k) if order == "importance" else redundancy_pick(dist, imp, mask, k)
        _prune(mask, heads)
        values.append(evaluate(ctx, mask))
        added.append(heads)
        counts.append(target)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return Curve(order, counts, np.array(values), added)


def random_curves(ctx: Context, seeds: int, base: float) -> Curve:
    """The random order, once per seed 0..seeds-1: values [seeds, points]."""
    present = ctx.start.bool().nonzero().tolist()
    n0 = int((ctx.start == 0).sum())
    rows, added0 = [], None
    bar = ctx.progress(seeds * len(ctx.counts), "random curves")
    for seed in range(seeds):
        perm = torch.randperm(len(present), generator=torch.Generator().manual_seed(seed)).tolist()
        order = [tuple(present[i]) for i in perm]
        mask, row, added, done = ctx.start.clone(), [base], [[]], n0
        for target in ctx.counts:
            heads = order[done - n0:target - n0]
            _prune(mask, heads)
            row.append(evaluate(ctx, mask))
            added.append([(int(a), int(b)) for a, b in heads])
            done = target
            if bar is not None:
                bar.update(1)
        rows.append(row)
        added0 = added0 or added
    if bar is not None:
        bar.close()
    return Curve("random", [n0, *ctx.counts], np.array(rows), added0)


def run_orders(ctx: Context, orders: Sequence[str], seeds: int) -> tuple[dict[str, Curve], float]:
    """Every requested order's curve, and the step-0 value (the model as given, held-out part)."""
    base = evaluate(ctx, ctx.start)
    curves = {}
    for order in orders:
        if order == "random":
            curves[order] = random_curves(ctx, seeds, base)
        else:
            curves[order] = _greedy_curve(ctx, order, base)
    return curves, base
