"""Reading text input: plain text (one sequence a line) or CoNLL-U (``# text =`` lines).

The product never needs the shared annotated data at run time: without input, the small English
sample shipped in ``probe/data/sample.txt`` (written for the package) is used.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from . import validate
from .errors import InputError

#: A CoNLL-U sentence-text comment: ``# text = ...``.
_TEXT_LINE = re.compile(r"#\s*text\s*=(.*)")


#: Line ends of a text corpus: only these end a sequence (not U+2028, U+2029, U+0085, form feed or
#: vertical tab, which str.splitlines() also splits on; shared/CASES.md F22).
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


def read_corpus(path: str | Path, limit: int | None = None) -> list[str]:
    """Read sequences from a file.

    Plain text: one sequence a line (lines end only at \\n, \\r\\n or \\r), blank lines skipped.
    CoNLL-U (``.conllu`` or files with ``# text =`` / ``# sent_id`` comments): one sequence per
    sentence, from its ``# text =`` line.

    Args:
        path: the file.
        limit: keep at most this many sequences (must be >= 1).

    Raises:
        InputError: missing or unreadable file, non-UTF-8 bytes (file and line named), a file with
            no sequence, or a limit below 1.
    """
    validate.limit(limit)
    p = Path(path)
    if not p.exists():
        raise InputError(f"corpus file not found: {path}")
    if p.is_dir():
        raise InputError(f"corpus is a folder, not a file: {path}")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read corpus file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line} is not valid UTF-8 "
                         f"(byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = split_lines(text)
    if _is_conllu(p, lines):
        # "# text = ..." only: not "# text_en = ..." (translations) or other "# text..." keys.
        texts = [m.group(1).strip() for m in map(_TEXT_LINE.match, lines) if m]
        texts = [t for t in texts if t]
    else:
        texts = [ln.strip() for ln in lines if ln.strip()]
    if not texts and _is_conllu(p, lines):
        raise InputError(f"no '# text =' line found in CoNLL-U file {path}: probe reads each sentence's text from "
                         "its '# text = ...' comment")
    if not texts:
        raise InputError(f"corpus file has no text: {path}")
    return texts[:limit] if limit else texts


def read_pairs(path: str | Path, limit: int | None = None) -> list:
    """Read sentence pairs: one pair a line, the two segments separated by one tab.

    Lines end only at \\n, \\r\\n or \\r; blank lines are skipped. Each pair becomes one
    :class:`probe.inputs.Text` with ``pair`` set (encoded as the tokenizer joins pairs: BERT's
    [CLS] A [SEP] B [SEP] with segment ids 0 and 1).

    Args:
        path: the TSV file.
        limit: keep at most this many pairs (>= 1).

    Raises:
        InputError: missing or unreadable file, non-UTF-8 bytes, a line without exactly one tab or
            with an empty segment (line numbered from 1), no pair, or a limit below 1.
    """
    from .inputs import Text

    validate.limit(limit)
    p = Path(path)
    if not p.exists():
        raise InputError(f"pairs file not found: {path}")
    if p.is_dir():
        raise InputError(f"pairs file is a folder, not a file: {path}")
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as exc:
        raise InputError(f"cannot read pairs file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not valid UTF-8 (byte offset {exc.start})") from None
    pairs = []
    for number, line in enumerate(split_lines(text.removeprefix("\ufeff")), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise InputError(f"{path}: line {number} is not two non-empty segments separated by one tab")
        pairs.append(Text(parts[0].strip(), pair=parts[1].strip()))
    if not pairs:
        raise InputError(f"pairs file has no pair: {path}")
    return pairs[:limit] if limit else pairs


def check_texts(texts: list[str], limit: int | None = None) -> list[str]:
    """Validate texts given directly (``--text``): non-empty; applies ``limit``.

    Raises:
        InputError: no text, an empty or whitespace-only text, or a limit below 1.
    """
    validate.limit(limit)
    texts = validate.texts(texts)
    return list(texts[:limit] if limit else texts)
