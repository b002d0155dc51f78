"""The accumulators' per-call work on a second thread, overlapped with the forward pass.

:func:`probe.runs.analysis.run` hands each site's probabilities to the accumulators as soon as the layer
has run. Called in the forward pass's own thread, the statistics (:mod:`probe.measures.stats`, whose
compiled pass runs on one core for the small maps of short texts) and the pattern accumulators keep the
other cores idle while the next layer waits; at two threads the forward pass is nearly twice as fast
and the statistics are not, so their share grows (issue 49: analyze() 1.35x a bare sdpa forward at one
thread, 1.44-1.50x at two).

:class:`Overlap` runs those calls on one worker thread instead, in the order they were made:
``begin_batch``, every ``update`` of every site, ``end_batch``, batch after batch, each accumulator's
calls in the order of the serial loop. The forward pass goes on with the next layer (and batch) meanwhile:
torch's operations and the compiled kernel release the GIL, so the worker's arithmetic fills the cores
the forward pass leaves idle. Nothing is added in another order, and the worker uses torch's and numba's
thread counts of the caller, so every sum is the one of the serial loop, bit for bit (tests/test_overlap.py).

Where it can apply (:func:`enabled`): maps on the CPU, torch on more than one thread (one thread is
one core, and ``--threads 1`` is how a user gives probe one core: the worker would take a second), whole
maps (a block-captured batch runs serially: its blocks must not queue up), not inside :func:`serial`, and
not turned off by the environment variable :data:`ENV`. Accumulators that hook the model themselves
(``hooks_model``: their hooks fill state that their calls read) always run in the forward pass's thread.

Where it applies, whether it runs (:class:`Policy`, :data:`ENV`):

- ``PROBE_OVERLAP=0`` (or ``off``, ``no``, ``false``): never, the serial loop everywhere;
- ``PROBE_OVERLAP=1`` (or ``on``, ``yes``, ``true``): always;
- unset (``auto``, the default; any other value reads as ``auto``): where torch has fewer threads than
  the cores this process may use (:func:`probe.threads.cores`), always: the worker has a core of its own.
  Where torch already has every core, the run measures both loops on its first whole-map batches and
  keeps the faster: its first batch overlapped (untimed: the worker's first calls), then one batch
  overlapped, one serial, one overlapped, each timed to the end of its calls and divided by its padded
  tokens (the serial batch bracketed, so a trend in the batches' lengths or the machine's load cancels);
  the serial loop is kept where its rate is lower than the overlapped batches' mean by more than
  :data:`MARGIN`, else the overlap. Either way it measures again after a batch with :data:`GROWN` times the
  padded tokens of the measured ones (batches are sorted by length, and the first ones, a few tokens each,
  measure the per-call overheads more than the statistics: on a quiet machine they favoured the overlap,
  0.70-0.96x the serial loop's time per token, where the whole run favoured the serial loop, and on a busy
  one the other way round); a run that kept the serial loop also measures again every :data:`RECHECK`
  batches (a machine that got busy during the run), one that kept the overlap does not (each measurement
  runs a serial batch, which costs several batches' time on a busy machine). A run of
  fewer than four whole-map batches ends before the measurement: it runs overlapped (three batches:
  overlapped, overlapped, serial).

Why a measurement and not a fixed rule (docs/measurements.md, "The statistics beside the forward pass";
minilm, 500 sentences, 2 shared cores, bare sdpa forward = 1): on a quiet machine (load 0.9-1.5) at two
threads the overlap cost time, analyze() 1.48x overlapped against 1.21x serial and the default analysis
1.69x against 1.51x (the worker competes with torch's two threads for two cores); on a busy one (load
4-8) the serial loop collapsed to 3.7-5.2x and the overlap did not (0.71-0.77x), and at load 2.8-3.7
serial 1.44x against 0.36x overlapped. Where the line between them lies depends on the machine and on
what else runs; the load average (:func:`os.getloadavg`) counts this process's own threads of the minute
before (a notebook's previous analysis, a benchmark's previous part) and not how a virtual machine's
cores are shared; the run's own batches measure what the run gets.

An exception raised by a call in the worker is raised again, as it is, in the caller's thread at its
next hand-over or when the batch's calls are waited for (:meth:`Overlap.join`); the calls queued after it
are dropped. An interrupt (Ctrl-C) reaches the caller's thread as before; :meth:`Overlap.close` then drops
what is queued and waits for the call in progress.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from ..threads import cores

#: Environment variable: ``0`` (or :data:`OFF`) runs every accumulator in the forward pass's thread (the
#: serial loop); ``1`` (or :data:`ON`) the overlap wherever it applies (:func:`enabled`); unset or anything
#: else ``auto``: the faster of the two, measured on the run's first batches (:class:`Policy`).
ENV = "PROBE_OVERLAP"
#: The values of :data:`ENV` that turn the overlap off.
OFF = ("0", "off", "no", "false")
#: The values of :data:`ENV` that turn the overlap on wherever it applies, without a measurement.
ON = ("1", "on", "yes", "true")
#: ``auto`` keeps the serial loop only where its time per token is below the overlapped batches' mean by more
#: than this fraction (the overlapped batches are timed to the end of their last call, which the next batch
#: would overlap: a bias of a few percent against them; a tie goes to the overlap, whose worst case is smaller).
MARGIN = 0.05
#: ``auto``, after keeping the serial loop: whole-map batches before it measures both loops again.
RECHECK = 16
#: ``auto`` measures again (from the next batch) once a batch has this many times the padded tokens of the last
#: measurement's largest (sorted batches grow, and the statistics' share with them: their maps grow as the
#: square of the length, the forward pass nearly linearly).
GROWN = 2
#: At most this many hand-overs per site of the model wait in the queue (each holds its site's maps).
QUEUED_PER_SITE = 2
#: True inside :func:`serial` (this thread or task): the serial loop.
_SERIAL = contextvars.ContextVar("probe_overlap_serial", default=False)


@contextmanager
def serial():
    """Run the accumulators in the forward pass's thread inside this block, whatever :func:`enabled` says
    elsewhere. For one short text answered while someone waits (the live page's edits): the hand-over at
    every layer then costs more than it overlaps (measured on a quiet 2-core machine, SmolLM2 with 60 tokens:
    an edit 287 ms overlapped, 242 ms serial, beside a 157 ms bare forward pass)."""
    token = _SERIAL.set(True)
    try:
        yield
    finally:
        _SERIAL.reset(token)


def mode(environ=None) -> str:
    """:data:`ENV` read from ``environ`` (default ``os.environ``): ``"off"``, ``"on"`` or ``"auto"``."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    return "off" if value in OFF else "on" if value in ON else "auto"


def enabled(device: torch.device | str, environ=None) -> bool:
    """Whether the accumulators' calls may run on a worker thread (the module docstring): maps on the CPU
    (``device``), torch on more than one thread, :data:`ENV` not set to one of :data:`OFF`, and not
    inside :func:`serial`. Where it is True, :class:`Policy` says for which batches."""
    if _SERIAL.get() or mode(environ) == "off":
        return False
    return torch.device(device).type == "cpu" and torch.get_num_threads() > 1


#: What the last :class:`Policy` decided (:meth:`Policy.summary`; for benchmarks and diagnostics, not a result).
LAST: dict = {}


class Policy:
    """Which whole-map batches of one run are overlapped, where :func:`enabled` says the overlap may run
    (the rule: the module docstring).

    Use: before each whole-map batch, :meth:`begin` (True: overlap this batch), then, once the calls queued
    before it are done where :attr:`timing` says it is measured, :meth:`start`; after its calls (those of a
    measured overlapped batch waited for, :meth:`Overlap.join`), :meth:`end` with its padded token count.
    A block-captured batch calls none of them.

    Args:
        setting: ``"on"``, ``"auto"`` (:func:`mode`; ``"off"`` is no policy: :func:`enabled` is False).
        threads: torch's intra-op threads (default :func:`torch.get_num_threads`).
        n_cores: the cores this process may use (default :func:`probe.threads.cores`).
        clock: seconds (default :func:`time.perf_counter`; tests give a scripted one).
    """

    #: The measurement's batches, in order: (overlapped, timed).
    FIRST = ((True, False), (True, True), (False, True), (True, True))
    AGAIN = ((True, True), (False, True), (True, True))

    def __init__(self, setting: str = "auto", threads: int | None = None, n_cores: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.threads = torch.get_num_threads() if threads is None else threads
        self.cores = cores() if n_cores is None else n_cores
        self.setting = setting
        self.clock = clock
        #: "on" (always), "core left over" (always), "measured" (the trial decides)
        self.reason = "on" if setting == "on" else "core left over" if self.threads < self.cores else "measured"
        self._plan = list(self.FIRST) if self.reason == "measured" else []
        self._chosen = True  # where no plan is left: overlap, until a measurement says otherwise
        self._rates: dict[bool, list[float]] = {True: [], False: []}
        self._measured: list[int] = []  # the padded tokens of the measurement's timed batches so far
        self._since = 0  # whole-map batches since the last decision
        self._tokens = 0  # the largest padded token count of the last measurement's batches
        self._grown = False  # a batch since the last decision had GROWN times those tokens
        self._now: tuple[bool, bool, float] | None = None
        self.trials: list[dict] = []  # each measurement: its rates (s per token) and the choice

    def begin(self) -> bool:
        """Whether the next whole-map batch runs overlapped."""
        if not self._plan and ((not self._chosen and self._since >= RECHECK) or self._grown):
            self._plan = list(self.AGAIN)
        overlapped, timed = self._plan[0] if self._plan else (self._chosen, False)
        self._now = (overlapped, timed, 0.0)
        return overlapped

    def start(self) -> None:
        """The batch begun last starts now (after the calls queued before it: a measured batch's clock)."""
        if self._now is not None and self._now[1]:
            self._now = (self._now[0], True, self.clock())

    @property
    def timing(self) -> bool:
        """Whether the batch begun last is measured (an overlapped one must then be waited for before :meth:`end`)."""
        return self._now is not None and self._now[1]

    def end(self, tokens: int) -> None:
        """The batch begun last ended (its calls done), with ``tokens`` padded tokens (batch x length)."""
        if self._now is None:
            return
        overlapped, timed, t0 = self._now
        seconds = self.clock() - t0 if timed else 0.0
        self._now = None
        if self._plan:
            self._plan.pop(0)
            if timed:
                self._rates[overlapped].append(seconds / max(1, tokens))
                self._measured.append(tokens)
            if not self._plan:
                self._decide()
        else:
            self._since += 1
            self._grown = self._grown or (self._tokens > 0 and tokens >= GROWN * self._tokens)  # 0: never measured

    def _decide(self) -> None:
        over = sum(self._rates[True]) / len(self._rates[True])
        ser = sum(self._rates[False]) / len(self._rates[False])
        self._chosen = not ser < over * (1 - MARGIN)
        self._tokens = max(self._measured)
        self.trials.append({"overlapped_s_per_token": over, "serial_s_per_token": ser, "tokens": self._tokens,
                            "chose": "overlap" if self._chosen else "serial"})
        self._rates, self._measured = {True: [], False: []}, []
        self._since = 0
        self._grown = False

    def summary(self) -> dict:
        """The setting, threads, cores, the reason and each measurement (JSON-ready)."""
        return {"setting": self.setting, "threads": self.threads, "cores": self.cores, "reason": self.reason,
                "trials": list(self.trials)}


class Overlap:
    """One worker thread running the calls handed to it (:meth:`submit`) in order.

    The worker runs with the caller's torch thread count and without gradients, as the analysis loop
    (both are per thread in torch), so that its operations are those the loop would have run. Use as a
    context manager: on exit every call is waited for (:meth:`join`) and the worker stopped; after an
    exception or interrupt what is still queued is dropped.

    Args:
        limit: at most this many calls wait in the queue; :meth:`submit` blocks beyond it (the maps each
            call holds are not freed before it ran).
    """

    def __init__(self, limit: int = 64) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, limit))
        self._error: BaseException | None = None
        self._drop = False
        self._threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._loop, name="probe-accumulators", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        if torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)
        torch.set_grad_enabled(False)  # as the analysis loop (torch.no_grad: per thread)
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None and not self._drop:
                    fn, args, kwargs = item
                    fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there as it is
                self._error = exc
            finally:
                self._queue.task_done()

    def submit(self, fn: Callable, *args, **kwargs) -> None:
        """Run ``fn(*args, **kwargs)`` on the worker after the calls handed over before it.

        Raises:
            the exception an earlier call raised on the worker, as it is (the calls are then dropped).
        """
        self.raise_error()
        self._queue.put((fn, args, kwargs))

    def join(self) -> None:
        """Wait until every call handed over has run.

        Raises:
            the first exception a call raised on the worker, as it is.
        """
        self._queue.join()
        self.raise_error()

    def raise_error(self) -> None:
        """Raise the first exception a call raised on the worker (once), if any."""
        exc = self._error
        if exc is not None:
            self._drop = True
            self._error = None
            raise exc

    def close(self) -> None:
        """Stop the worker: the call in progress finishes, whatever is still queued is dropped."""
        if not self._thread.is_alive():
            return
        self._drop = True
        self._queue.put(None)
        self._thread.join()

    def __enter__(self) -> Overlap:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self.join()
            else:
                self._drop = True
        finally:
            self.close()


def submitter(overlap: Overlap | None) -> Callable:
    """``call(fn, *args, **kwargs)``: handed to ``overlap``'s worker, or run at once where it is None."""
    if overlap is None:
        return lambda fn, *args, **kwargs: fn(*args, **kwargs)
    return overlap.submit

