"""Circuits evaluated by running them: faithfulness of the top-scoring edges against random circuits.

A circuit C is a set of edges. Its pass runs the clean prompts with every input fed the current
pass's stream minus, for each edge into it outside C, its writer's current write minus the
corrupted run's write (:class:`~probe.circuits.feeds.Patch`; the norms before each input recomputed
from that stream). An edge in C carries what its writer writes in this pass; a writer cut off from
the embeddings inside C writes what it wrote in the corrupted run, so it adds nothing to the edges
it feeds. The complete graph's pass is the clean run; the empty graph's, the corrupted run. Each
pass is planned first (:mod:`probe.circuits.passplan`: the circuit pruned to its paths, each input from
the cheaper of two equal sums), and a circuit whose plan is the clean or the corrupted run is not run.

Faithfulness F(C) = (M(C) - M(empty)) / (M(full) - M(empty)), M the mean logit difference over the
pairs: F(full) = 1 and F(empty) = 0 by construction, the two passes being run the same way as
any other. Baseline: circuits of the same number of edges drawn uniformly among all edges, one per
seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..effects.pairs import EncodedPairs
from ..effects.patch_layers import Recorded, blocks, copied, entered, reentry_refusal
from .attribution import batches, capture_writes, logit_diff, metric_positions
from .feeds import Patch
from .forward import split_pass
from .graph import Graph, edge_matrix
from .passplan import PassPlan, first_change, pass_key, plan_pass
from .wiring import Wiring

#: Circuit sizes of the faithfulness curve, as shares of all edges.
SHARES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


def excluded_matrix(graph: Graph, included: np.ndarray) -> torch.Tensor:
    """[inputs, writers] True for the edges outside a circuit.

    Args:
        included: [edges] boolean, True for the edges of the circuit (the graph's edge order).
    """
    return torch.as_tensor(edge_matrix(graph, ~np.asarray(included, dtype=bool)))


def top_edges(scores: np.ndarray, k: int) -> np.ndarray:
    """[edges] boolean: the ``k`` edges of largest absolute score (ties: the earlier edge)."""
    order = np.argsort(-np.abs(scores), kind="stable")
    out = np.zeros(len(scores), dtype=bool)
    out[order[:k]] = True
    return out


def random_edges(n_edges: int, k: int, seed: int) -> np.ndarray:
    """[edges] boolean: ``k`` edges drawn uniformly without replacement (``numpy`` generator ``seed``)."""
    out = np.zeros(n_edges, dtype=bool)
    out[np.random.default_rng(seed).choice(n_edges, size=k, replace=False)] = True
    return out


class Evaluator:
    """Runs circuits of one model on one set of pairs; the clean and corrupted writes are recorded once.

    Each circuit is planned first (:func:`~probe.circuits.passplan.plan_pass`): pruned to its paths,
    each input built from the cheaper of its own and its corrupted stream; a circuit whose pruned form
    is the clean or the corrupted run is not run (its M is that run's, bit for bit), nor is one whose
    pruned form was run before (its M is remembered: greedy pruning tries many circuits that differ
    only in edges off their paths).

    A pass re-enters the model at the lowest layer where its plan differs from the last pass's
    (:func:`~probe.circuits.passplan.first_change`): the blocks below answer what they returned in that
    pass (:func:`~probe.effects.patch_layers.entered`), and the writers there keep the differences they
    wrote, so the pass computes its changed layers only. Greedy pruning's circuits differ from the one
    run before by a few edges. Re-entered passes are also run whole until one that computed a block gave
    the whole pass's logits bit for bit; one that differs or raises turns re-entry off, and the evaluator
    runs whole passes from then on (:attr:`reentry_refused` says why).

    Args:
        lm, wiring, graph: the model, its wiring and graph.
        enc: the encoded pairs; batch_size: pairs per pass.
        writes: the :class:`~probe.circuits.attribution.Writes` of each batch of ``batch_size`` pairs,
            when already captured (the edge scores' own), or None: two passes a batch here.

    Attributes:
        passes: circuits evaluated; runs: those that needed a pass (a pass a batch each); remembered:
            those whose pruned form had been run before.
        layers_run: blocks computed by the runs, summed over runs (a whole pass computes every layer;
            a batch counted once; the whole passes that checked re-entered ones included); reentry_refused:
            why passes are not re-entered, or None.
    """

    def __init__(self, lm, wiring: Wiring, graph: Graph, enc: EncodedPairs, batch_size: int = 8,
                 writes: list | None = None) -> None:
        self.lm, self.wiring, self.graph, self.enc = lm, wiring, graph, enc
        self.rows = batches(len(enc), batch_size)
        self.writes = writes if writes is not None else [capture_writes(lm, wiring, graph, enc, rows)
                                                         for rows in self.rows]
        self._diffs: list[torch.Tensor | None] = [None] * len(self.rows)
        self.passes = self.runs = self.remembered = self.layers_run = 0
        self._known: dict[bytes, float] = {}  # a pruned circuit's key (PassPlan.key) -> its M
        self._blocks = [layer.block for layer in wiring.layers]
        self.reentry_refused = reentry_refusal(lm)
        if self.reentry_refused is None and [id(b) for b in self._blocks] != [id(b) for b in blocks(lm)]:
            self.reentry_refused = "the graph's blocks are not the model's sites' blocks"
        self._checked = False  # a re-entered pass was checked against a whole one
        self._last: PassPlan | None = None  # the plan of the last pass, whose blocks' outputs are recorded
        self._outputs: list[list] = [[None] * len(self._blocks) for _ in self.rows]

    @property
    def ld_clean(self) -> float:
        """The clean run's mean logit difference."""
        return float(torch.cat([w.ld_clean for w in self.writes]).mean())

    @property
    def ld_corrupted(self) -> float:
        """The corrupted run's mean logit difference."""
        return float(torch.cat([w.ld_corrupted for w in self.writes]).mean())

    @property
    def coupled(self) -> list[bool]:
        """Layers whose heads' writes share the scale of a norm after the attention (Gemma 2's)."""
        return [layer.attn_post is not None for layer in self.wiring.layers]

    def plan(self, included: np.ndarray) -> PassPlan:
        """The :class:`~probe.circuits.passplan.PassPlan` of a circuit ([edges] boolean)."""
        corrupted = self.writes[0].corrupted
        return plan_pass(self.graph, edge_matrix(self.graph, included), corrupted.dtype, corrupted.device,
                         self.coupled)

    def forget(self) -> None:
        """Forget the M of every circuit run so far, and the last pass's blocks: the next pass of each circuit
        is run again, whole (to time it)."""
        self._known.clear()
        self._last = None

    def needs_pass(self, included: np.ndarray) -> bool:
        """Whether the circuit ([edges] boolean) is run: its pruned form is neither the clean nor the
        corrupted run (:func:`~probe.circuits.passplan.pass_key`) and has not been run before."""
        return bool(self.pending([included]))

    def pending(self, circuits) -> set[bytes]:
        """The keys (:attr:`~probe.circuits.passplan.PassPlan.key`) of the passes that ``circuits``
        ([edges] boolean each) will run: their distinct pruned forms that need a pass and have not been
        run. Two of them with the same pruned form cost one pass, so their count is ``len`` of this set,
        not the number of circuits for which :meth:`needs_pass` is true."""
        keys = {pass_key(self.graph, edge_matrix(self.graph, c), self.coupled) for c in circuits}
        return {k for k in keys if k is not None and k not in self._known}

    @torch.no_grad()
    def metric(self, included: np.ndarray) -> float:
        """M(C): the mean logit difference of the circuit's pass (module docstring).

        Args:
            included: [edges] boolean.
        """
        plan = self.plan(included)
        self.passes += 1
        if plan.run == "clean":
            return self.ld_clean
        if plan.run == "corrupted":
            return self.ld_corrupted
        if plan.key in self._known:
            self.remembered += 1
            return self._known[plan.key]
        self.runs += 1
        start = 0
        if self.reentry_refused is None and self._last is not None:
            start = first_change(self.graph, self._last, plan)
        self._last = None  # until every batch has recorded this pass
        values = []
        for b, (rows, writes) in enumerate(zip(self.rows, self.writes)):
            if self._diffs[b] is None:
                self._diffs[b] = torch.zeros_like(writes.corrupted)  # finite values, rewritten where needed
            where = metric_positions(self.enc, rows)
            if start and not self._checked:
                logits, start = self._checked_pass(b, plan, where, start)
            else:
                logits = self._pass(b, plan, where, start)
            values.append(logit_diff(logits, self.enc, rows, where).double().cpu())
        self.layers_run += len(self._blocks) - min(start, len(self._blocks))
        if self.reentry_refused is None:
            self._last = plan
        self._known[plan.key] = value = float(torch.cat(values).mean())
        return value

    def _checked_pass(self, b: int, plan: PassPlan, where: torch.Tensor, start: int) -> tuple[torch.Tensor, int]:
        """Batch ``b``'s pass re-entered at ``start`` and run whole, until a re-entered pass that computed a block
        gave the whole pass's logits bit for bit on every batch: (the logits, ``start``), or (the whole pass's
        logits, 0) where re-entering raised or gave other logits (re-entry is then refused)."""
        try:
            logits = self._pass(b, plan, where, start)
        except Exception as exc:  # noqa: BLE001 (a block that cannot be skipped: whole passes)
            logits, self.reentry_refused = None, f"re-entering a pass failed: {type(exc).__name__}: {exc}"
        whole = self._pass(b, plan, where, 0)
        same = logits is not None and torch.equal(logits, whole)
        if b == 0:  # the layers of both passes (the whole one, and the re-entered one where it is not kept)
            self.layers_run += len(self._blocks) if same else len(self._blocks) - min(start, len(self._blocks))
        if not same:
            differs = "a pass re-entered at a layer did not give the whole pass's logits"
            self.reentry_refused = self.reentry_refused or differs
            return whole, 0
        if b == len(self.rows) - 1 and start < len(self._blocks):  # a check that computed no block proves nothing
            self._checked = True
        return logits, start

    def _pass(self, b: int, plan: PassPlan, where: torch.Tensor, start: int) -> torch.Tensor:
        """Batch ``b``'s logits at ``where`` from the circuit's pass re-entered at block ``start`` (0: whole),
        recording what each computed block returned (a copy) for the next pass."""
        rows, writes, outputs = self.rows[b], self.writes[b], self._outputs[b]
        ids = self.enc.clean[rows]
        feed = Patch(self.graph, plan, writes.corrupted, writes.reads, writes.final, self._diffs[b], writes.inputs)

        def keep(i: int, out) -> None:
            if i >= start and self.reentry_refused is None:
                try:
                    outputs[i] = copied(out)
                except TypeError as exc:  # a block that returns something else: whole passes
                    self.reentry_refused = f"a block returned what cannot be recorded ({exc})"

        answers = outputs[:start]
        if start:  # the output that a computed block reads goes in as a copy: the record stays as it was
            answers[-1] = copied(answers[-1])
        with entered(self.lm, Recorded(answers, 1), start, self._blocks):
            return split_pass(self.lm, self.wiring, ids, self.enc.mask[rows], feed, positions=where, after_block=keep)


@dataclass
class Faithfulness:
    """The faithfulness curve.

    Attributes:
        frame: one row per circuit size: ``k`` (edges), ``share`` (of all edges), ``faithfulness`` (top
            k by absolute score), ``random_mean``, ``random_std`` (population std over the seeds),
            ``metric`` (M of the top-k circuit).
        m_full, m_empty: M of the complete and the empty circuit.
    """

    frame: pd.DataFrame
    m_full: float
    m_empty: float


def curve_circuits(scores: np.ndarray, sizes: list[int], seeds: int = 5) -> list[tuple[int, int | None, np.ndarray]]:
    """The circuits of the faithfulness curve, in the order they run: for each size k the top k edges
    (seed None), then ``seeds`` random circuits of k edges (seeds 0 .. seeds - 1); as (k, seed,
    [edges] boolean)."""
    n = len(scores)
    out = []
    for k in sizes:
        out.append((k, None, top_edges(scores, k)))
        out += [(k, s, random_edges(n, k, s)) for s in range(seeds)]
    return out


def faithfulness_curve(evaluator: Evaluator, scores: np.ndarray, sizes: list[int], seeds: int = 5,
                       progress=None) -> Faithfulness:
    """Faithfulness of the top-k circuits and of ``seeds`` random circuits of each size.

    Args:
        evaluator: an :class:`Evaluator`.
        scores: [edges] the edge scores.
        sizes: circuit sizes k (edges).
        seeds: random circuits per size (seeds 0 .. seeds - 1).
        progress: called after each circuit's pass with the number of passes so far, or None.

    Raises:
        ValueError: fewer than 1 seed, or a size outside 0 .. edges.
    """
    n = evaluator.graph.n_edges
    if seeds < 1 or any(not 0 <= k <= n for k in sizes):
        raise ValueError(f"sizes must lie in 0 .. {n} and seeds be >= 1")

    def run(included):
        value = evaluator.metric(included)
        if progress is not None:
            progress(evaluator.passes)
        return value

    full, empty = run(np.ones(n, dtype=bool)), run(np.zeros(n, dtype=bool))
    span = full - empty

    def faith(value):
        return (value - empty) / span if span != 0 else float("nan")

    values: dict = {}
    for k, seed, included in curve_circuits(scores, sizes, seeds):
        values.setdefault(k, {})[seed] = run(included)
    rows = []
    for k in sizes:
        top, rand = values[k][None], [faith(values[k][s]) for s in range(seeds)]
        rows.append({"k": k, "share": k / n, "faithfulness": faith(top), "random_mean": float(np.mean(rand)),
                     "random_std": float(np.std(rand)), "metric": top})
    return Faithfulness(pd.DataFrame(rows), full, empty)
