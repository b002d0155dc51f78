"""What a circuit run will still cost, from the passes it has timed so far: one line after its first
gradient pass and an updated line after each stage, each from the time measured up to then.

Everything is counted in forward passes of one batch of pairs (F): the edge scores cost batches x
(2 + 3 m) F (the clean and corrupted writes, then m forward and backward passes, a backward pass
about two forward ones); each circuit that needs a pass costs batches x ``circuit_cost`` F (a circuit
whose pruned form is the clean or the corrupted run needs none); the labelling analysis about
``label_passes`` F. F is re-measured at each line: the first line divides the first pass (two forward
passes and one forward and backward pass, 5 F) by 5, the line after the scores divides their time by
their F, the line after the faithfulness curve divides its time by its circuit passes. So a machine
whose load changes while the run goes is followed stage by stage (a stage run at another load than
the first pass took 20 times longer, or shorter, than the first line said).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: A circuit's pass in forward passes of the same batch (measured on SmolLM2, 2 CPU cores: 1.1 to 1.5),
#: until the run has timed its own.
CIRCUIT_COST = 1.3
#: A backward pass in forward passes.
BACKWARD = 2.0


def minutes(seconds: float) -> str:
    """``12 s`` below 90 s, else ``3.4 min``."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


@dataclass
class Forecast:
    """The time to come of one circuit run.

    Args:
        batches: batches of pairs; m: EAP-IG's points (1 for EAP).
        runs: circuits of the faithfulness curve that need a pass (each one pass a batch).
        greedy: the most circuits greedy pruning may run (0: no greedy stage).
        label_passes: the labelling analysis in F.
        clock: seconds, monotonic (the tests give a fake one).

    Attributes:
        forward: F in seconds as last measured (0 before the first pass).
        circuit_cost: a circuit's pass in F (:data:`CIRCUIT_COST` until greedy pruning has timed its own).
    """

    batches: int
    m: int
    runs: int
    greedy: int = 0
    label_passes: float = 0.0
    clock: Callable[[], float] = time.perf_counter
    started: float = field(default=0.0, init=False)
    forward: float = field(default=0.0, init=False)
    circuit_cost: float = field(default=CIRCUIT_COST, init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def elapsed(self) -> float:
        """Seconds since the forecast began (the start of the scores)."""
        return self.clock() - self.started

    @property
    def score_passes(self) -> float:
        """The edge scores in F: batches x (2 + (1 + BACKWARD) m)."""
        return self.batches * (2 + (1 + BACKWARD) * self.m)

    def _stages(self) -> tuple[float, float, float]:
        """(greedy at most, faithfulness, labelling) in seconds at the last F."""
        circuit = self.batches * self.circuit_cost * self.forward
        return self.greedy * circuit, self.runs * circuit, self.label_passes * self.forward

    def _tail(self, greedy: float, label: float, left: float) -> str:
        up_to = f", up to {minutes(greedy)} for greedy pruning" if greedy else ""
        return (f"{up_to}, {minutes(label)} for the labelling analysis; {minutes(left)} left on this machine as "
                "loaded now")

    def first_pass(self) -> str:
        """The line after the first gradient pass (two forward passes and a forward and backward one: 5 F)."""
        first = self.elapsed()
        self.forward = first / (2 + 1 + BACKWARD)
        scores = self.forward * self.score_passes
        greedy, faith, label = self._stages()
        return (f"estimate from the first pass ({first:.1f} s): about {minutes(scores)} for the scores, "
                f"{minutes(faith)} for faithfulness ({self.runs} circuit passes a batch)"
                + self._tail(greedy, label, scores - first + greedy + faith + label))

    def after_scores(self, seconds: float) -> str:
        """The line after the scores, which took ``seconds``: F re-measured from them."""
        self.forward = seconds / self.score_passes
        greedy, faith, label = self._stages()
        return (f"estimate after the scores ({seconds:.1f} s, {self.forward:.2f} s a forward pass of a batch): "
                f"about {minutes(faith)} for faithfulness ({self.runs} circuit passes a batch)"
                + self._tail(greedy, label, greedy + faith + label))

    def after_greedy(self, seconds: float, runs: int, curve_runs: int, whole: float | None = None) -> str:
        """The line after greedy pruning (``runs`` circuits run in ``seconds``; the others needed no pass):
        a circuit's pass re-measured from them, the faithfulness curve now ``curve_runs`` circuit passes.
        ``whole``: the layers those runs computed, in whole passes (a pass re-entered at a layer computes
        the layers above it only: :class:`~probe.circuits.evaluate.Evaluator`), or None: ``runs``."""
        passes = runs if whole is None else whole
        if passes:
            self.circuit_cost = seconds / (passes * self.batches) / self.forward if self.forward else CIRCUIT_COST
        self.greedy, self.runs = 0, curve_runs
        _, faith, label = self._stages()
        return (f"estimate after greedy pruning ({seconds:.1f} s, {runs} circuit passes a batch): about "
                f"{minutes(faith)} for faithfulness ({curve_runs} circuit passes a batch)"
                + self._tail(0, label, faith + label))

    def after_faithfulness(self, seconds: float, runs: int, whole: float | None = None) -> str:
        """The line after the faithfulness curve (``runs`` circuit passes a batch in ``seconds``): F
        re-measured from them (``whole``: the layers they computed, in whole passes, as in
        :meth:`after_greedy`; None: ``runs``)."""
        passes = runs if whole is None else whole
        if passes:
            self.forward = seconds / (passes * self.batches) / self.circuit_cost
        label = self.label_passes * self.forward
        return f"estimate after faithfulness ({seconds:.1f} s): about {minutes(label)} for the labelling analysis"
