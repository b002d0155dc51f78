"""The pruning experiment end to end, without files: :func:`prune`.

The corpus is split once, with a fixed seed, into a scoring part (head importance, distances) and
a held-out part (every value of every curve); no text is in both. Then each order's curve is run
(:mod:`probe.pruning.curves`), the heads the first order prunes by its last step are removed
from a copy of the model (:func:`probe.pruning.removal.remove_heads`), the copy's outputs are
compared with the gated model's on the held-out part, and their forward speeds are measured side
by side.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from .. import validate
from ..capture.maps import forward
from ..causal.gates import gated, ones
from ..causal.objectives import OBJECTIVES, default_objective, label_ids, make_objective
from ..causal.split import split_corpus
from ..errors import InputError, UnsupportedAnalysisError
from ..runs.pace import Tally
from ..text.inputs import Text, as_texts, iter_batches
from ..util import progress_bar
from .curves import ORDERS, Context, Curve, planned_calls, run_orders, schedule
from .redundancy import nearest
from .removal import parameter_count, removal_unsupported, remove_heads

#: Fewest random seeds (the random baseline's spread needs several).
MIN_SEEDS = 3


@dataclass
class PruneResult:
    """What :func:`prune` measured.

    Attributes:
        model: the model's name; objective, objective_reason, unit: what was measured and why.
        n_heads: heads of the original model (layers x heads); n_start: heads already removed.
        split: sizes and indices (into the texts given) of the scoring and held-out parts.
        curves: one row per point: ``order``, ``step``, ``fraction`` (of all heads), ``n_pruned``,
            ``heads`` (pruned at this step, a list of (layer, head); seed 0's for random;
            ``pruning.csv`` has one row per head, :func:`curves_csv`), ``value`` (the
            objective on the held-out part; the mean over seeds for random), ``std`` (random only).
        importance: [layers, heads] normalized importance of the model as given (NaN: removed).
        importance_raw: the same before normalization.
        distances: [layers, heads, heads] mean Jensen-Shannon distances (bits), or None.
        random_values: [seeds, points] the random order's values per seed, or None.
        removed: heads the first order prunes by its last step, removed from ``pruned_lm``.
        params_before, pruned_params: parameter counts of the model and of the pruned copy.
        speedup: forward time of the model / of the pruned copy on the held-out part: the median
            of :data:`SPEED_REPEATS` interleaved repeats; speedup_range: their lowest and highest.
        max_abs_diff: largest difference between the pruned copy's outputs and the gated model's.
        pruned_lm: the pruned copy (a LoadedModel), or None.
        notes: what the user should know; settings: the arguments of the run.
        timings: phase times (seconds).
    """

    model: str
    objective: str
    objective_reason: str
    unit: str
    n_heads: int
    n_start: int
    split: dict
    curves: pd.DataFrame
    importance: np.ndarray
    importance_raw: np.ndarray
    distances: np.ndarray | None
    random_values: np.ndarray | None
    removed: list[tuple[int, int]]
    params_before: int
    pruned_params: int | None = None
    speedup: float | None = None
    speedup_range: tuple[float, float] | None = None
    max_abs_diff: float | None = None
    pruned_lm: object = None
    notes: list[str] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """``{"model", "objective", "curves": {"importance": [[frac, value], ...], "redundancy": [...],
        "random": [[frac, mean, std], ...]}, "pruned_params", "params_before", "speedup"}``."""
        curves = {}
        for order, rows in self.curves.groupby("order", sort=False):
            if order == "random":
                curves[order] = [[float(r.fraction), float(r.value), float(r.std)] for r in rows.itertuples()]
            else:
                curves[order] = [[float(r.fraction), float(r.value)] for r in rows.itertuples()]
        return {"model": self.model, "objective": self.objective, "curves": curves,
                "pruned_params": self.pruned_params, "params_before": self.params_before,
                "speedup": None if self.speedup is None else float(self.speedup)}

    def heads_frame(self) -> pd.DataFrame:
        """Per-head columns for heads.csv: ``importance`` (normalized, the model as given),
        ``importance_raw``, ``nearest_js`` (distance to the closest other head of its layer, bits),
        ``pruned_step`` (the step at which the first order prunes it; empty if it is kept)."""
        L, H = self.importance.shape
        step = np.full((L, H), np.nan)
        first = self.curves[self.curves["order"] == self.curves["order"].iloc[0]]
        for row in first.itertuples():
            for layer, h in row.heads:
                step[layer, h] = row.step
        frame = pd.DataFrame({"layer": np.repeat(np.arange(L), H), "head": np.tile(np.arange(H), L),
                              "importance": self.importance.ravel(), "importance_raw": self.importance_raw.ravel(),
                              "pruned_step": step.ravel()})
        if self.distances is not None:
            mask = torch.tensor(~np.isnan(self.importance), dtype=torch.float32)
            frame["nearest_js"] = nearest(torch.as_tensor(self.distances), mask).numpy().ravel()
        return frame

    def record(self) -> dict:
        """The run.json entry: the JSON above plus the split, settings, notes, timings and checks."""
        return {**self.to_json(), "objective_reason": self.objective_reason, "unit": self.unit,
                "split": {k: v for k, v in self.split.items() if not k.endswith("_index")},
                "removed": [{"layer": int(layer), "head": int(h)} for layer, h in self.removed],
                "max_abs_diff": self.max_abs_diff,
                "speedup_range": None if self.speedup_range is None else [float(v) for v in self.speedup_range],
                "speedup_repeats": SPEED_REPEATS,
                "settings": self.settings, "notes": self.notes, "timings_s": self.timings}


def curves_csv(curves: pd.DataFrame) -> str:
    """``pruning.csv``: one row per (order, step, head pruned at that step), with the head as separate
    ``layer`` and ``head`` columns (a spreadsheet reads ``3.10`` as 3.1); a step that prunes no head
    (step 0, the model as given) has one row with both empty. Columns: ``order``, ``step``,
    ``fraction``, ``n_pruned``, ``value``, ``std``, ``layer``, ``head``."""
    rows = []
    for r in curves.itertuples():
        base = {"order": r.order, "step": r.step, "fraction": r.fraction, "n_pruned": r.n_pruned, "value": r.value,
                "std": r.std}
        rows += [{**base, "layer": layer, "head": h} for layer, h in r.heads] or [{**base, "layer": None, "head": None}]
    frame = pd.DataFrame(rows, columns=["order", "step", "fraction", "n_pruned", "value", "std", "layer", "head"])
    frame[["layer", "head"]] = frame[["layer", "head"]].astype("Int64")
    return frame.to_csv(index=False, float_format="%.6g")


def _curve_rows(curves: dict[str, Curve], n_heads: int) -> pd.DataFrame:
    rows = []
    for order, c in curves.items():
        values = c.values if c.values.ndim == 2 else c.values[None]
        mean = values.mean(0)
        std = values.std(0, ddof=1) if order == "random" else [np.nan] * len(mean)
        for step, (n, v, s, heads) in enumerate(zip(c.n_pruned, mean, std, c.added)):
            rows.append({"order": order, "step": step, "fraction": n / n_heads, "n_pruned": n,
                         "heads": [(int(a), int(b)) for a, b in heads], "value": float(v), "std": float(s)})
    return pd.DataFrame(rows, columns=["order", "step", "fraction", "n_pruned", "heads", "value", "std"])


def _output(lm, batch) -> torch.Tensor:
    out = forward(lm, batch)
    t = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
    return t[batch.real] if t.dim() == 3 else t


def copy_model(lm):
    """A deep copy of a LoadedModel's model (the tokenizer is shared)."""
    return dataclasses.replace(lm, model=copy.deepcopy(lm.model), pruned=copy.deepcopy(lm.pruned), notes=list(lm.notes))


