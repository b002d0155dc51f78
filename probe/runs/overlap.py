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

Where it applies (:func:`enabled`): maps on the CPU, torch on more than one thread (one thread is one
core: no second one for the worker), whole maps (a block-captured batch runs serially: its blocks must
not queue up), and not turned off by the environment variable :data:`ENV` (``0``: the serial loop
everywhere). Accumulators that hook the model themselves (``hooks_model``: their hooks fill state that
their calls read) always run in the forward pass's thread.

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

#: Environment variable: ``0`` (or ``off``, ``no``, ``false``) runs every accumulator in the forward
#: pass's thread (the serial loop); unset or anything else: the overlap where it applies (:func:`enabled`).
ENV = "PROBE_OVERLAP"
#: The values of :data:`ENV` that turn the overlap off.
OFF = ("0", "off", "no", "false")
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


def enabled(device: torch.device | str, environ=None) -> bool:
    """Whether the accumulators' calls run on a worker thread (the module docstring): maps on the CPU
    (``device``), torch on more than one thread, :data:`ENV` not set to one of :data:`OFF`, and not
    inside :func:`serial`."""
    environ = os.environ if environ is None else environ
    if _SERIAL.get() or environ.get(ENV, "").strip().lower() in OFF:
        return False
    return torch.device(device).type == "cpu" and torch.get_num_threads() > 1


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

