"""The pace of a long batch: an estimate said once a long batch's cost is known, and a bar per layer.

One long text (5,000 words through SmolLM2) is one batch of one sequence: the bar that counts
sequences stays at 0 for minutes. :class:`Pace` watches each site's attention arrive within a batch
(:func:`probe.runs.analysis.run` calls :meth:`Pace.site_done` as each site's probabilities, or the
last query block of a block-captured site, have been handed to the accumulators; where they run beside
the forward pass, :mod:`probe.runs.overlap`, once they have run on them: its worker calls it, in order,
so that the pace is that of the statistics where they are the slower). From the time
between the first two sites it projects the batch: elapsed + (sites left) x (that time). The first
site is not the measure: it carries the embeddings and, on a machine's first run, the compile of
the statistics kernel. Where the projection reaches :data:`LONG_S`, and so would the batch's sites at the
second site's pace (the kernel's compile on a short text is no long batch), it says so once per run, in
one line, and (with progress on) shows a bar over the batch's sites.

The clock is :data:`clock` (a module attribute, so that a test can give a fake one: no test waits).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

from .. import util

#: A batch projected to take at least this long (seconds) is announced, with a bar over its sites.
LONG_S = 10.0
#: The clock read (seconds); tests replace it.
clock = time.perf_counter


def to_stderr(line: str) -> None:
    """Print ``line`` on stderr above any progress bar (tqdm's ``write``): the estimate of a command
    that shows progress bars but was given no line to say it with (``probe why``, ``patch``, ``path``
    labelling a long text)."""
    from tqdm import tqdm  # deferred: only when a long batch is said

    tqdm.write(line, file=sys.stderr)


def duration(seconds: float) -> str:
    """``'45 s'``, ``'3.2 min'``, ``'1.4 h'``: an estimate in the unit a person reads it in."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Pace:
    """Watches the sites of each batch and says when one batch will take long (module docstring).

    Args:
        sites: attention sites a forward pass of the model calls (a layer's self-attention, an
            encoder-decoder's cross-attention ... in order).
        say: called with the one line of the estimate (the command line prints it on stderr), or None.
        progress: show a bar over a long batch's sites.
        long_s: the threshold (seconds), default :data:`LONG_S`.
    """

    def __init__(self, sites: int, say: Callable[[str], None] | None = None, progress: bool = False,
                 long_s: float = LONG_S):
        self.sites, self.say, self.progress, self.long_s = sites, say, progress, long_s
        self.said: list[str] = []
        self._bar = None
        self._start = self._first = 0.0
        self._done = 0
        self._shape: tuple[int, int] = (0, 0)

    def begin(self, sequences: int, tokens: int) -> None:
        """A batch of ``sequences`` rows, ``tokens`` long (padded), starts."""
        self._close_bar()
        self._start, self._done, self._shape = clock(), 0, (sequences, tokens)

    def site_done(self) -> None:
        """One more site of the batch has been handed to the accumulators."""
        self._done += 1
        now = clock()
        if self._bar is not None:
            self._bar.update(1)
            return
        if self._done == 1:
            self._first = now
            return
        if self._done != 2 or self.sites < 3:
            return
        per = now - self._first
        total = (now - self._start) + per * (self.sites - 2)
        if total < self.long_s or per * self.sites < self.long_s:  # a first layer's one-off compile is no long batch
            return
        n, tokens = self._shape
        line = (f"this batch ({util.plural(n, 'sequence')} of up to {tokens:,} tokens) will take about "
                f"{duration(total)} on this machine: {per:.1f} s per attention layer (its forward pass and "
                f"statistics), {self.sites} of them")
        if not self.said and self.say is not None:
            self.say(line)
        self.said.append(line)
        if self.progress:
            self._bar = util.progress_bar(total=self.sites, initial=2, unit="layer", desc="this batch", leave=False)

    def end(self) -> None:
        """The batch is done."""
        self._close_bar()

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Passes:
    """Counts the passes of a run whose count is known before it starts (``update(1)`` per pass, as a
    progress bar is updated: ``probe effects``' ablation passes) and, once the second has run, says once
    what the rest will take at its pace, where that reaches :data:`LONG_S`. The first pass is not the
    measure (it carries one-off costs: a kernel's compile, the first call's set-up); the second's time,
    from the end of the first, is.

    Args:
        total: the passes the run will make.
        what: what they are, as the line names them (``"ablation passes"``).
        say: called with the one line, or None (nothing is said).
        bar: a progress bar updated with each pass too, or None.
        long_s: the threshold (seconds), default :data:`LONG_S`.
    """

    def __init__(self, total: int, what: str, say: Callable[[str], None] | None = None, bar=None,
                 long_s: float | None = None):
        self.total, self.what, self.say, self.bar = total, what, say, bar
        self.long_s = LONG_S if long_s is None else long_s
        self.said: list[str] = []
        self._done, self._first = 0, 0.0

    def update(self, n: int = 1) -> None:
        """``n`` more passes have run."""
        if self.bar is not None:
            self.bar.update(n)
        before, self._done = self._done, self._done + n
        if self.say is None or self.said:
            return
        now = clock()
        if before == 0:
            self._first = now
            return
        per = (now - self._first) / (self._done - 1)
        left = per * (self.total - self._done)
        if left < self.long_s:
            return
        line = (f"{self.what}: {self._done} of {self.total:,} run, {per:.2f} s each after the first; about "
                f"{duration(left)} left on this machine as loaded now")
        self.said.append(line)
        self.say(line)


class Tally:
    """Times a run made of calls of a few kinds whose numbers are known before it starts (``probe prune``'s
    scoring passes over the scoring batches, with their backward pass, and evaluations over the held-out
    batches) and says once what the rest will take, where that reaches :data:`LONG_S`.

    Each kind's pace is the time of its latest call, the run's first call excepted (it carries one-off costs:
    the first forward pass's set-up, a kernel's compile). The line is said once every kind that has calls
    left has a pace: (calls left of each kind) x (its pace), summed.

    Args:
        totals: the calls each kind will make, by name as the line says them (``{"scoring passes": 11,
            "evaluations": 61}``).
        what: what the run is, as the line names it (``"pruning curves"``).
        say: called with the one line, or None (nothing is said).
        long_s: the threshold (seconds), default :data:`LONG_S`.
    """

    def __init__(self, totals: dict[str, int], what: str, say: Callable[[str], None] | None = None,
                 long_s: float | None = None):
        self.totals, self.what, self.say = dict(totals), what, say
        self.long_s = LONG_S if long_s is None else long_s
        self.done = {kind: 0 for kind in self.totals}
        self.last: dict[str, float] = {}
        self.said: list[str] = []

    def timed(self, kind: str, seconds: float) -> None:
        """One call of ``kind`` ran, taking ``seconds``."""
        first = not any(self.done.values())
        self.done[kind] = self.done.get(kind, 0) + 1
        if first:
            return
        self.last[kind] = seconds
        if self.say is None or self.said:
            return
        left = {k: max(0, n - self.done.get(k, 0)) for k, n in self.totals.items()}
        if any(n and k not in self.last for k, n in left.items()):
            return
        seconds_left = sum(n * self.last[k] for k, n in left.items() if n)
        if not any(left.values()) or seconds_left < self.long_s:
            return
        parts = " and ".join(f"{n:,} {k} ({self.last[k]:.2f} s each)" for k, n in left.items() if n)
        line = f"{self.what}: {parts} left, about {duration(seconds_left)} on this machine as loaded now"
        self.said.append(line)
        self.say(line)

    @contextmanager
    def call(self, kind: str):
        """A context manager timing one call of ``kind``: :meth:`timed` once it returns (a call that raised is
        not counted)."""
        t0 = clock()
        yield
        self.timed(kind, clock() - t0)
