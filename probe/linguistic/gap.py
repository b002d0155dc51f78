"""Coreference examples: GAP TSV files (Webster et al. 2018) and probe's built-in probe set.

Both give :class:`CorefExample` objects: a text, the character span of one pronoun and of two
candidate names A and B, and which of them the pronoun refers to. :meth:`CorefExample.to_text`
splits the text into words (:func:`split_words`) and stores the word indices of the pronoun and the
names in ``Text.meta["coref"]`` for :class:`probe.linguistic.coref.CorefAccumulator`.

Words of a coreference text: whitespace-separated runs, with a leading and a trailing run of
non-alphanumeric characters split off ('"Cassidy,"' -> '"', 'Cassidy', ',"') and a final English
clitic too ("Lily's" -> "Lily", "'s"; "she'd" -> "she", "'d"), so that a name's words are the name
and a pronoun's word is the pronoun (GAP marks "Lily" in "Lily's"); other inner punctuation stays
("don't", "U.S", "well-known"). Both tokenizer families split at these boundaries (WordPiece at
every punctuation character, byte-level BPE at letter/punctuation changes and before 's 'd 'll
're 've 'm), so the words align with their tokens; where one token still covers two words, they
become one unit (:mod:`probe.linguistic.words`).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pandas as pd

from ..errors import InputError
from ..text.corpus import iter_lines
from ..text.inputs import Text

#: Columns a GAP file must have (Webster et al. 2018; ``URL`` is optional).
GAP_COLUMNS = ("ID", "Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset", "B-coref")

#: The built-in probe set, in the package (markup: ``[A name]``, ``[B name]``, ``[P pronoun]``).
BUILTIN = "linguistic/data/coref_builtin.tsv"


@dataclass
class CorefExample:
    """One coreference example.

    Attributes:
        id: the example's id.
        text: the text.
        pronoun, a, b: character ``(start, end)`` spans of the pronoun and of candidates A and B.
        a_coref, b_coref: whether A (B) is the pronoun's antecedent.
    """

    id: str
    text: str
    pronoun: tuple[int, int]
    a: tuple[int, int]
    b: tuple[int, int]
    a_coref: bool
    b_coref: bool

    def to_text(self) -> Text:
        """A :class:`~probe.text.inputs.Text` with its words (:func:`split_words`) and
        ``meta["coref"]``: word indices of ``pronoun``, ``a`` and ``b`` (every word the span
        overlaps), ``a_coref``, ``b_coref`` and ``id``."""
        spans = split_words(self.text)
        return Text(self.text, words=spans, meta={"coref": {
            "id": self.id, "pronoun": overlapping(spans, self.pronoun), "a": overlapping(spans, self.a),
            "b": overlapping(spans, self.b), "a_coref": self.a_coref, "b_coref": self.b_coref}})

    def mention(self, which: str) -> str:
        """The characters of ``"pronoun"``, ``"a"`` or ``"b"``."""
        s, e = getattr(self, which)
        return self.text[s:e]


_RUN = re.compile(r"\S+")
#: An English clitic at the end of a word: possessive 's and 's 'd 'll 're 've 'm ("Lily's", "she'd").
_CLITIC = re.compile(r"['\u2019](?:s|d|ll|re|ve|m)$", re.IGNORECASE)


def split_words(text: str) -> list[tuple[int, int]]:
    """Character spans of the words of a coreference text (see the module docstring)."""
    spans = []
    for m in _RUN.finditer(text):
        s, e = m.span()
        core_s = s
        while core_s < e and not text[core_s].isalnum():
            core_s += 1
        if core_s == e:  # punctuation only: one word
            spans.append((s, e))
            continue
        core_e = e
        while not text[core_e - 1].isalnum():
            core_e -= 1
        clitic = _CLITIC.search(text, core_s, core_e)
        cut = clitic.start() if clitic and clitic.start() > core_s else core_e
        spans.extend(p for p in ((s, core_s), (core_s, cut), (cut, core_e), (core_e, e)) if p[1] > p[0])
    return spans


def overlapping(spans: list[tuple[int, int]], span: tuple[int, int]) -> list[int]:
    """Indices of the words that share a character with ``span``."""
    s, e = span
    return [i for i, (ws, we) in enumerate(spans) if ws < e and s < we]


def _bool(value: str, column: str, row: int, source: str) -> bool:
    v = value.strip().lower()
    if v not in ("true", "false"):
        raise InputError(f"{source}: row {row}: {column} must be TRUE or FALSE, got {value!r}")
    return v == "true"


def _offset(value: str, column: str, row: int, source: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise InputError(f"{source}: row {row}: {column} must be a character offset, got {value!r}") from None
    if n < 0:
        raise InputError(f"{source}: row {row}: {column} must be >= 0, got {n}")
    return n


@dataclass
class CorefSet:
    """Examples read from one source, and the rows that could not be used.

    Attributes:
        examples: usable examples, in file order.
        total: rows read (within the limit).
        mismatched: ids of rows whose names or pronoun are not found at their offsets (left out).
        source: where they came from ("built-in probe set" or the file name).
    """

    examples: list[CorefExample]
    total: int
    mismatched: list[str]
    source: str

    def texts(self) -> list[Text]:
        """The examples as :class:`~probe.text.inputs.Text` (words and mentions in meta)."""
        return [ex.to_text() for ex in self.examples]


def parse_gap(data: str, limit: int | None = None, source: str = "GAP input") -> CorefSet:
    """Parse GAP TSV text (header ``ID Text Pronoun Pronoun-offset A A-offset A-coref B B-offset
    B-coref [URL]``; offsets are character offsets into Text).

    Raises:
        InputError: not tab-separated, missing columns (named), no rows, or a bad offset/boolean.
    """
    try:
        frame = pd.read_csv(io.StringIO(data), sep="\t", quoting=csv.QUOTE_NONE, dtype=str,
                            keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"{source} is not a GAP TSV file: {str(exc).splitlines()[0]}") from None
    missing = [c for c in GAP_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"{source} is not a GAP TSV file: missing column(s) {', '.join(missing)} "
                         f"(expected {' '.join(GAP_COLUMNS)})")
    if frame.empty:
        raise InputError(f"{source} has no examples")
    if limit:
        frame = frame.head(limit)
    examples, mismatched = [], []
    for i, row in enumerate(frame.to_dict("records"), start=1):
        text = row["Text"]
        spans = {}
        for name, col in (("pronoun", "Pronoun"), ("a", "A"), ("b", "B")):
            start = _offset(row[f"{col}-offset"], f"{col}-offset", i, source)
            spans[name] = (start, start + len(row[col]))
        a_coref, b_coref = _bool(row["A-coref"], "A-coref", i, source), _bool(row["B-coref"], "B-coref", i, source)
        if any(text[s:e] != row[col] or s == e for (s, e), col in zip(spans.values(), ("Pronoun", "A", "B"))):
            mismatched.append(row["ID"])
            continue
        examples.append(CorefExample(row["ID"], text, spans["pronoun"], spans["a"], spans["b"], a_coref, b_coref))
    return CorefSet(examples, len(frame), mismatched, source)


def _header_and_rows(lines: Iterable[str], limit: int | None) -> Iterator[str]:
    """The header line and at most ``limit`` non-blank rows after it (all without a limit)."""
    rows = -1
    for line in lines:
        yield line
        if line.strip():
            rows += 1
            if limit and rows >= limit:
                return


def read_gap(path: str | Path, limit: int | None = None) -> CorefSet:
    """Read a GAP TSV file (UTF-8); with a ``limit``, reading stops after that many rows
    (:func:`probe.text.corpus.iter_lines`).

    Raises:
        InputError: missing, unreadable or non-UTF-8 file, or as :func:`parse_gap`.
    """
    data = "".join(line + "\n" for line in _header_and_rows(iter_lines(path, "GAP file"), limit))
    return parse_gap(data, limit, source=str(path))


_MARK = re.compile(r"\[([ABP]) ([^\[\]]+)\]")


def parse_marked(line: str, answer: str, id: str) -> CorefExample:
    """One example from probe's markup: ``[A Anna] thanked [B Clara] because [P she] ...`` with
    ``answer`` ``"A"`` or ``"B"`` (the antecedent).

    Raises:
        ValueError: not exactly one A, B and P mark, or an answer other than A/B.
    """
    text, spans, pos = [], {}, 0
    length = 0
    for m in _MARK.finditer(line):
        before = line[pos:m.start()]
        text.append(before)
        length += len(before)
        if m.group(1) in spans:
            raise ValueError(f"{id}: two [{m.group(1)} ...] marks")
        spans[m.group(1)] = (length, length + len(m.group(2)))
        text.append(m.group(2))
        length += len(m.group(2))
        pos = m.end()
    text.append(line[pos:])
    if sorted(spans) != ["A", "B", "P"] or answer not in ("A", "B"):
        raise ValueError(f"{id}: needs one [A ...], [B ...] and [P ...] mark and answer A or B")
    return CorefExample(id, "".join(text), spans["P"], spans["A"], spans["B"], answer == "A", answer == "B")


def builtin_examples(limit: int | None = None) -> CorefSet:
    """probe's built-in coreference probe set (CC0-1.0, written for probe; see its README)."""
    raw = resources.files("probe").joinpath(BUILTIN).read_text(encoding="utf-8")
    rows = [ln.split("\t") for ln in raw.splitlines() if ln.strip() and not ln.startswith("#")]
    header, rows = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    examples = [parse_marked(r[col["text"]], r[col["antecedent"]], r[col["id"]]) for r in rows]
    examples = examples[:limit] if limit else examples
    return CorefSet(examples, len(examples), [], "built-in probe set")


def read_coref(source: str | Path | CorefSet | None = "builtin", limit: int | None = None) -> CorefSet:
    """Coreference examples from ``"builtin"`` (or None), a GAP TSV file, or a :class:`CorefSet`
    (returned as it is, cut to ``limit``).

    Raises:
        InputError: as :func:`read_gap`.
    """
    if isinstance(source, CorefSet):
        kept = source.examples[:limit] if limit else source.examples
        return CorefSet(list(kept), len(kept), list(source.mismatched), source.source)
    if source is None or str(source) == "builtin":
        return builtin_examples(limit)
    return read_gap(source, limit)