#: Held-out batches used to compare and time the pruned copy (bounds the cost on large corpora).
COMPARE_BATCHES = 4


#: Interleaved timing repeats behind the pruned copy's forward speed (its median and range are shown).
SPEED_REPEATS = 5


def compare_and_time(lm, pruned_lm, mask: torch.Tensor, batches,
                     rounds: int = SPEED_REPEATS) -> tuple[float, float, tuple[float, float]]:
    """(max abs difference of the pruned model's outputs from the gated model's, forward-time
    ratio original / pruned, (lowest, highest) ratio), on the first :data:`COMPARE_BATCHES` of
    ``batches``.

    After a warm-up pass of each, ``rounds`` repeats time the original then the pruned copy side
    by side; each repeat gives one ratio, and the speed is their median (the range shows how much
    other work on the machine moved it; ``benchmarks/bench_prune.py`` measures more carefully).
    """
    batches = list(batches)[:COMPARE_BATCHES]
    diff = 0.0
    with torch.no_grad():
        for batch in batches:
            with gated(lm, mask):
                ref = _output(lm, batch)
            diff = max(diff, float((_output(pruned_lm, batch) - ref).abs().max()))

        def timed(model_lm) -> float:
            start = time.perf_counter()
            for batch in batches:
                forward(model_lm, batch)
            return time.perf_counter() - start

        timed(lm), timed(pruned_lm)
        ratios = [timed(lm) / timed(pruned_lm) for _ in range(rounds)]
    return diff, float(np.median(ratios)), (min(ratios), max(ratios))


