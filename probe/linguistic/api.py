"""Coreference and syntax analyses from Python, without files; and the annotated input of
``probe analyze --coref/--syntax``.

    from probe import load_model
    from probe.linguistic import coref_heads, syntax_heads

    lm = load_model("minilm")
    coref = coref_heads(lm)                      # built-in probe set; or a GAP .tsv path
    coref.table                                  # DataFrame: the rows of coref.csv
    tree = syntax_heads(lm, "en_ewt-ud-dev.conllu")
    tree.best                                    # Clark et al.'s Table 1 shape; tree.table = syntax.csv

Both run only their own accumulator in probe's one analysis loop (:func:`probe.runs.analysis.run`);
``probe analyze`` runs them next to the per-head statistics (:func:`annotated_input`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..runs.analysis import run
from ..text.inputs import Text, iter_batches
from ..util import plural, progress_bar
from .conllu import Treebank, read_conllu
from .coref import CorefAccumulator, CorefResult
from .gap import CorefSet, read_coref
from .syntax import MIN_COUNT, SyntaxAccumulator, SyntaxResult

#: How the reader's own left-out rows are named in the counts.
COREF_MISMATCH = "offsets do not match the names"
SYNTAX_MISMATCH = "text mismatch"


def coref_accumulator(lm, examples: CorefSet, prior: bool = True, **kw) -> CorefAccumulator:
    """A :class:`CorefAccumulator` for ``lm`` that also counts the rows ``examples`` left out
    (unless ``prior`` is False: the other processes of a data-parallel run, whose accumulators are
    added to the one that counts them)."""
    left_out = {COREF_MISMATCH: len(examples.mismatched)} if examples.mismatched and prior else None
    return CorefAccumulator(lm.sites, lm.geometry.n_heads, unaligned=left_out, **kw)


def syntax_accumulator(lm, bank: Treebank, prior: bool = True, **kw) -> SyntaxAccumulator:
    """A :class:`SyntaxAccumulator` for ``lm`` that also counts the sentences ``bank`` left out
    (unless ``prior`` is False, as :func:`coref_accumulator`)."""
    left_out = {SYNTAX_MISMATCH: len(bank.mismatched)} if bank.mismatched and prior else None
    return SyntaxAccumulator(lm.sites, lm.geometry.n_heads, unaligned=left_out, **kw)


def _run(lm, texts: list[Text], acc, batch_size: int, max_length: int | None, progress: bool):
    bar = None
    if progress:
        bar = progress_bar(total=len(texts), unit="seq", desc=acc.name, leave=False)
    try:
        if texts:
            run(lm, iter_batches(lm, texts, batch_size=batch_size, max_length=max_length), [acc], progress=bar)
    finally:
        if bar is not None:
            bar.close()
    return acc.result()


def coref_heads(lm, source: str | Path | CorefSet | None = "builtin", *, limit: int | None = None, batch_size: int = 16,
                max_length: int | None = None, preceding_only: bool | None = None,
                progress: bool = False) -> CorefResult:
    """Score every head of ``lm`` on coreference examples (see :mod:`probe.linguistic.coref`).

    Args:
        lm: a loaded model.
        source: ``"builtin"`` (or None) for the built-in probe set, a GAP TSV file, or a
            :class:`~probe.linguistic.gap.CorefSet` of your own examples.
        limit: use the first ``limit`` examples.
        batch_size, max_length: as :func:`probe.runs.analysis.analyze`.
        preceding_only: leave out examples with a candidate after the pronoun (default: for causal
            models).

    Returns:
        A :class:`CorefResult` (``.table`` is coref.csv as a DataFrame).

    Raises:
        InputError: an unreadable or malformed file.
    """
    examples = read_coref(source, limit)
    acc = coref_accumulator(lm, examples, preceding_only=preceding_only)
    return _run(lm, examples.texts(), acc, batch_size, max_length, progress)


def syntax_heads(lm, source: str | Path, *, limit: int | None = None, batch_size: int = 16,
           max_length: int | None = None, min_count: int = MIN_COUNT, progress: bool = False) -> SyntaxResult:
    """Score every head of ``lm`` on the dependency trees of a CoNLL-U file (see
    :mod:`probe.linguistic.syntax`).

    Args:
        lm: a loaded model.
        source: a CoNLL-U file.
        limit: use the first ``limit`` sentences.
        min_count: dependencies a relation needs to be reported.

    Returns:
        A :class:`SyntaxResult` (``.table`` is syntax.csv as a DataFrame, ``.best`` Table 1).

    Raises:
        InputError: an unreadable or malformed file.
    """
    bank = read_conllu(source, limit)
    acc = syntax_accumulator(lm, bank, min_count=min_count)
    return _run(lm, bank.texts(), acc, batch_size, max_length, progress)


@dataclass
class AnnotatedInput:
    """The texts of ``probe analyze --coref/--syntax`` and how to make their accumulators.

    Attributes:
        texts: the coreference texts, then the CoNLL-U sentences (each carries its annotation in
            ``meta``; the other analysis ignores it).
        source: a description for the run's record ("GAP file x.tsv (2000 examples) + ...").
        coref: the coreference examples, or None.
        treebank: the CoNLL-U sentences, or None.
    """

    texts: list[Text]
    source: str
    coref: CorefSet | None = None
    treebank: Treebank | None = None

    def accumulators(self, lm, prior: bool = True) -> list:
        """The analyses to run next to the per-head statistics (``prior``: count the rows the
        readers left out; only one process of a data-parallel run does)."""
        out = []
        if self.coref is not None:
            out.append(coref_accumulator(lm, self.coref, prior))
        if self.treebank is not None:
            out.append(syntax_accumulator(lm, self.treebank, prior))
        return out


def annotated_input(coref: str | None = None, syntax: str | None = None, limit: int | None = None) -> AnnotatedInput:
    """Read the annotated text for ``probe analyze``: ``coref`` (``"builtin"`` or a GAP file) and/or
    ``syntax`` (a CoNLL-U file); ``limit`` applies to each.

    Raises:
        InputError: a missing, unreadable or malformed file, or a file with nothing usable.
    """
    texts, parts = [], []
    examples = bank = None
    if coref is not None:
        examples = read_coref(coref, limit)
        if not examples.examples:
            raise InputError(f"{examples.source}: no example whose names and pronoun match their offsets")
        texts += examples.texts()
        parts.append(f"coreference: {examples.source}, {plural(len(examples.examples), 'example')}")
    if syntax is not None:
        bank = read_conllu(syntax, limit)
        if not bank.sentences:
            raise InputError(f"{syntax}: no sentence whose words could be found in its '# text' line")
        texts += bank.texts()
        parts.append(f"syntax: {syntax}, {len(bank.sentences)} sentences")
    return AnnotatedInput(texts, "; ".join(parts), examples, bank)
