"""Prompt pairs for activation patching: the pair file, the built-in indirect-object set, and
their tokens (clean and corrupted prompts of equal token count, answers of one token).

Where the metric reads the logits (:attr:`EncodedPairs.last`): a decoder's last real position; a
masked-LM encoder's first mask token of the clean prompt (the corrupted prompt has its mask at the
same position); an encoder-decoder model's last decoder position, the decoder reading its start
token and the pair's target prefix (the optional fifth field; empty: the first target token is
predicted), the clean and corrupted prompts being the sources.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError
from ..text.inputs import Text
from ..text.pairfile import Pair, builtin_pairs, parse_pairs, read_pairs  # noqa: F401 (re-exported)
from ..text.targets import decoder_start_id
from ..text.tokenization import tokenize_side


@dataclass
class EncodedPairs:
    """Pairs as token ids, right-padded.

    Attributes:
        clean: [pairs, T] token ids of the clean prompts.
        corrupted: [pairs, T] token ids of the corrupted prompts.
        mask: [pairs, T] 1 for real tokens (the same for both).
        last: [pairs] the position the metric reads: the last real position (decoders), the first
            mask (masked-LM encoders), the last decoder position (encoder-decoder models).
        answer: [pairs] token id of the answer.
        wrong: [pairs] token id of the wrong answer.
        target: encoder-decoder models: [pairs, T_target] the decoder's input (start token, prefix), else None.
        target_mask: [pairs, T_target] 1 for real decoder tokens, or None.
        source_last: [pairs] the last real position of the prompts (the encoder's, where the metric
            reads the decoder).
    """

    clean: torch.Tensor
    corrupted: torch.Tensor
    mask: torch.Tensor
    last: torch.Tensor
    answer: torch.Tensor
    wrong: torch.Tensor
    target: torch.Tensor | None = None
    target_mask: torch.Tensor | None = None
    source_last: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.last)


#: Where a decoder's metric reads the logits, in words (:func:`metric_place`).
LAST_POSITION = "the last real position"


def metric_place(kind: str) -> str:
    """Where the metric reads the logits of a model of ``kind`` (``"encoder"``, ``"decoder"``,
    ``"encoder-decoder"``), in words for a report: :attr:`EncodedPairs.last`."""
    return {"encoder": "the clean prompt's [MASK]",
            "encoder-decoder": "the decoder's last real position"}.get(kind, LAST_POSITION)


def _one_token(lm, word: str, n: int, what: str, target: bool = False) -> int:
    kw = {"text_target": word} if target else {"text": word}
    ids = lm.tokenizer(**kw, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise InputError(f"pair {n}: the {what} {word!r} is {len(ids)} tokens; answers must be one token each "
                         "(a leading space is usually part of the token: ' Mary')")
    return ids[0]


def _pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([n, T] ids right-padded with ``pad``, [n, T] mask)."""
    T = max(len(r) for r in rows)
    lengths = torch.tensor([len(r) for r in rows])
    return (torch.tensor([list(r) + [pad] * (T - len(r)) for r in rows]),
            (torch.arange(T)[None, :] < lengths[:, None]).long())


def _prompts(lm, pairs: list[Pair]) -> tuple[list, list]:
    """Token ids of the clean and corrupted prompts (sources), checked for equal counts.

    Raises:
        InputError: a prompt longer than the model takes, or a pair of different token counts.
    """
    parse = lm.kind == "encoder"  # a masked-LM prompt writes its mask token as text: [MASK]
    sides = [tokenize_side(lm, [Text(getattr(p, side)) for p in pairs], lm.max_length, parse_special_tokens=parse)
             for side in ("clean", "corrupted")]
    for n, (p, a, b) in enumerate(zip(pairs, *sides), 1):
        if a.truncated or b.truncated:
            raise InputError(f"pair {n}: longer than the model's {lm.max_length} tokens")
        if len(a.ids) != len(b.ids):
            raise InputError(f"pair {n}: the clean and corrupted prompts have different token counts "
                             f"({len(a.ids)} and {len(b.ids)}): {p.clean!r} / {p.corrupted!r}")
        if p.prefix and lm.kind != "encoder-decoder":
            raise InputError(f"pair {n}: a target prefix (the fifth field) is read by encoder-decoder models only")
    return [list(a.ids) for a in sides[0]], [list(b.ids) for b in sides[1]]


def _mask_positions(lm, clean: list, corrupted: list, pairs: list[Pair]) -> torch.Tensor:
    """[pairs] the first mask token of each clean prompt (masked-LM encoders).

    Raises:
        InputError: no mask token, a clean prompt without one, or a corrupted prompt whose first
            mask sits elsewhere (naming both positions).
    """
    mask_id = getattr(lm.tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise InputError(f"{lm.name}'s tokenizer has no mask token: masked-LM patching reads the logits at a mask")
    out = []
    for n, (a, b, p) in enumerate(zip(clean, corrupted, pairs), 1):
        where = [i for i, t in enumerate(a) if t == mask_id]
        if not where:
            raise InputError(f"pair {n}: the clean prompt has no {lm.tokenizer.mask_token}: {p.clean!r}")
        other = next((i for i, t in enumerate(b) if t == mask_id), None)
        if other != where[0]:
            raise InputError(f"pair {n}: the first {lm.tokenizer.mask_token} is at token {where[0]} of the clean "
                             f"prompt and at {'no token' if other is None else f'token {other}'} of the corrupted one")
        out.append(where[0])
    return torch.tensor(out)


def encode_pairs(lm, pairs: list[Pair]) -> EncodedPairs:
    """Tokenize pairs (special tokens as the tokenizer adds them; see the module docstring for where
    the metric reads).

    Raises:
        InputError: a pair whose clean and corrupted prompts differ in token count (naming both),
            an answer or wrong answer that is not one token, an answer and a wrong answer that are the
            same token, a prompt longer than the model takes,
            a masked-LM pair without its mask at one position in both prompts, a target prefix
            for a model without a decoder reading one.
    """
    clean, corrupted = _prompts(lm, pairs)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    ids, mask = _pad(clean, pad)
    bad, _ = _pad(corrupted, pad)
    source_last = mask.sum(1) - 1
    seq2seq = lm.kind == "encoder-decoder"
    answer = torch.tensor([_one_token(lm, p.answer, n, "answer", seq2seq) for n, p in enumerate(pairs, 1)])
    wrong = torch.tensor([_one_token(lm, p.wrong, n, "wrong answer", seq2seq) for n, p in enumerate(pairs, 1)])
    for n, (p, a, w) in enumerate(zip(pairs, answer.tolist(), wrong.tolist()), 1):
        if a == w:  # logit(answer) - logit(wrong) of one token is 0 in every run: nothing could be measured
            raise InputError(f"pair {n}: the answer {p.answer!r} and the wrong answer {p.wrong!r} are the same token "
                             f"(id {a}); their logit difference is 0 whatever is patched: give two different tokens")
    if lm.kind == "encoder":
        return EncodedPairs(ids, bad, mask, _mask_positions(lm, clean, corrupted, pairs), answer, wrong,
                            source_last=source_last)
    if not seq2seq:
        return EncodedPairs(ids, bad, mask, source_last, answer, wrong, source_last=source_last)
    start = decoder_start_id(lm)
    rows = [[start, *lm.tokenizer(text_target=p.prefix, add_special_tokens=False)["input_ids"]] if p.prefix
            else [start] for p in pairs]
    target, target_mask = _pad(rows, pad)
    return EncodedPairs(ids, bad, mask, target_mask.sum(1) - 1, answer, wrong, target, target_mask, source_last)
