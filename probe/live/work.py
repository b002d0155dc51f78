"""What a live session is computing now, for the page's progress line, and the stop of a long request that a
newer one has replaced.

Activation patching on the live page runs every head twice (all positions, the last one): 2 x layers x heads
patched runs (SmolLM2-135M: 540 runs in 30 patched passes, 8-30 s on 2 cores). While it runs:

- :class:`Work` holds the request's progress (runs done of all, seconds so far, the estimate line
  :class:`probe.effects.patch_layers.PatchForecast` gives after the first passes). It is read without the
  session's lock (``GET /api/progress`` answers while the model works; the notebook widget is sent each
  step, its kernel being busy with the work).
- A request is :class:`Superseded` when a newer request of the same page makes it useless: a newer patch
  request, or a newer edit (the clean text changed). It stops at its next step (a patched pass) and is
  answered as stale (409), so that the page's next edit waits for one patched pass, not for the whole run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager


class Superseded(Exception):
    """A request stopped because a newer one of the same page replaced it (answered 409, as a stale one)."""


class Work:
    """The request the session is computing now (one at a time: the session's lock), thread-safe.

    Args:
        clock: seconds, monotonic (tests give a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._now: dict | None = None

    @contextmanager
    def running(self, route: str, page: str | None):
        """Mark ``route`` of ``page`` (None: a caller without a page) as running inside the block."""
        with self._lock:
            self._now = {"route": route, "page": page, "done": 0, "total": None, "estimate": None,
                         "started": self.clock()}
        try:
            yield self
        finally:
            with self._lock:
                self._now = None

    def step(self, done: int, total: int) -> None:
        """``done`` of ``total`` units of the running request are done (patching: patched runs)."""
        with self._lock:
            if self._now is not None:
                self._now.update(done=int(done), total=int(total))

    def estimate(self, line: str) -> None:
        """The running request's estimate line (patching: after its first passes)."""
        with self._lock:
            if self._now is not None:
                self._now["estimate"] = str(line)

    def snapshot(self, page: str | None = None) -> dict:
        """The progress as the page draws it: ``{"busy": False}`` when nothing runs, else ``busy``, ``route``,
        ``done``, ``total`` (None before the first step), ``seconds`` (since the request started, s),
        ``estimate`` (a line or None) and ``yours`` (the request is ``page``'s; another page's work is only
        said to be running, not whose)."""
        with self._lock:
            now = None if self._now is None else dict(self._now)
        if now is None:
            return {"busy": False}
        return {"busy": True, "route": now["route"], "done": now["done"], "total": now["total"],
                "seconds": round(self.clock() - now["started"], 3), "estimate": now["estimate"],
                "yours": page is not None and page == now["page"]}


__all__ = ["Superseded", "Work"]
