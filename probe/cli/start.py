"""What every command does around its one library call: the prompt pairs read before torch is imported
(a bad pairs file answered at once), the :class:`~probe.entries.result.Console` the call talks through
(progress bars on a terminal, its lines on stderr, the time the command started), and the run folder
claimed when the call is about to load the model (after the input and the model's preview are checked,
before minutes of loading weights) and held until the command ends."""

from __future__ import annotations

import sys
import time

import click

from .. import IMPORT_STARTED
from ..util import process_age
from .group import hold


def read_pairs(pairs_file) -> list | None:
    """The pairs of ``pairs_file``, read and checked before torch is imported (:mod:`probe.text.pairfile`);
    None without a file (the library reads the built-in pairs).

    Raises:
        InputError: an unreadable file, a line without four or five fields, no pair.
    """
    if not pairs_file:
        return None
    from ..text.pairfile import pair_input

    return pair_input(pairs_file)[0]


class Folder:
    """The folder a command writes, claimed (:func:`probe.report.claim_run_dir`) when the library calls it
    before loading the model, with the name a default folder is named after; ``path`` once claimed."""

    def __init__(self, out, force: bool, kind: str = "run") -> None:
        self.out, self.force, self.kind, self.path = out, force, kind, None

    def __call__(self, name: str) -> None:
        from ..report import claim_run_dir

        self.path = hold(claim_run_dir(self.out, name, self.force, kind=self.kind))


def started() -> float:
    """``time.perf_counter()`` when the command started (the process's age where known, else probe's import)."""
    age = process_age()
    return time.perf_counter() - age if age is not None else IMPORT_STARTED


def command_console(progress: bool | None, before_load=None, *, say: bool = False, estimate: bool = False,
                    case=None, timings: dict | None = None, start: float | None = None):
    """The :class:`~probe.entries.result.Console` of a command: progress bars where asked (default: on a
    terminal), the call's lines on stderr (``say``: a line per stage where there are no bars; ``estimate``:
    a circuit's cost), ``before_load`` (a :class:`Folder`), the start time and earlier timings."""
    from ..entries.result import Console

    show = sys.stderr.isatty() if progress is None else progress
    echo = lambda line: click.echo(line, err=True)  # noqa: E731
    return Console(progress=show, announce=echo, say=echo if say and not show else None,
                   estimate=echo if estimate else None, case=case, before_load=before_load,
                   started=started() if start is None else start, timings={} if timings is None else timings)
