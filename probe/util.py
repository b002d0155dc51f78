"""Small shared helpers that belong to no analysis: quieting transformers' logging, counted nouns,
progress bars that fit where they run."""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager
from numbers import Integral

from tqdm import TqdmWarning
from tqdm.std import tqdm as text_bar


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
    word = noun if n == 1 else (many or noun + "s")
    return f"{int(n):,} {word}" if isinstance(n, Integral) and not isinstance(n, bool) else f"{n} {word}"


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (an IPython shell that sends its output to a front end)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def quiet_notebook_tqdm() -> None:
    """In a Jupyter kernel without ipywidgets, import ``tqdm.auto`` once with its ``TqdmWarning``
    ("IProgress not found") silenced: transformers imports it, and the warning would be printed
    into every notebook that loads a model. tqdm then falls back to its text bar, as it would
    anyway. Does nothing elsewhere."""
    if not in_notebook() or "tqdm.auto" in sys.modules:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TqdmWarning)
        import tqdm.auto  # noqa: F401  # deferred: imported once here, with its warning silenced


def progress_bar(**kw):
    """A tqdm progress bar that fits where it runs: a widget in Jupyter when ipywidgets is
    installed, else tqdm's text bar (on stderr). Unlike ``tqdm.auto``, a notebook without
    ipywidgets gets the text bar without a ``TqdmWarning``.

    Args:
        **kw: passed to ``tqdm`` (total, desc, unit, leave ...).
    """
    if in_notebook():
        try:
            import ipywidgets  # noqa: F401  # deferred: optional; tqdm's notebook bar needs it
        except ImportError:
            pass
        else:
            from tqdm.notebook import tqdm as notebook_bar  # deferred: only in a notebook with ipywidgets

            return notebook_bar(**kw)
    return text_bar(**kw)


def formatted(value: float, spec: str) -> str:
    """``format(value, spec)``, a value that rounds to zero written without a sign (``0.000``, never
    ``-0.000``)."""
    text = format(value, spec)
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def fixed(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals, no sign on a value that rounds to zero (the Jinja filter
    ``fixed``)."""
    return formatted(value, f".{digits}f")