def _validate(orders, steps, fraction, seeds, objective) -> list[str]:
    orders = list(orders)
    bad = [o for o in orders if o not in ORDERS]
    if bad or not orders or len(set(orders)) != len(orders):
        raise InputError(f"orders must be distinct names from {', '.join(ORDERS)}; got {', '.join(orders) or 'none'}")
    validate.positive_int("steps", steps)
    validate.fraction("fraction", fraction)
    if "random" in orders:
        validate.positive_int("seeds", seeds, MIN_SEEDS)
    if objective is not None and objective not in OBJECTIVES:
        raise InputError(f"unknown objective {objective!r}; choose from {', '.join(OBJECTIVES)}")
    return orders


def _split_batches(lm, texts, labels, held_out: float, seed: int, batch_size: int, max_length):
    """((scoring indices, held-out indices), (scoring batches, held-out batches)); each text's meta
    gets its corpus ``index`` and its class id ``label`` (or None)."""
    items = as_texts(validate.texts(texts))
    if labels is not None and len(labels) != len(items):
        raise InputError(f"{len(labels)} labels for {len(items)} sequences: give one label per sequence")
    ids = label_ids(lm, labels) if labels is not None else [None] * len(items)
    items = [Text(t.text, t.words, {**t.meta, "index": i, "label": ids[i]}, t.pair, target=t.target)
             for i, t in enumerate(items)]
    parts = split_corpus(len(items), held_out, seed)
    batches = tuple(list(iter_batches(lm, [items[i] for i in part], batch_size=batch_size, max_length=max_length))
                    for part in parts)
    return parts, batches


#: The error of :func:`prune` on an encoder-decoder model.
ONE_STACK_ONLY = "head pruning covers one-stack models (encoders, decoders); {} is an encoder-decoder model"


