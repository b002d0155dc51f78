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
  Where torch already has every core: only where the machine is busy when the run starts, its load average
  over the last minute (:func:`os.getloadavg`) above :data:`BUSY` per core (2 on 2 cores); where the
  system has no load average (Windows), always.

Why (docs/measurements.md, "The statistics beside the forward pass"; minilm, 500 sentences, 2 shared cores,
minima over the bare sdpa forward of the same thread count): on a quiet machine (load 0.8-1.7, this
process's own threads included) at two threads the overlap cost time, analyze() 1.48x overlapped against
1.17-1.21x serial and the default analysis 1.69-1.81x against 1.33-1.51x (the worker competes with torch's
two threads for two cores); on a busy one the serial loop collapsed (load 2.8-3.7: 1.44x against 0.36x
overlapped; load 4-8: 1.8-5.2x against 0.25-0.77x). A measurement on the run's own first batches (each
loop timed on alternate batches, the faster kept) was tried first and judged wrongly: batch by batch the
overlapped ones were 3-14% faster per token on the quiet machine where the whole run was 20-25% slower, and
on the busy one the short first batches favoured the serial loop. The load average counts this process's
own recent threads too (a notebook's previous analysis: up to torch's thread count): with the threshold at
one per core a process alone does not read its own threads as a busy machine.

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
from collections.abc import Callable
from contextlib import contextmanager

import torch

from ..threads import cores

#: Environment variable: ``0`` (or :data:`OFF`) runs every accumulator in the forward pass's thread (the
#: serial loop); ``1`` (or :data:`ON`) the overlap wherever it applies (:func:`enabled`); unset or anything
#: else ``auto``: the overlap where a core is left over or the machine is busy (:class:`Policy`).
ENV = "PROBE_OVERLAP"
#: The values of :data:`ENV` that turn the overlap off.
OFF = ("0", "off", "no", "false")
#: The values of :data:`ENV` that turn the overlap on wherever it applies, without a measurement.
ON = ("1", "on", "yes", "true")
#: ``auto`` overlaps where the load average over the last minute is above this many per core (the machine busy).
BUSY = 1.0
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


def load_average() -> float | None:
    """The system's load average over the last minute (:func:`os.getloadavg`), or None where it has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


class Policy:
    """Whether the whole-map batches of one run are overlapped (:attr:`overlapped`), where :func:`enabled`
    says the overlap may run (the rule: the module docstring), decided when the run starts.

    Args:
        setting: ``"on"``, ``"auto"`` (:func:`mode`; ``"off"`` is no policy: :func:`enabled` is False).
        threads: torch's intra-op threads (default :func:`torch.get_num_threads`).
        n_cores: the cores this process may use (default :func:`probe.threads.cores`).
        load: the load average over the last minute (default :func:`load_average`; None: unknown).
    """

    def __init__(self, setting: str = "auto", threads: int | None = None, n_cores: int | None = None,
                 load: float | None = -1.0) -> None:
        self.setting = setting
        self.threads = torch.get_num_threads() if threads is None else threads
        self.cores = cores() if n_cores is None else n_cores
        self.load = load_average() if load is not None and load < 0 else load
        if setting == "on":
            self.reason, self.overlapped = "on", True
        elif self.threads < self.cores:
            self.reason, self.overlapped = "core left over", True
        elif self.load is None:
            self.reason, self.overlapped = "no load average", True
        elif self.load > BUSY * self.cores:
            self.reason, self.overlapped = "busy", True
        else:
            self.reason, self.overlapped = "quiet", False

    def summary(self) -> dict:
        """The setting, threads, cores, load, the reason and the choice (JSON-ready)."""
        return {"setting": self.setting, "threads": self.threads, "cores": self.cores,
                "load": None if self.load is None else round(self.load, 2), "reason": self.reason,
                "overlapped": self.overlapped}


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

