"""``probe why`` as a function: one head's scores at one query row split by source (:func:`probe.why`),
the heads labelled by probe's analysis of its built-in sample texts (cached per model, :mod:`probe.qk.labels`),
and the analysis a run folder is written from (report section, why.csv, run.json:
:func:`probe.entries.why.run_why` and its ``save``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import InputError
from ..patterns import CircuitProbe, circuit_probe
from ..records import AnalysisResult
from ..runs.analysis import analyze
from ..sites import head_name
from ..text.corpus import sample_texts
from .corpus import RULES, CorpusWhy, why_corpus
from .labels import label_map, labelling
from .score import Why, check_model, why
from .table import pairs_frame, source_shares

#: Source pairs listed per key in why.csv (the rest in one row).
PAIRS = 10
#: The run's note on where the labels beside the sources come from.
LABELS_NOTE = ("the heads are labelled by probe's analysis of its built-in sample texts (decoders: with the circuit "
               "probe), not by the text: a label describes a head over a corpus, not on one sentence; computed "
               "once per model and cached (probe.qk.labels)")
#: why.csv's columns, in order.
COLUMNS = ("head", "query", "key", "key_token", "attention", "score", "query_source", "key_source", "contribution",
           "share", "abs_share", "dA_first", "dA_exact", "dA_without_query_source", "dA_without_key_source")


@dataclass
class WhyRun:
    """What ``probe why`` measured: ``why`` (the :class:`~probe.qk.Why`), ``frame`` (why.csv),
    ``shares`` (per source, query and key side, at the top key), ``labels`` (head name -> its label in
    the labelling analysis, :func:`probe.qk.labels.labelling`), ``top`` (keys listed), ``seconds``, ``notes``."""

    why: Why | None
    frame: pd.DataFrame
    shares: pd.DataFrame
    top: int
    labels: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    corpus: CorpusWhy | None = None

    def record(self) -> dict:
        """The run.json entry."""
        if self.corpus is not None:
            c = self.corpus
            return {"head": c.name, "corpus": True, "label": c.label, "texts": c.texts, "rows": c.rows,
                    "rows_seen": c.rows_seen, "mean_score": c.mean_score, "residual": c.residual,
                    "tolerance": c.tolerance, "holds": c.residual <= c.tolerance, "sources": len(c.sources),
                    "sentence": c.sentence(self.labels), "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                    "notes": self.notes}
        w = self.why
        top = w.top_keys(self.top)
        return {"head": w.name, "query": w.query, "query_token": w.query_token, "tokens": len(w.tokens),
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


def measure(lm, text: str, head, query: int | None = None, top: int = 5, target: str | None = None) -> WhyRun:
    """:func:`probe.why` and its tables (``top`` keys, :data:`PAIRS` pairs each; ``target``: an
    encoder-decoder model's decoder text).

    Raises:
        InputError: as :func:`probe.why`, or ``top`` below 1.
    """
    check_top(top)
    w = why(lm, text, head, query, target=target)
    frame = pairs_frame(w, keys=top, pairs=PAIRS)[list(COLUMNS)]
    shares = source_shares(w, w.top_keys(1)[0])
    notes = list(w.notes)
    if not w.holds:
        notes.append(f"the decomposition misses the model's score by {w.residual:.3g} (more than {w.tolerance:.2g})")
    return WhyRun(w, frame, shares, top, seconds={"why_s": w.seconds}, notes=notes)


def corpus_frame(c: CorpusWhy, pairs: int = 2 * PAIRS) -> pd.DataFrame:
    """The ``pairs`` largest mean pairs, then the rest: ``head``, ``label``, ``rows``, ``query_source``,
    ``key_source``, ``contribution`` (mean C over the rows), ``share`` (of the mean score)."""
    M = c.mean
    order = np.argsort(-np.abs(np.nan_to_num(M)), axis=None, kind="stable")[:pairs]
    rows = []
    for k in order:
        a, b = np.unravel_index(k, M.shape)
        rows.append((c.sources[a], c.sources[b], float(M[a, b])))
    rows.append(("(other pairs)", "(other pairs)", float(np.nansum(M)) - sum(r[2] for r in rows)))
    frame = pd.DataFrame(rows, columns=["query_source", "key_source", "contribution"])
    frame.insert(0, "rows", c.rows)
    frame.insert(0, "label", c.label)
    frame.insert(0, "head", c.name)
    frame["share"] = frame["contribution"] / c.mean_score if c.rows else np.nan
    return frame


def why_analysis(lm, text: str | None, head, query: int | None = None, *, top: int = 5, progress: bool = False,
                 corpus: list[str] | None = None, label: str | None = None,
                 target: str | None = None) -> tuple[WhyRun, AnalysisResult]:
    """Measure (:func:`measure`) and label the heads (:func:`probe.qk.labels.labelling`: probe's analysis
    of its built-in sample texts, plus the circuit probe on decoders, computed once per model and cached):
    ``(WhyRun, the analysis the run folder is written from)``, no folder written. The labels do not depend
    on ``text``: a head's label describes its behaviour over a corpus, not on one sentence.

    On an encoder-decoder model ``text`` is the source and ``target`` the decoder's text (default: the
    source); the labelling analysis reads each sample text as its own target.

    With ``corpus`` (texts), the contributions are averaged over the rows whose top key fits ``label``
    (default: the head's label in a short analysis of the corpus and the sample;
    :func:`probe.qk.corpus.why_corpus`) instead.

    The analysis' timings: ``analyze_s`` and ``forward_and_statistics_s`` are this call's (a cached
    labelling: the time to read it, no forward pass); ``labels_s`` the same in the why record's seconds.

    Raises:
        InputError: as :func:`measure`; with a corpus, a label (given or found) that names no key.
    """
    if corpus is not None:
        return _corpus_run(lm, corpus, head, label, progress=progress)
    result = measure(lm, text, head, query, top, target)
    t = time.perf_counter()
    analysis, source = labelling(lm, progress=progress)
    result.seconds["labels_s"] = time.perf_counter() - t
    if source != "computed":
        analysis.timings.update(analyze_s=round(result.seconds["labels_s"], 4), forward_and_statistics_s=0.0)
    result.labels = label_map(analysis)
    analysis.results["why"] = result
    analysis.notes += result.notes + [LABELS_NOTE]
    analysis.timings.update({k: round(v, 4) for k, v in result.seconds.items()})
    return result, analysis


def _corpus_run(lm, texts: list[str], head, label: str | None, *, progress: bool) -> tuple[WhyRun, AnalysisResult]:
    layer, h = check_model(lm, head)
    if label is not None and label not in RULES:
        raise InputError(f"--label {label!r} names no key; labels with one: {', '.join(RULES)}")
    t = time.perf_counter()
    analysis = analyze(lm, list(texts) + sample_texts(), progress=progress,
                       finished=[circuit_probe(lm)] if CircuitProbe.refusal(lm) is None else [])
    labels, seconds = label_map(analysis), {"analyze_s": time.perf_counter() - t}
    name = head_name(layer, h)
    label = label or labels.get(name)
    if label not in RULES:
        raise InputError(f"{name} is labelled {label!r}, which names no key to average over; give --label (one "
                         f"of {', '.join(RULES)})")
    c = why_corpus(lm, texts, (layer, h), label)
    seconds["why_corpus_s"] = c.seconds
    notes = list(c.notes)
    if c.rows and c.residual > c.tolerance:
        notes.append(f"the decomposition misses the model's score by {c.residual:.3g} (more than "
                     f"{c.tolerance:.2g})")
    result = WhyRun(None, corpus_frame(c), c.shares(), 0, labels, seconds, notes, c)
    analysis.results["why"] = result
    analysis.notes += notes
    analysis.timings.update({k: round(v, 4) for k, v in seconds.items()})
    return result, analysis
