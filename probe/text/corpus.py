"""Reading text input: plain text (one sequence a line) or CoNLL-U (``# text =`` lines).

The product never needs the shared annotated data at run time: without input, the small English
sample shipped in ``probe/data/sample.txt`` (written for the package) is used.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from .. import bounds as validate  # no heavy library: --corpus is read before torch is imported
from ..errors import InputError
from .sequence import Text

#: A CoNLL-U sentence-text comment: ``# text = ...``.
_TEXT_LINE = re.compile(r"#\s*text\s*=(.*)")


#: Line ends of a text corpus: only these end a sequence (not U+2028, U+2029, U+0085, form feed or
#: vertical tab, which str.splitlines() also splits on: they would cut sentences).
_LINE_END = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list[str]:
    """Split on \\n, \\r\\n and \\r only; other Unicode line separators stay inside a line."""
    lines = _LINE_END.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def sample_texts() -> list[str]:
    """The built-in English sample (20 sentences written for probe)."""
    text = resources.files("probe").joinpath("data/sample.txt").read_text(encoding="utf-8")
    return [line.strip() for line in split_lines(text) if line.strip()]


def _is_conllu(path: Path, lines: list[str]) -> bool:
    if path.suffix.lower() in (".conllu", ".conll"):
        return True
    head = [ln for ln in lines[:50] if ln.strip()]
    return bool(head) and any(ln.startswith("# text =") or ln.startswith("# sent_id") for ln in head)


def _open_checked(path: str | Path, what: str = "corpus file") -> Path:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what} not found: {path}")
    if p.is_dir():
        raise InputError(f"{what} is a folder, not a file: {path}")
    return p


def _lines(p: Path, what: str = "corpus file") -> Iterator[str]:
    """The file's lines, decoded one at a time (only \\n, \\r\\n and \\r end a line; a byte-order
    mark dropped); a line that is not UTF-8 is named exactly."""
    try:
        fh = p.open("rb")
    except OSError as exc:
        raise InputError(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    offset = 0
    with fh:
        for number, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{p}: line {number} is not valid UTF-8 "
                                 f"(byte {raw[exc.start]:#04x} at offset {offset + exc.start})") from None
            offset += len(raw)
            if number == 1 and text.startswith("\ufeff"):
                text = text[1:]
            yield from split_lines(text) if "\r" in text else [text.rstrip("\n")]


def iter_lines(path: str | Path, what: str = "file") -> Iterator[str]:
    """The lines of a UTF-8 file, read lazily (line ends removed; only \\n, \\r\\n and \\r end a
    line; a leading byte-order mark removed). The readers of annotated files use it.

    Args:
        path: the file.
        what: how error messages name it (``"corpus file"``, ``"CoNLL-U file"`` ...).

    Raises:
        InputError: missing file or a folder (at once); while iterating, an unreadable file or
            non-UTF-8 bytes (line and byte named).
    """
    return _lines(_open_checked(path, what), what)


def read_text_file(path: str | Path, what: str = "file") -> str:
    """The whole text of a UTF-8 file, its lines ended by \\n (:func:`iter_lines`, which see)."""
    return "".join(line + "\n" for line in iter_lines(path, what))


def iter_corpus(path: str | Path, limit: int | None = None) -> Iterator[str]:
    """Read sequences from a file lazily, one at a time (memory does not grow with the file).

    Plain text: one sequence a line (lines end only at \\n, \\r\\n or \\r), blank lines skipped.
    CoNLL-U (``.conllu`` or files with ``# text =`` / ``# sent_id`` comments in their first 50
    non-blank lines): one sequence per sentence, from its ``# text =`` line.

    Args:
        path: the file.
        limit: yield at most this many sequences (must be >= 1).

    Raises:
        InputError: missing or unreadable file, a limit below 1; while iterating, non-UTF-8 bytes
            (file and line named); a file with no sequence (when the end is reached without one).
    """
    validate.limit(limit)
    p = _open_checked(path)
    lines = _lines(p)
    head = list(itertools.islice(lines, 200))
    conllu = _is_conllu(p, head)
    count = 0
    for line in itertools.chain(head, lines):
        if conllu:
            m = _TEXT_LINE.match(line)  # "# text = ..." only, not "# text_en = ..." (translations)
            text = m.group(1).strip() if m else ""
        else:
            text = line.strip()
        if not text:
            continue
        yield text
        count += 1
        if limit and count >= limit:
            return
    if count == 0 and conllu:
        raise InputError(f"no '# text =' line found in CoNLL-U file {path}: probe reads each sentence's text from "
                         "its '# text = ...' comment")
    if count == 0:
        raise InputError(f"corpus file has no text: {path}")


def read_corpus(path: str | Path, limit: int | None = None) -> list[str]:
    """All sequences of a file as a list (:func:`iter_corpus`, which see)."""
    return list(iter_corpus(path, limit))


def peek(texts: Iterator[str]) -> Iterator[str]:
    """The same sequence of texts, after reading its first one (so a file with no text, or an
    unreadable one, fails before anything slow starts)."""
    first = next(texts)
    return itertools.chain([first], texts)


def iter_pairs(path: str | Path, limit: int | None = None) -> Iterator:
    """Read sentence pairs lazily, one at a time: one pair a line, the two segments separated by one tab.

    Lines end only at \\n, \\r\\n or \\r; blank lines are skipped. Each pair becomes one
    :class:`probe.text.inputs.Text` with ``pair`` set (encoded as the tokenizer joins pairs: BERT's
    [CLS] A [SEP] B [SEP] with segment ids 0 and 1). For an encoder-decoder model the second segment
    is the target: :func:`probe.loading.seq2seq.as_targets` moves it there.

    Args:
        path: the TSV file.
        limit: yield at most this many pairs (>= 1).

    Raises:
        InputError: missing file or a limit below 1 (at once); while iterating, an unreadable file,
            non-UTF-8 bytes, a line without exactly one tab or with an empty segment (line numbered
            from 1), or no pair (when the end is reached without one).
    """
    validate.limit(limit)
    p = _open_checked(path, "pairs file")

    def pairs() -> Iterator[Text]:
        count = 0
        for number, line in enumerate(_lines(p, "pairs file"), 1):
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
                raise InputError(f"{path}: line {number} is not two non-empty segments separated by one tab")
            yield Text(parts[0].strip(), pair=parts[1].strip())
            count += 1
            if limit and count >= limit:
                return
        if count == 0:
            raise InputError(f"pairs file has no pair: {path}")

    return pairs()


def read_pairs(path: str | Path, limit: int | None = None) -> list:
    """All sentence pairs of a file as a list of :class:`probe.text.inputs.Text` (:func:`iter_pairs`, which see)."""
    return list(iter_pairs(path, limit))


def check_texts(texts: list[str], limit: int | None = None) -> list[str]:
    """Validate texts given directly (``--text``): non-empty; applies ``limit``.

    Raises:
        InputError: no text, an empty or whitespace-only text, or a limit below 1.
    """
    validate.limit(limit)
    texts = validate.texts(texts)
    return list(texts[:limit] if limit else texts)


def count_sequences(corpus: str | None, pairs: str | None, limit: int | None) -> int | None:
    """The number of sequences a corpus or pairs file holds (at most ``limit``), counted in a first read
    of the file (the analysis streams it again: memory stays flat); None for the other inputs. The
    command line reads it before torch is imported, so a file that is not UTF-8, has no text or a
    malformed pair is answered at once.

    Raises:
        InputError: what :func:`iter_corpus` or :func:`iter_pairs` raises.
    """
    if not (corpus or pairs):
        return None
    return sum(1 for _ in (iter_corpus(corpus, limit) if corpus else iter_pairs(pairs, limit)))


def corpus_input(corpus: str | None = None, pairs: str | None = None, limit: int | None = None, *,
                 texts=(), sample: str = "sample") -> tuple[list, str]:
    """The sequences of a run on a corpus (``probe effects``, ``probe prune``, ``probe compare --model``) and
    where they come from: a corpus file's, a pairs file's (:class:`~probe.text.inputs.Text` with a second
    segment), the ``texts`` given (``--text``) or the built-in sample's (named ``sample``), at most ``limit``.
    No heavy library: a command reads them before torch is imported.

    Raises:
        InputError: an unreadable or empty file, a limit below 1.
    """
    if corpus:
        return read_corpus(corpus, limit), corpus
    if pairs:
        return read_pairs(pairs, limit), pairs
    if texts:
        return check_texts(list(texts), limit), "--text"
    return check_texts(sample_texts(), limit), sample
