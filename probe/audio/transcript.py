"""The decoder's tokens for a clip: the prompt a speech model starts from, then the transcript it
writes (greedy, a bounded number of tokens) or one the user gives.

The prompt is the generation config's ``decoder_start_token_id``; a multilingual Whisper
checkpoint (``lang_to_id`` in its generation config) then gets the language token the model
finds most likely after the start token (Whisper's language detection), the ``transcribe`` task
token (``task_to_id``) and the no-timestamps token (``no_timestamps_token_id``), as Whisper's
``generate`` builds them. While writing, the tokenizer's special tokens other than the end token
and the generation config's ``suppress_tokens`` are never chosen (nor ``begin_suppress_tokens``
as the first token), so the transcript is text up to the end token.
"""

from __future__ import annotations

import torch

from ..errors import InputError


def _config(lm):
    return lm.tokenizer.generation_config


def _start_id(lm) -> int:
    gen = _config(lm)
    start = getattr(gen, "decoder_start_token_id", None) if gen is not None else None
    if start is None:
        start = getattr(lm.model.config, "decoder_start_token_id", None)
    if start is None:
        raise InputError(f"{lm.name} names no decoder start token (decoder_start_token_id)")
    return int(start)


def _logits(lm, encoded, ids: torch.Tensor) -> torch.Tensor:
    """[batch, vocab] float32 next-token logits after ``ids`` [batch, T]."""
    out = lm.model(encoder_outputs=encoded, decoder_input_ids=ids.to(encoded[0].device), use_cache=False)
    return out.logits[:, -1].float().cpu()


def _encode(lm, features: torch.Tensor):
    param = next(lm.model.parameters())
    return lm.model.get_encoder()(input_features=features.to(param.device, param.dtype))


def _prompt(lm, encoded, batch: int) -> torch.Tensor:
    """[batch, prompt] the prompt of every clip (the language token chosen per clip)."""
    gen = _config(lm)
    ids = torch.full((batch, 1), _start_id(lm), dtype=torch.long)
    langs = getattr(gen, "lang_to_id", None) if gen is not None else None
    if langs:
        choices = torch.tensor(sorted(langs.values()))
        best = choices[_logits(lm, encoded, ids)[:, choices].argmax(-1)]
        ids = torch.cat([ids, best[:, None]], 1)
        task = (getattr(gen, "task_to_id", None) or {}).get("transcribe")
        if task is not None:
            ids = torch.cat([ids, torch.full((batch, 1), int(task))], 1)
    no_ts = getattr(gen, "no_timestamps_token_id", None) if gen is not None else None
    if no_ts is not None:
        ids = torch.cat([ids, torch.full((batch, 1), int(no_ts))], 1)
    return ids


def _banned(lm, first: bool, eos: set[int]) -> list[int]:
    """Tokens never written: the tokenizer's special tokens but the end, the generation config's
    ``suppress_tokens`` (and ``begin_suppress_tokens`` first)."""
    gen = _config(lm)
    out = [t for t in lm.tokenizer.text.all_special_ids if t not in eos]
    if gen is None:
        return out
    out += list(getattr(gen, "suppress_tokens", None) or [])
    return out + list(getattr(gen, "begin_suppress_tokens", None) or []) if first else out


@torch.no_grad()
def transcribe(lm, features: torch.Tensor, max_new_tokens: int) -> list[tuple[int, list[int]]]:
    """The model's own transcript of each clip, greedy.

    Args:
        lm: a loaded speech model.
        features: [batch, mel bins, mel frames] log-mel features.
        max_new_tokens: at most this many tokens after the prompt (the end token included).

    Returns:
        Per clip (prompt length, decoder ids): the prompt, the written tokens and the end token
        where the model wrote it within the bound.
    """
    lm.model.eval()
    encoded = _encode(lm, features)
    ids = _prompt(lm, encoded, features.shape[0])
    n_prompt = ids.shape[1]
    eos = getattr(_config(lm), "eos_token_id", None) or lm.model.config.eos_token_id
    eos = set([eos] if isinstance(eos, int) else eos or [])
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    lengths = torch.full((ids.shape[0],), n_prompt)
    for step in range(max_new_tokens):
        logits = _logits(lm, encoded, ids)
        banned = [t for t in _banned(lm, step == 0, eos) if 0 <= t < logits.shape[-1]]
        logits[:, banned] = float("-inf")
        nxt = logits.argmax(-1)
        ids = torch.cat([ids, nxt[:, None]], 1)
        lengths = torch.where(done, lengths, lengths + 1)
        done |= torch.tensor([int(t) in eos for t in nxt])
        if bool(done.all()):
            break
    return [(n_prompt, ids[b, :int(lengths[b])].tolist()) for b in range(ids.shape[0])]


@torch.no_grad()
def given_ids(lm, features: torch.Tensor, transcript: str) -> tuple[int, list[int]]:
    """(prompt length, decoder ids) of a transcript the user gives for one clip ([1, mel bins, mel
    frames] features: the prompt's language token is still the model's choice): the prompt, the
    transcript's tokens (no special tokens added), the end token.

    Raises:
        InputError: an empty transcript.
    """
    if not transcript.strip():
        raise InputError("--transcript is empty")
    prompt = _prompt(lm, _encode(lm, features), 1)[0].tolist()
    text = lm.tokenizer.text(transcript, add_special_tokens=False)["input_ids"]
    eos = getattr(_config(lm), "eos_token_id", None) or lm.model.config.eos_token_id
    eos = eos if isinstance(eos, int) else list(eos)[0]
    return len(prompt), prompt + list(text) + [int(eos)]
