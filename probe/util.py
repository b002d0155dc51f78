"""Small shared helpers that belong to no analysis: quieting transformers' logging, counted nouns."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def quiet_transformers(progress_bars: bool = False):
    """Context manager: transformers logs only errors inside (and, unless ``progress_bars``, shows
    no progress bar); the previous settings are restored on exit."""
    from transformers.utils import logging as tlog

    level = tlog.get_verbosity()
    bars = tlog.is_progress_bar_enabled()
    tlog.set_verbosity_error()
    if not progress_bars:
        tlog.disable_progress_bar()
    try:
        yield
    finally:
        tlog.set_verbosity(level)
        if bars:
            tlog.enable_progress_bar()


def process_age() -> float | None:
    """Seconds since this process started (Linux: from /proc), or None where unknown."""
    import os

    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return age if 0 <= age < 86400 * 365 else None
    except (OSError, ValueError, IndexError):
        return None


def plural(n, noun: str, many: str | None = None) -> str:
    """A count with its noun in the right number: ``plural(1, "sequence")`` -> ``"1 sequence"``,
    ``plural(2, "sequence")`` -> ``"2 sequences"``, ``plural(3, "query", "queries")``.

    Args:
        n: the count (an int, or a number that is one only when it equals 1).
        noun: the singular noun.
        many: the plural noun (default: ``noun + "s"``).

    Returns:
        ``"<n> <noun>"`` with thousands separators (``1,024 tokens``).
    """
    from numbers import Integral

    word = noun if n == 1 else (many or noun + "s")
    return f"{int(n):,} {word}" if isinstance(n, Integral) and not isinstance(n, bool) else f"{n} {word}"
