"""``probe why`` as a function: one head's scores at one query row split by source (:func:`probe.why`),
the heads labelled by a short analysis, written as a run folder (report section, why.csv, run.json)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..errors import InputError
from ..patterns import CircuitProbe, circuit_probe
from ..report import claim_run_dir, write_run
from ..runs.analysis import analyze
from ..sites import head_name
from ..text.corpus import sample_texts
from .score import Why, why
from .table import pairs_frame, source_shares

#: Source pairs listed per key in why.csv (the rest in one row).
PAIRS = 10
#: why.csv's columns, in order.
COLUMNS = ("head", "query", "key", "key_token", "attention", "score", "query_source", "key_source", "contribution",
           "share", "abs_share", "dA_first", "dA_exact", "dA_without_query_source", "dA_without_key_source")


@dataclass
class WhyRun:
    """What ``probe why`` measured: ``why`` (the :class:`~probe.qk.Why`), ``frame`` (why.csv),
    ``shares`` (per source, query and key side, at the top key), ``labels`` (head name -> its label in
    the short analysis), ``top`` (keys listed), ``seconds``, ``notes``."""

    why: Why
    frame: pd.DataFrame
    shares: pd.DataFrame
    top: int
    labels: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def record(self) -> dict:
        """The run.json entry."""
        w = self.why
        top = w.top_keys(self.top)
        return {"head": w.name, "query": w.query, "query_token": w.tokens[w.query], "tokens": len(w.tokens),
                "sources": len(w.sources), "frozen_norms": w.frozen, "softcap": w.softcap,
                "position_bias": w.position_bias is not None, "residual": w.residual, "tolerance": w.tolerance,
                "holds": w.holds, "top_keys": [{"key": j, "token": w.tokens[j], "attention": float(w.pattern[j]),
                                               "score": float(w.scores[j])} for j in top],
                "pairs_per_key": PAIRS, "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "notes": self.notes}


def check_top(top: int) -> None:
    """Raises InputError unless ``top`` >= 1."""
    if not (isinstance(top, int) and top >= 1):
        raise InputError(f"--top must be at least 1, got {top!r}")


def measure(lm, text: str, head, query: int | None = None, top: int = 5) -> WhyRun:
    """:func:`probe.why` and its tables (``top`` keys, :data:`PAIRS` pairs each).

    Raises:
        InputError: as :func:`probe.why`, or ``top`` below 1.
    """
    check_top(top)
    w = why(lm, text, head, query)
    frame = pairs_frame(w, keys=top, pairs=PAIRS)[list(COLUMNS)]
    shares = source_shares(w, w.top_keys(1)[0])
    notes = list(w.notes)
    if not w.holds:
        notes.append(f"the decomposition misses the model's score by {w.residual:.3g} (more than {w.tolerance:.2g})")
    return WhyRun(w, frame, shares, top, seconds={"why_s": w.seconds}, notes=notes)


def why_run(lm, text: str, head, query: int | None = None, *, top: int = 5, out=None, force: bool = False,
            progress: bool = False, timings: dict | None = None, started: float | None = None) -> tuple[WhyRun, Path]:
    """Measure (:func:`measure`), label the heads with a short analysis (the text and the built-in
    sample), write the run folder.

    Returns:
        ``(WhyRun, run folder)``.

    Raises:
        InputError: ``out`` taken (claimed before the work starts); as :func:`measure`.
    """
    with claim_run_dir(out, lm.name, force) as folder:
        result = measure(lm, text, head, query, top)
        t = time.perf_counter()
        analysis = analyze(lm, [text] + sample_texts(), progress=progress,  # labels, induction included on decoders
                           finished=[circuit_probe(lm)] if CircuitProbe.refusal(lm) is None else [])
        result.seconds["analyze_s"] = time.perf_counter() - t
        heads = analysis.heads
        if "layer" in heads.columns and "label" in heads.columns:
            result.labels = {head_name(int(r.layer), int(r.head)): str(r.label) for r in heads.itertuples()}
        analysis.results["why"] = result
        analysis.notes += result.notes
        analysis.timings.update({k: round(v, 4) for k, v in result.seconds.items()})
        path = write_run(analysis, lm.tokenizer, folder.path, force=force, timings=timings, started=started)
    return result, path
