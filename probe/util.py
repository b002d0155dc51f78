"""Small shared helpers that belong to no analysis: quieting transformers' logging."""

from __future__ import annotations

import os
from contextlib import contextmanager


@contextmanager
def quiet_transformers(progress_bars: bool = False):
    """Context manager: transformers logs only errors inside (and, unless ``progress_bars``, shows
    no progress bar); the previous settings are restored on exit."""
    from transformers.utils import logging as tlog  # deferred: transformers takes ~1.5 s to import

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
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return age if 0 <= age < 86400 * 365 else None
    except (OSError, ValueError, IndexError):
        return None
