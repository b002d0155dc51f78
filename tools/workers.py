"""The worker loop of the tools that try probe on a tiny model of every type (``tools/models_table.py``,
``tools/feature_matrix.py``), written once.

Each type runs in a worker process, one at a time (a crash or a hang costs one type, not the run, and
memory stays flat): the worker imports torch, transformers and probe once, then takes ``(model_type,
kind)`` jobs and calls the tool's function (``try_model.try_type``, ``try_features.try_features``) with
two callbacks that send messages back: ``("built", None)`` once the tiny model is built, ``("cell",
feature, cell)`` as each part is known (the feature matrix), and ``("row", row)`` at the end. The
:class:`Runner` waits for each message under a time cap (the build's, then each step's), stops the worker
at a time-out or finds it dead, and starts a fresh one for the next type (and every :data:`RECYCLE`
types). :func:`run_types` runs a list of types and tries a stopped one once more at the end in a fresh
worker (a busy machine slows one try, not two).
"""

from __future__ import annotations

import importlib
import inspect
import multiprocessing as mp
import queue
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: Most types one worker process runs before a fresh one replaces it (memory stays flat).
RECYCLE = 40
#: Seconds a fresh worker may take to import torch, transformers and probe, on top of the first cap.
START_CAP = 120.0


def worker(jobs, results, module: str, function: str) -> None:
    """The worker process's loop: ``function`` of the tools' ``module`` on each ``(model_type, kind)`` job,
    its messages put on ``results``; None ends it."""
    tools = Path(__file__).resolve().parent
    sys.path.insert(0, str(tools))
    sys.path.insert(0, str(tools.parent))  # this checkout's probe, not an installed one
    import torch  # deferred: only the worker process imports torch, transformers and probe

    torch.set_num_threads(1)
    fn = getattr(importlib.import_module(module), function)
    reports = "report" in inspect.signature(fn).parameters
    while True:
        job = jobs.get()
        if job is None:
            return
        model_type, kind = job
        callbacks = {"built": lambda: results.put(("built", None))}
        if reports:
            callbacks["report"] = lambda feature, cell: results.put(("cell", feature, cell))
        results.put(("row", fn(model_type, kind, **callbacks)))


@dataclass
class Outcome:
    """What one type's try gave.

    Attributes:
        row: the worker's row, or None where it was stopped or died.
        built: the ``built`` message came. cells: the ``cell`` messages, feature -> cell, in order.
        why: None with a row; else ``"timed out"`` or ``"crashed: the worker process exited with code N"``.
        seconds: from the job to the row (or to the stop).
    """

    row: dict | None
    built: bool = False
    cells: dict = field(default_factory=dict)
    why: str | None = None
    seconds: float = 0.0


class Runner:
    """One worker process at a time, running ``module.function`` (module docstring), replaced after a time-out,
    a crash or :data:`RECYCLE` types.

    Args:
        module, function: the tools' function a worker calls per type (``try_model``, ``try_type``).
        build_cap: seconds for the build (the ``built`` message). step_cap: seconds for each message after it.
    """

    def __init__(self, module: str, function: str, build_cap: float, step_cap: float):
        self.ctx = mp.get_context("spawn")
        self.module, self.function = module, function
        self.build_cap, self.step_cap = build_cap, step_cap
        self.proc, self.done = None, 0

    def _start(self) -> None:
        self.jobs, self.results = self.ctx.Queue(), self.ctx.Queue()
        self.proc = self.ctx.Process(target=worker, args=(self.jobs, self.results, self.module, self.function),
                                     daemon=True)
        self.proc.start()
        self.done = 0

    def stop(self) -> None:
        """Stop the worker now (a fresh one starts with the next type)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
            self.proc = None

    def _wait(self, cap: float):
        """The next message, ``("died", exit code)``, or None after ``cap`` seconds."""
        deadline = time.monotonic() + cap
        while True:
            try:
                return self.results.get(timeout=1.0)
            except queue.Empty:
                if not self.proc.is_alive():
                    return ("died", self.proc.exitcode)
                if time.monotonic() > deadline:
                    return None

    def run(self, model_type: str, kind: str) -> Outcome:
        """Try one type in the worker (started first where there is none or it has run :data:`RECYCLE` types)."""
        start_cap = 0.0
        if self.proc is None or self.done >= RECYCLE:
            self.stop()
            self._start()
            start_cap = START_CAP
        self.done += 1
        start = time.monotonic()
        self.jobs.put((model_type, kind))
        out = Outcome(None)
        msg = self._wait(self.build_cap + start_cap)
        while msg is not None and msg[0] in ("built", "cell"):
            if msg[0] == "built":
                out.built = True
            else:
                out.cells[msg[1]] = msg[2]
            msg = self._wait(self.step_cap)
        out.seconds = time.monotonic() - start
        if msg is not None and msg[0] == "row":
            out.row = msg[1]
            return out
        self.stop()
        out.why = "timed out" if msg is None else f"crashed: the worker process exited with code {msg[1]}"
        return out


def run_types(types: list[tuple[str, str]], runner: Runner, row_of: Callable[[str, str, Outcome], dict],
              stopped: Callable[[dict], bool], echo: Callable[[str], None], line: Callable[[dict], str]) -> list[dict]:
    """A row for every ``(model_type, kind)``, each tried in ``runner``'s worker; a row that ``stopped`` says was
    stopped (timed out) is tried once more at the end in a fresh worker.

    Args:
        row_of: the row of one try (the worker's, or one that says why it was stopped).
        echo: prints progress; line: a row's progress text.
    """
    rows = []
    try:
        for i, (model_type, kind) in enumerate(types, 1):
            rows.append(row_of(model_type, kind, runner.run(model_type, kind)))
            echo(f"[{i}/{len(types)}] {model_type} ({kind}): {line(rows[-1])}")
        for i, r in enumerate(rows):
            if stopped(r):
                runner.stop()  # a fresh worker for each retry
                rows[i] = row_of(r["type"], r["kind"], runner.run(r["type"], r["kind"]))
                echo(f"[again] {r['type']} ({r['kind']}): {line(rows[i])}")
    finally:
        runner.stop()
    return rows