def prune(lm, texts: Sequence[str | Text], *, objective: str | None = None, labels: Sequence | None = None,
          orders: Sequence[str] = ORDERS, steps: int = 10, fraction: float = 0.5, seeds: int = 3,
          held_out: float = 0.5, split_seed: int = 0, batch_size: int = 16, max_length: int | None = None,
          probes: int = 2, physical: bool = True, progress: bool = False,
          estimate: Callable[[str], None] | None = None) -> PruneResult:
    """Run the head-pruning experiment on ``lm`` (left unchanged) and return the curves.

    Args:
        lm: a loaded model (a physically pruned one too: its removed heads count as pruned).
        texts: the corpus; split into scoring and held-out parts (:func:`split_corpus`).
        objective: one of ``clm``, ``mlm``, ``fidelity``, ``classification`` (default: chosen
            from the model, :func:`~probe.causal.objectives.default_objective`).
        labels: class ids or names aligned with ``texts`` (``classification``).
        orders: curves to run, from ``importance``, ``redundancy``, ``random``; the first one's
            final heads are the ones removed from the pruned copy.
        steps: points after step 0; fraction: share of all heads pruned by the last step, in (0, 1).
        seeds: random orders (at least 3). held_out: share of the texts held out. split_seed: the
            split's seed. probes: random projections per batch (``fidelity`` importance).
        physical: remove the heads from a copy, compare it with the gated model and time both.
        progress: tqdm bars (on stderr) on scoring and on every curve.
        estimate: given one line once a scoring pass (after the first) and an evaluation have run, where the
            curves' other calls will take :data:`probe.runs.pace.LONG_S` or more: their counts
            (:func:`planned_calls`), each one's latest time and the sum (seconds).

    Returns:
        A :class:`PruneResult`.

    Raises:
        UnsupportedAnalysisError: an encoder-decoder model.
        InputError: unknown order or objective, steps < 1, fraction
            outside (0, 1), fewer than 3 seeds, a corpus too small to split, labels not aligned
            with the texts, an objective the model cannot serve.
        ProbeError: the model's parameters are not floating point, or the gates get no gradient.
    """
    timings, t0 = {}, time.perf_counter()
    if lm.kind == "encoder-decoder":
        raise UnsupportedAnalysisError(ONE_STACK_ONLY.format(lm.name))
    orders = _validate(orders, steps, fraction, seeds, objective)
    (score_idx, eval_idx), (score, held) = _split_batches(lm, texts, labels, held_out, split_seed, batch_size,
                                                          max_length)
    g = lm.geometry
    start = ones(lm)
    n_heads, n_start = g.n_layers * g.n_heads, int((start == 0).sum())
    counts = schedule(n_heads, n_start, fraction, steps)
    name, reason = (objective, "given") if objective else default_objective(lm, labels is not None)
    obj = make_objective(name, seed=split_seed)
    obj.setup(lm, score + held)
    bar = None
    if progress:
        def bar(total, desc):
            return progress_bar(total=total, desc=desc, leave=False)
    timings["setup_s"] = time.perf_counter() - t0
    with gated(lm, start) as state:
        tally = Tally(planned_calls(orders, len(counts), seeds), "pruning curves", estimate)
        ctx = Context(lm, obj, state, score, held, start, counts, probes=probes, seed=split_seed, bar=bar,
                      with_distances="redundancy" in orders, tally=tally)
        # the model as given scored first (memoized: the greedy orders' first step and the importance column below
        # read it), so that the estimate has timed a scoring pass before the evaluations go on
        ctx.score_heads(start, distances="redundancy" in orders)
        curves, _ = run_orders(ctx, orders, seeds)
        imp, raw, dist = ctx.score_heads(start, distances="redundancy" in orders)
    timings["curves_s"] = time.perf_counter() - t0 - timings["setup_s"]
    nan = torch.where(start > 0, 0.0, float("nan")).double()
    result = PruneResult(
        model=lm.name, objective=name, objective_reason=reason, unit=obj.unit, n_heads=n_heads, n_start=n_start,
        split={"scoring": len(score_idx), "held_out": len(eval_idx), "seed": split_seed,
               "scoring_index": score_idx, "held_out_index": eval_idx},
        curves=_curve_rows(curves, n_heads), importance=(imp + nan).numpy(), importance_raw=(raw + nan).numpy(),
        distances=None if dist is None else dist.numpy(),
        random_values=curves["random"].values if "random" in curves else None,
        removed=curves[orders[0]].pruned, params_before=parameter_count(lm.model),
        settings={"orders": orders, "steps": steps, "fraction": fraction, "seeds": seeds, "held_out": held_out,
                  "batch_size": batch_size, "max_length": max_length, "probes": probes},
        notes=list(state.notes))
    if physical and removal_unsupported(lm):
        result.notes.append(f"heads not physically removed: {removal_unsupported(lm)}")
    elif physical:
        t1 = time.perf_counter()
        pruned_lm = copy_model(lm)
        removal = remove_heads(pruned_lm, result.removed)
        mask = start.clone()
        for layer, h in result.removed:
            mask[layer, h] = 0.0
        result.max_abs_diff, result.speedup, result.speedup_range = compare_and_time(lm, pruned_lm, mask, held)
        result.pruned_params, result.pruned_lm = removal.params_after, pruned_lm
        result.notes += removal.notes
        timings["physical_s"] = time.perf_counter() - t1
    result.timings = {k: round(v, 3) for k, v in timings.items()}
    return result
