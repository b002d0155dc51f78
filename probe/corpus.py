"""Reading text input: plain text (one sequence a line) or CoNLL-U (``# text =`` lines).

The product never needs the shared annotated data at run time: without input, the small English
sample shipped in ``probe/data/sample.txt`` (written for the package) is used.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from .errors import InputError

#: A CoNLL-U sentence-text comment: ``# text = ...``.
_TEXT_LINE = re.compile(r"#\s*text\s*=(.*)")


def sample_texts() -> list[str]:
    """The built-in English sample (20 sentences written for probe)."""
    text = resources.files("probe").joinpath("data/sample.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def _is_conllu(path: Path, lines: list[str]) -> bool:
    if path.suffix.lower() in (".conllu", ".conll"):
        return True
    head = [ln for ln in lines[:50] if ln.strip()]
    return bool(head) and any(ln.startswith("# text =") or ln.startswith("# sent_id") for ln in head)


def read_corpus(path: str | Path, limit: int | None = None) -> list[str]:
    """Read sequences from a file.

    Plain text: one sequence a line, blank lines skipped. CoNLL-U (``.conllu`` or files with
    ``# text =`` / ``# sent_id`` comments): one sequence per sentence, from its ``# text =`` line.

    Args:
        path: the file.
        limit: keep at most this many sequences (must be >= 1).

    Raises:
        InputError: missing or unreadable file, non-UTF-8 bytes (file and line named), a file with
            no sequence, or a limit below 1.
    """
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}")
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
        raise InputError(f"{path}: line {line} is not valid UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.splitlines()
    if _is_conllu(p, lines):
        # "# text = ..." only: not "# text_en = ..." (translations) or other "# text..." keys.
        texts = [m.group(1).strip() for m in map(_TEXT_LINE.match, lines) if m]
        texts = [t for t in texts if t]
    else:
        texts = [ln.strip() for ln in lines if ln.strip()]
    if not texts:
        raise InputError(f"corpus file has no text: {path}")
    return texts[:limit] if limit else texts


def check_texts(texts: list[str], limit: int | None = None) -> list[str]:
    """Validate texts given directly (``--text``): non-empty; applies ``limit``.

    Raises:
        InputError: no text, an empty or whitespace-only text, or a limit below 1.
    """
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}")
    if not texts:
        raise InputError("no text given")
    for i, t in enumerate(texts):
        if not t or not t.strip():
            raise InputError(f"text {i + 1} is empty")
    return list(texts[:limit] if limit else texts)
