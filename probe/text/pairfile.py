"""Prompt pairs as the user gives them (the pair file and the built-in indirect-object set) for
activation patching, path patching and circuits; their tokens are :mod:`probe.effects.pairs`'. No
heavy library: the command line reads a pairs file before torch is imported, so a malformed or
non-UTF-8 file is answered at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import InputError


@dataclass(frozen=True)
class Pair:
    """One prompt pair: ``clean`` and ``corrupted`` text, the ``answer`` and ``wrong`` continuations
    (one token each, leading space included: ``" Mary"``); encoder-decoder models: the texts are
    sources and ``prefix`` is the target the decoder has read before the answer."""

    clean: str
    corrupted: str
    answer: str
    wrong: str
    prefix: str = ""


def builtin_pairs() -> list[Pair]:
    """The built-in indirect-object-identification set (20 pairs, written for probe in the spirit of
    Wang et al. 2022): "When Mary and John went to the store, John gave a drink to" -> " Mary" vs
    " John"; the corrupted prompt repeats the other name, which flips the answer."""
    text = resources.files("probe").joinpath("data/ioi_pairs.tsv").read_text(encoding="utf-8")
    return parse_pairs(text, "the built-in set")


def read_pairs(path: str | Path) -> list[Pair]:
    """Read a pair file: tab-separated ``clean, corrupted, answer, wrong`` per line, and for
    encoder-decoder models an optional fifth field, the target prefix (an optional header line
    starting with ``clean``; blank lines skipped; spaces inside fields are kept).

    Raises:
        InputError: unreadable file, a line without four or five fields, or no pair.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read pairs file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:  # named as the corpus reader names it
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}: line {line} is not valid UTF-8 (byte {raw[exc.start]:#04x} at offset "
                         f"{exc.start})") from None
    return parse_pairs(text, str(path))


def parse_pairs(text: str, source: str) -> list[Pair]:
    """:func:`read_pairs` on the file's text (``source`` names it in errors)."""
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or (n == 1 and line.split("\t")[0].strip().lower() == "clean"):
            continue
        fields = line.split("\t")
        if len(fields) not in (4, 5):
            raise InputError(f"{source}, line {n}: {len(fields)} tab-separated fields; a pair line is "
                             "clean<TAB>corrupted<TAB>answer<TAB>wrong (encoder-decoder models: <TAB>target prefix)")
        pairs.append(Pair(*fields))
    if not pairs:
        raise InputError(f"{source}: no pair (clean<TAB>corrupted<TAB>answer<TAB>wrong per line)")
    return pairs


#: Where the built-in pairs come from, as a run says it.
BUILTIN_SOURCE = "built-in IOI set"


def pair_input(pairs_file: str | Path | None) -> tuple[list[Pair], str]:
    """The pairs of ``pairs_file`` (else the built-in indirect-object pairs) and where they came from; no
    heavy library, so a command reads them first and a malformed or non-UTF-8 file is answered at once.

    Raises:
        InputError: an unreadable file, a line without four or five fields, no pair.
    """
    return (read_pairs(pairs_file), str(pairs_file)) if pairs_file else (builtin_pairs(), BUILTIN_SOURCE)
