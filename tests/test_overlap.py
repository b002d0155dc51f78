"""The accumulators' calls on a worker thread, overlapped with the forward pass (probe.runs.overlap):
every statistic equal to the serial loop's, bit for bit (``==``, not a tolerance), the calls in the
serial order, the serial loop where it must run (one thread, PROBE_OVERLAP=0, block capture, accumulators
that hook the model), the default policy's decisions (a core left over or a busy machine: overlapped; a quiet
one: serial; faked cores and load average) with the same statistics whichever it chose, and an accumulator's
exception leaving as it is, with no thread left behind."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from conftest import tiny_model
from probe.errors import InputError
from probe.measures.accumulators import Accumulator
from probe.patterns import pattern_accumulators
from probe.runs import overlap
from probe.runs.analysis import analyze

TEXTS = ["The quick brown fox, which was very quick, jumped over the lazy dog.", "Hello world!",
         "A (small) test: does it work? Yes; it does.", "One two three.", "Another, longer sentence about "
         "attention heads and what they look at in a text of some length.", "Short."] * 2

#: HeadStatistics' running state: every number the statistics are computed from.
STATE = ("sums", "counts", "norm_sums", "norm_counts", "mass_sums")


@pytest.fixture
def two_threads():
    """torch on two threads (the overlap's condition), put back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "probe-accumulators"]


class Where(Accumulator):
    """Records each call and the thread it ran on."""

    name = "where"

    def __init__(self):
        self.calls = []

    def begin_batch(self, batch):
        self.calls.append(("begin", tuple(batch.index), threading.current_thread().name))

    def update(self, site, probs, batch, rows=None):
        self.calls.append(("update", site.name, tuple(batch.index), threading.current_thread().name))

    def end_batch(self, batch):
        self.calls.append(("end", tuple(batch.index), threading.current_thread().name))

    def merge(self, other):
        return self

    def result(self):
        return self.calls


def analysed(lm, mode: str, monkeypatch, **kw):
    """analyze() with the default analysis's pattern accumulators, PROBE_OVERLAP set to ``mode``."""
    monkeypatch.setenv(overlap.ENV, mode)
    extra = [a for a in pattern_accumulators(lm) if a.refusal(lm) is None]
    return analyze(lm, TEXTS, batch_size=4, accumulators=extra, **kw)


def assert_identical(a, b):
    """Every statistic's running sum, the heads table and every accumulator's columns equal, bit for bit."""
    for key in STATE:
        x, y = getattr(a.stats, key), getattr(b.stats, key)
        assert x.dtype == y.dtype and torch.equal(x, y), key  # ==, not allclose
    assert a.heads.columns.tolist() == b.heads.columns.tolist()
    for column in a.heads.columns:
        x, y = a.heads[column].to_numpy(), b.heads[column].to_numpy()
        if x.dtype.kind == "f":
            assert np.array_equal(x, y, equal_nan=True), column
        else:
            assert (x == y).all(), column
    assert a.results.keys() == b.results.keys()


@pytest.mark.parametrize("kind", ["bert", "llama", "gpt2"])
def test_overlapped_statistics_equal_the_serial_ones_bit_for_bit(kind, monkeypatch, two_threads):
    lm = tiny_model(kind)
    assert overlap.enabled("cpu")
    serial = analysed(lm, "0", monkeypatch)
    overlapped = analysed(lm, "1", monkeypatch)
    assert_identical(serial, overlapped)
    assert torch.get_num_threads() == 2 and not workers()  # the caller's count kept; the worker stopped


def test_overlapped_statistics_of_minilm_equal_the_serial_ones_bit_for_bit(minilm, monkeypatch, two_threads):
    serial = analysed(minilm, "0", monkeypatch)
    overlapped = analysed(minilm, "1", monkeypatch)
    assert_identical(serial, overlapped)


def test_the_calls_run_on_the_worker_in_the_serial_order(monkeypatch, two_threads):
    lm = tiny_model("bert")
    calls = {}
    for mode in ("0", "1"):
        monkeypatch.setenv(overlap.ENV, mode)
        acc = Where()
        analyze(lm, TEXTS, batch_size=4, accumulators=[acc])
        calls[mode] = acc.calls
    assert [c[:-1] for c in calls["0"]] == [c[:-1] for c in calls["1"]]  # the same calls, in the same order
    assert {c[-1] for c in calls["0"]} == {"MainThread"}
    assert {c[-1] for c in calls["1"]} == {"probe-accumulators"}
    n_batches = len({c[1] for c in calls["1"] if c[0] == "begin"})
    assert len(calls["1"]) == n_batches * (2 + len(lm.sites)) and n_batches == 3


def test_serial_where_the_overlap_does_not_apply(monkeypatch, two_threads):
    monkeypatch.delenv(overlap.ENV, raising=False)
    assert overlap.enabled("cpu") and not overlap.enabled("cuda") and not overlap.enabled("meta")
    for off in ("0", "off", "No", "false"):
        assert not overlap.enabled("cpu", {overlap.ENV: off})
    assert overlap.enabled("cpu", {overlap.ENV: "1"})
    with overlap.serial():  # the live page's edits: one short text, answered serially
        assert not overlap.enabled("cpu") and not overlap.enabled("cpu", {overlap.ENV: "1"})
    assert overlap.enabled("cpu")
    torch.set_num_threads(1)  # one thread is one core: nothing to overlap with
    assert not overlap.enabled("cpu")
    lm = tiny_model("bert")
    acc = Where()
    analyze(lm, TEXTS[:4], batch_size=4, accumulators=[acc])
    assert {c[-1] for c in acc.calls} == {"MainThread"}


def test_block_captured_batches_run_serially_after_the_queued_calls(monkeypatch, two_threads):
    monkeypatch.delenv(overlap.ENV, raising=False)
    lm = tiny_model("bert")
    serial = analyze(lm, TEXTS, batch_size=4, query_block=0)
    monkeypatch.setenv(overlap.ENV, "0")
    blocked_serial = analyze(lm, TEXTS, batch_size=4, query_block=4)
    monkeypatch.delenv(overlap.ENV)
    blocked = analyze(lm, TEXTS, batch_size=4, query_block=4)
    for key in STATE:  # the blocks' sums: those of the serial loop's blocks exactly
        assert torch.equal(getattr(blocked.stats, key), getattr(blocked_serial.stats, key)), key
    assert torch.equal(blocked.stats.counts, serial.stats.counts)


class Failing(Accumulator):
    """Raises ``error`` on its ``at``-th update."""

    name = "failing"

    def __init__(self, error: BaseException, at: int = 3):
        self.error, self.at, self.seen = error, at, 0

    def update(self, site, probs, batch, rows=None):
        self.seen += 1
        if self.seen == self.at:
            raise self.error


@pytest.mark.parametrize("mode", ["0", "1"])
def test_an_accumulators_exception_leaves_as_it_is_and_no_thread_stays(mode, monkeypatch, two_threads):
    monkeypatch.setenv(overlap.ENV, mode)
    lm = tiny_model("bert")
    error = InputError("the accumulator refused this batch")
    acc = Failing(error)
    with pytest.raises(InputError) as caught:
        analyze(lm, TEXTS, batch_size=4, accumulators=[acc])
    assert caught.value is error and str(caught.value) == "the accumulator refused this batch"
    assert acc.seen == 3  # nothing after the failing call ran
    assert not workers()


class Interrupting(Where):
    """Hooks the model (so it runs in the forward pass's thread) and interrupts on its second update,
    as Ctrl-C during a forward pass would."""

    hooks_model = True

    def hook(self, hooks):
        pass

    def update(self, site, probs, batch, rows=None):
        super().update(site, probs, batch)
        if len([c for c in self.calls if c[0] == "update"]) == 2:
            raise KeyboardInterrupt


def test_an_interrupt_in_the_forward_pass_stops_the_worker(monkeypatch, two_threads):
    monkeypatch.setenv(overlap.ENV, "1")
    lm = tiny_model("bert")
    beside, stopper = Where(), Interrupting()
    with pytest.raises(KeyboardInterrupt):
        analyze(lm, TEXTS, batch_size=4, accumulators=[beside, stopper])
    assert not workers()
    assert {c[-1] for c in stopper.calls} == {"MainThread"}  # it hooks the model: the forward pass's thread
    assert {c[-1] for c in beside.calls} <= {"probe-accumulators"}


def test_the_worker_runs_calls_in_order_and_raises_the_first_error_once():
    done = []
    with pytest.raises(ZeroDivisionError):
        with overlap.Overlap(limit=2) as work:
            for i in range(5):
                work.submit(done.append, i)
            work.join()
            assert done == [0, 1, 2, 3, 4]
            work.submit(lambda: 1 / 0)
            work.submit(done.append, 5)
            work.join()
    assert done == [0, 1, 2, 3, 4] and not workers()


def test_auto_overlaps_where_a_core_is_left_over_or_the_machine_is_busy(monkeypatch):
    def policy(**kw):
        return overlap.Policy("auto", **kw)

    quiet = policy(threads=2, n_cores=2, load=1.5)  # measured: the serial loop faster here (load 0.8-1.7)
    assert not quiet.overlapped and quiet.reason == "quiet"
    assert not policy(threads=2, n_cores=2, load=2.0).overlapped  # at one per core: still quiet
    busy = policy(threads=2, n_cores=2, load=2.8)  # measured: the serial loop collapsed (load 2.8-8)
    assert busy.overlapped and busy.reason == "busy"
    assert policy(threads=8, n_cores=8, load=8.5).overlapped and not policy(threads=8, n_cores=8, load=7.9).overlapped
    spare = policy(threads=2, n_cores=4, load=0.0)  # the worker has a core of its own
    assert spare.overlapped and spare.reason == "core left over"
    unknown = policy(threads=2, n_cores=2, load=None)  # no load average (Windows): the smaller worst case
    assert unknown.overlapped and unknown.reason == "no load average"
    on = overlap.Policy("on", threads=2, n_cores=2, load=0.0)
    assert on.overlapped and on.reason == "on"
    assert on.summary() == {"setting": "on", "threads": 2, "cores": 2, "load": 0.0, "reason": "on", "overlapped": True}
    monkeypatch.setattr(overlap.os, "getloadavg", lambda: (3.25, 1.0, 1.0))
    assert overlap.load_average() == 3.25 and policy(threads=2, n_cores=2).load == 3.25
    assert overlap.mode({}) == "auto" and overlap.mode({overlap.ENV: "anything"}) == "auto"
    assert overlap.mode({overlap.ENV: " On"}) == "on" and overlap.mode({overlap.ENV: "1"}) == "on"
    assert overlap.mode({overlap.ENV: "0"}) == "off"


def batch_threads(acc: Where) -> set[str]:
    return {c[-1] for c in acc.calls}


@pytest.mark.parametrize("load, cores, env, thread, reason", [
    (1.0, 2, None, "MainThread", "quiet"),
    (5.0, 2, None, "probe-accumulators", "busy"),
    (0.0, 4, None, "probe-accumulators", "core left over"),  # torch on 2 of 4 cores
    (0.0, 2, "1", "probe-accumulators", "on"),
])
def test_auto_in_analyze_decides_per_run_with_the_same_statistics(load, cores, env, thread, reason, monkeypatch,
                                                                  two_threads):
    monkeypatch.setattr(overlap, "load_average", lambda: load)
    monkeypatch.setattr(overlap, "cores", lambda: cores)
    if env is None:
        monkeypatch.delenv(overlap.ENV, raising=False)
    else:
        monkeypatch.setenv(overlap.ENV, env)
    lm = tiny_model("llama")
    where = Where()
    extra = [a for a in pattern_accumulators(lm) if a.refusal(lm) is None]
    decided = analyze(lm, TEXTS, batch_size=4, accumulators=[where, *extra])
    assert batch_threads(where) == {thread}
    assert overlap.LAST["reason"] == reason and overlap.LAST["load"] == load
    monkeypatch.setenv(overlap.ENV, "0")
    serial = analyze(lm, TEXTS, batch_size=4, accumulators=[Where(), *pattern_accumulators(lm)])
    assert_identical(serial, decided)
    assert overlap.LAST["reason"].startswith("serial") and not workers()


@pytest.mark.parametrize("mode", ["", "1"])
def test_a_live_edit_runs_serially_whatever_the_setting(mode, monkeypatch, two_threads):
    from probe.live.session import LiveSession

    monkeypatch.setenv(overlap.ENV, mode)
    monkeypatch.setattr(overlap, "cores", lambda: 4)  # even where a core is left over
    LiveSession(tiny_model("bert")).analysis("The cat sat on the mat.")
    assert overlap.LAST == {"setting": "on" if mode else "auto", "reason": "serial: no overlap applies"}
    assert not workers()
