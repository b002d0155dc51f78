"""The estimate of a circuit run (probe.circuits.forecast) on a fake clock: the first line scales the
first pass by the passes to come, each later line re-measures a forward pass from the stage just timed,
so a run whose machine slows down or speeds up between stages is followed (no timed assertions)."""

from __future__ import annotations

import pytest

from probe.circuits.forecast import BACKWARD, CIRCUIT_COST, Forecast, minutes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_line_scales_the_first_pass_by_the_passes_to_come():
    clock = Clock()
    f = Forecast(batches=3, m=5, runs=40, label_passes=10, clock=clock)
    clock.now += 10.0  # two forward passes and one forward and backward pass: F = 2 s
    line = f.first_pass()
    assert f.forward == pytest.approx(10.0 / (3 + BACKWARD)) == 2.0
    scores, faith, label = 2.0 * 3 * (2 + 3 * 5), 40 * 3 * CIRCUIT_COST * 2.0, 10 * 2.0  # 102 s, 312 s, 20 s
    assert line == (f"estimate from the first pass (10.0 s): about {minutes(scores)} for the scores, "
                    f"{minutes(faith)} for faithfulness (40 circuit passes a batch), {minutes(label)} for the "
                    f"labelling analysis; {minutes(scores - 10 + faith + label)} left on this machine as loaded now")
    assert (minutes(scores), minutes(faith), minutes(label)) == ("1.7 min", "5.2 min", "20 s")


def test_a_stage_run_at_another_load_resets_the_forward_pass():
    # the first pass at one load, the scores 5 times slower: the line after the scores follows them
    clock = Clock()
    f = Forecast(batches=1, m=5, runs=20, label_passes=5, clock=clock)
    clock.now += 5.0
    f.first_pass()
    assert f.forward == 1.0
    line = f.after_scores(85.0)  # 17 F took 85 s: F = 5 s
    assert f.forward == 5.0
    faith = 20 * CIRCUIT_COST * 5.0
    assert line.startswith(f"estimate after the scores (85.0 s, 5.00 s a forward pass of a batch): about "
                           f"{minutes(faith)} for faithfulness (20 circuit passes a batch), 25 s for the labelling")
    # the curve ran faster again (the load fell): its passes set F for the labelling estimate
    line = f.after_faithfulness(13.0, 20)
    assert f.forward == pytest.approx(13.0 / 20 / CIRCUIT_COST)
    assert line == f"estimate after faithfulness (13.0 s): about {minutes(5 * f.forward)} for the labelling analysis"


def test_greedy_is_an_upper_bound_until_it_has_run_and_then_times_the_circuit_pass():
    clock = Clock()
    f = Forecast(batches=2, m=1, runs=10, greedy=2000, label_passes=4, clock=clock)
    clock.now += 5.0
    assert ", up to " in f.first_pass() and "for greedy pruning" in f.first_pass()
    f.after_scores(8.0)  # 2 x 5 F in 8 s: F = 0.8 s
    assert f.forward == pytest.approx(0.8)
    line = f.after_greedy(120.0, runs=50, curve_runs=12)  # 50 circuits run, 2 batches each: 1.2 s a pass
    assert f.circuit_cost == pytest.approx(1.2 / 0.8)
    assert line == (f"estimate after greedy pruning (120.0 s, 50 circuit passes a batch): about "
                    f"{minutes(12 * 2 * 1.2)} for faithfulness (12 circuit passes a batch), "
                    f"{minutes(4 * 0.8)} for the labelling analysis; {minutes(12 * 2 * 1.2 + 4 * 0.8)} left on this "
                    "machine as loaded now")
    assert "greedy" not in line.split("faithfulness")[1]


def test_greedy_times_a_whole_pass_from_the_layers_its_re_entered_passes_computed():
    """Greedy's passes re-enter the model at their first changed layer, so they cost less than the curve's
    whole passes: the circuit pass is timed per whole pass's worth of layers, not per run."""
    clock = Clock()
    f = Forecast(batches=2, m=1, runs=10, greedy=2000, label_passes=4, clock=clock)
    clock.now += 5.0
    f.first_pass()
    f.after_scores(8.0)  # F = 0.8 s
    line = f.after_greedy(120.0, runs=50, curve_runs=12, whole=25.0)  # 50 runs that computed 25 passes' layers
    assert f.circuit_cost == pytest.approx(120.0 / (25 * 2) / 0.8)  # 2.4 s a whole circuit pass
    assert "(120.0 s, 50 circuit passes a batch)" in line and f"about {minutes(12 * 2 * 2.4)} for faithfulness" in line
    f.after_faithfulness(48.0, runs=12, whole=10.0)  # 12 curve circuits run, 10 whole passes' worth of layers
    assert f.forward == pytest.approx(48.0 / (10 * 2) / 3.0)  # circuit_cost 2.4 / 0.8 = 3 F: F = 0.8 s again


def test_minutes_below_ninety_seconds_are_seconds():
    assert (minutes(12.4), minutes(89), minutes(90), minutes(150)) == ("12 s", "89 s", "1.5 min", "2.5 min")
