"""One validator for each check of user input, shared by the Python API and the command line.

The checks of numbers and texts live in :mod:`probe.bounds` (which imports no heavy library, so the
command line checks its options without torch) and are re-exported here. Each raises
:class:`~probe.errors.InputError` with a one-line message; the CLI turns the same
errors from option values into usage errors (exit status 2) with
:func:`probe.cli.options.click_callback`.
"""

from __future__ import annotations

from .bounds import LABELS_BY, fraction, limit, max_length, positive_int, texts, thresholds, tolerance, value_weighting

__all__ = ["fraction", "limit", "max_length", "positive_int", "texts", "tolerance", "thresholds",
           "value_weighting", "LABELS_BY"]
