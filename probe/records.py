"""The record of an analysis run: :class:`AnalysisResult` (what ``analyze`` measured, with its timings and
notes) and :func:`versions` (the libraries that shaped the numbers).

It sits below every module that reads a run (the report, the comparison, the image and speech analyses,
the decoder circuits) and below the loop that produces it (:mod:`probe.runs.analysis`), so a reader of a
result never imports the code that runs a model.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from .errors import InputError
from .measures.accumulators import Example
from .measures.stats import HeadStatistics


@dataclass
class AnalysisResult:
    """Everything ``analyze`` measured.

    Attributes:
        model: name, source, type, geometry and parameter count (:func:`probe.runs.analysis.model_summary`).
        heads: one row per (layer, head): ``layer``, ``head``, ``label`` (primary), ``labels``
            (all, ';'-separated), one column per statistic of :data:`probe.measures.stats.STATISTICS`,
            the columns extra accumulators add (:meth:`~probe.measures.accumulators.Accumulator.columns`),
            and ``cluster`` (k-means on the statistics) unless an accumulator gave ``group``.
        stats: the raw running sums and counts (mergeable with another run's).
        thresholds: label -> threshold used.
        counts: sequences, tokens (real, special included), truncated sequences, batches,
            unknown-word tokens, longest sequence.
        examples: a few sequences with their attention maps (cropped to ``settings["example_tokens"]``).
        settings: batch size, max length, example count and crop ...
        timings: seconds (``analyze_s`` in all, of which ``forward_and_statistics_s``).
        notes: what probe changed to capture correctly, and what the user should know.
        results: results of any extra accumulators, by their ``name``; always ``"sink_profile"``
            (:class:`probe.measures.sinks.SinkProfileResult`: attention to the first tokens by query position).
    """

    model: dict
    heads: pd.DataFrame
    stats: HeadStatistics
    thresholds: dict[str, float]
    counts: dict
    examples: list[Example]
    settings: dict
    timings: dict
    notes: list[str] = field(default_factory=list)
    results: dict = field(default_factory=dict)

    def label_counts(self, which: str = "primary") -> dict[str, int]:
        """Label -> number of heads, by count: ``"primary"`` (each head counted once, under its
        primary label; the counts add up to the heads) or ``"all"`` (every head that holds the label,
        primary or not; a head with several labels counts for each).

        Raises:
            InputError: another ``which``.
        """
        if which == "primary":
            return self.heads["label"].value_counts().to_dict()
        if which == "all":
            held = self.heads["labels"].astype(str).str.split(";").explode()
            return held[held != ""].value_counts().to_dict()
        raise InputError(f"which must be 'primary' or 'all', got {which!r}")


def versions() -> dict:
    """Versions of Python and the libraries whose behaviour shapes the numbers."""
    import transformers  # deferred: transformers takes ~1.5 s to import

    return {"probe": __import__("probe").__version__, "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "pandas": pd.__version__, "numpy": np.__version__}
