"""Prompt pairs for activation patching: the pair file, the built-in indirect-object set, and
their tokens (clean and corrupted prompts of equal token count, answers of one token)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from ..errors import InputError
from ..inputs import Text, tokenize


@dataclass(frozen=True)
class Pair:
    """One prompt pair: ``clean`` and ``corrupted`` text, the ``answer`` and ``wrong`` continuations
    (one token each, leading space included: ``" Mary"``)."""

    clean: str
    corrupted: str
    answer: str
    wrong: str


@dataclass
class EncodedPairs:
    """Pairs as token ids, right-padded.

    Attributes:
        clean: [pairs, T] token ids of the clean prompts.
        corrupted: [pairs, T] token ids of the corrupted prompts.
        mask: [pairs, T] 1 for real tokens (the same for both).
        last: [pairs] index of the last real position.
        answer: [pairs] token id of the answer.
        wrong: [pairs] token id of the wrong answer.
    """

    clean: torch.Tensor
    corrupted: torch.Tensor
    mask: torch.Tensor
    last: torch.Tensor
    answer: torch.Tensor
    wrong: torch.Tensor

    def __len__(self) -> int:
        return len(self.last)


def builtin_pairs() -> list[Pair]:
    """The built-in indirect-object-identification set (20 pairs, written for probe in the spirit of
    Wang et al. 2022): "When Mary and John went to the store, John gave a drink to" -> " Mary" vs
    " John"; the corrupted prompt repeats the other name, which flips the answer."""
    text = resources.files("probe").joinpath("data/ioi_pairs.tsv").read_text(encoding="utf-8")
    return parse_pairs(text, "the built-in set")


def read_pairs(path: str | Path) -> list[Pair]:
    """Read a pair file: tab-separated ``clean, corrupted, answer, wrong`` per line (an optional
    header line starting with ``clean``; blank lines skipped; spaces inside fields are kept).

    Raises:
        InputError: unreadable file, a line without four fields, or no pair.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read pairs file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_pairs(text, str(path))


def parse_pairs(text: str, source: str) -> list[Pair]:
    """:func:`read_pairs` on the file's text (``source`` names it in errors)."""
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or (n == 1 and line.split("\t")[0].strip().lower() == "clean"):
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise InputError(f"{source}, line {n}: {len(fields)} tab-separated fields; a pair line is "
                             "clean<TAB>corrupted<TAB>answer<TAB>wrong")
        pairs.append(Pair(*fields))
    if not pairs:
        raise InputError(f"{source}: no pair (clean<TAB>corrupted<TAB>answer<TAB>wrong per line)")
    return pairs


def _one_token(lm, word: str, n: int, what: str) -> int:
    ids = lm.tokenizer(word, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise InputError(f"pair {n}: the {what} {word!r} is {len(ids)} tokens; answers must be one token each "
                         "(a leading space is usually part of the token: ' Mary')")
    return ids[0]


def encode_pairs(lm, pairs: list[Pair]) -> EncodedPairs:
    """Tokenize pairs (special tokens as the tokenizer adds them).

    Raises:
        InputError: a pair whose clean and corrupted prompts differ in token count (naming both),
            an answer or wrong answer that is not one token, or a prompt longer than the model takes.
    """
    clean = tokenize(lm, [Text(p.clean) for p in pairs])
    corrupted = tokenize(lm, [Text(p.corrupted) for p in pairs])
    for n, (p, a, b) in enumerate(zip(pairs, clean, corrupted), 1):
        if a.truncated or b.truncated:
            raise InputError(f"pair {n}: longer than the model's {lm.max_length} tokens")
        if len(a.ids) != len(b.ids):
            raise InputError(f"pair {n}: the clean and corrupted prompts have different token counts "
                             f"({len(a.ids)} and {len(b.ids)}): {p.clean!r} / {p.corrupted!r}")
    T = max(len(a.ids) for a in clean)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    rows = [[list(a.ids) + [pad] * (T - len(a.ids)) for a in side] for side in (clean, corrupted)]
    lengths = torch.tensor([len(a.ids) for a in clean])
    return EncodedPairs(torch.tensor(rows[0]), torch.tensor(rows[1]),
                        (torch.arange(T)[None, :] < lengths[:, None]).long(), lengths - 1,
                        torch.tensor([_one_token(lm, p.answer, n, "answer") for n, p in enumerate(pairs, 1)]),
                        torch.tensor([_one_token(lm, p.wrong, n, "wrong answer") for n, p in enumerate(pairs, 1)]))
