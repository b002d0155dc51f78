"""Greedy pruning of the edge graph: from the complete graph, remove the edges of lowest |score| as long
as the circuit's faithfulness stays at or above a threshold, re-evaluating the circuit after every
removal, in rounds repeated until a round removes nothing.

One round walks the circuit's edges from the lowest |score| up and tries to remove a run of the next
``chunk`` edges at once: if the circuit without them keeps faithfulness >= the threshold they go and
the chunk doubles; else the chunk halves, and an edge that cannot go alone stays (chunk back to 1).
Faithfulness is not monotone in the edges, so an edge kept in one round may go in the next: rounds
repeat until one removes nothing (converged) or the pass budget is spent (the result says which).
Faithfulness is :mod:`.evaluate`'s: (M(C) - M(empty)) / (M(full) - M(empty)), each circuit run by
its own pass (the corrupted run's writes on every edge outside it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .evaluate import Evaluator

#: Faithfulness the greedy circuit keeps, by default.
THRESHOLD = 0.8


@dataclass
class Greedy:
    """A greedy-pruned circuit.

    Attributes:
        circuit: [edges] boolean, the edges kept.
        faithfulness: its faithfulness (>= the threshold; NaN when M(full) = M(empty), and then
            nothing is removed).
        threshold: the faithfulness kept.
        rounds: rounds run; passes: circuits evaluated; converged: the last round removed nothing
            (else the pass budget ran out).
    """

    circuit: np.ndarray
    faithfulness: float
    threshold: float
    rounds: int
    passes: int
    converged: bool

    def record(self) -> dict:
        """A JSON-ready summary (no edge list)."""
        return {"edges": int(self.circuit.sum()), "faithfulness": self.faithfulness, "threshold": self.threshold,
                "rounds": self.rounds, "passes": self.passes, "converged": self.converged}


def greedy_circuit(evaluator: Evaluator, scores: np.ndarray, threshold: float = THRESHOLD,
                   max_passes: int | None = None, m_full: float | None = None, m_empty: float | None = None,
                   progress=None, on_round=None) -> Greedy:
    """Greedy pruning (module docstring).

    Args:
        evaluator: an :class:`~probe.circuits.evaluate.Evaluator`.
        scores: [edges] the edge scores (lowest |score| tried first; ties: the earlier edge first).
        threshold: the faithfulness to keep.
        max_passes: the most circuits evaluated (None: no limit).
        m_full, m_empty: M of the complete and the empty circuit, when already measured (else two passes).
        progress: called after each pass with the passes so far, or None.
        on_round: called after each round with (rounds so far, passes so far, edges kept, their
            faithfulness), or None.

    Returns:
        The :class:`Greedy` circuit.
    """
    n, passes = len(scores), [0]

    def run(included):
        passes[0] += 1
        value = evaluator.metric(included)
        if progress is not None:
            progress(passes[0])
        return value

    full = run(np.ones(n, dtype=bool)) if m_full is None else m_full
    empty = run(np.zeros(n, dtype=bool)) if m_empty is None else m_empty
    span = full - empty
    if span == 0:  # no faithfulness to keep: the pairs' runs do not differ
        return Greedy(np.ones(n, dtype=bool), float("nan"), threshold, 0, passes[0], True)

    def faith(included):
        return (run(included) - empty) / span if span != 0 else float("nan")

    kept, value = np.ones(n, dtype=bool), 1.0
    rounds, converged = 0, False
    budget = float("inf") if max_passes is None else max_passes
    while passes[0] < budget:
        rounds += 1
        order = [int(e) for e in np.argsort(np.abs(scores), kind="stable") if kept[e]]
        removed_any, i, chunk = False, 0, 1
        while i < len(order) and passes[0] < budget:
            trial = kept.copy()
            trial[order[i:i + chunk]] = False
            f = faith(trial)
            if f >= threshold:
                kept, value, removed_any = trial, f, True
                i += chunk
                chunk *= 2
            elif chunk > 1:
                chunk //= 2
            else:
                i += 1
        if on_round is not None:
            on_round(rounds, passes[0], int(kept.sum()), float(value))
        if not removed_any:
            converged = i >= len(order)  # a whole round without a removal
            break
    return Greedy(kept, float(value), threshold, rounds, passes[0], converged)
