"""Encoder-decoder models (BART, Marian, T5): source/target inputs, sides of each site, greedy targets.

An encoder-decoder model reads a source and writes a target. Its three kinds of attention site see
different tokens (:func:`sides`):

- ``encoder.<layer>.self``: source queries, source keys, [batch, heads, S, S];
- ``decoder.<layer>.self`` (causal): target queries, target keys, [batch, heads, T, T];
- ``decoder.<layer>.cross``: target queries, source keys, [batch, heads, T, S].

A :class:`~probe.text.inputs.Batch` of such a model holds the sources; ``batch.target`` is a batch of
its own holding the decoder's input: the decoder start token followed by the tokenized target
(``text_target=``), right-padded like the source, so padding on either side never enters a
statistic. Targets come from the input (:attr:`Text.target`; ``--pairs FILE``: source TAB
target) or from the model itself (:func:`with_generated_targets`, greedy decoding).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch

from .. import validate
from ..architectures import get_spec
from ..capture.hooks import input_device, measuring
from ..errors import InputError
from ..text.inputs import Batch
from ..text.sequence import Text, target_text
from ..text.targets import decoder_start_id, tokenize_pairs  # noqa: F401 (tokenize_pairs: re-exported)
from ..util import quiet_transformers

#: Sources generated for at once by :func:`with_generated_targets`.
GENERATE_BATCH = 8


def stack_depths(sites) -> dict[str, int]:
    """Layers per stack of an encoder-decoder model's sites (``{"encoder": n, "decoder": m}``)."""
    return {stack: sum(1 for s in sites if s.stack == stack and s.kind == "self") for stack in ("encoder", "decoder")}


def as_targets(texts: Iterable[Text]) -> Iterable[Text]:
    """Texts read with a second segment (``pair``: a ``--pairs`` file's second column) as an
    encoder-decoder model's sources and targets: the same texts with that segment as ``target``
    (a list stays a list, a stream stays lazy)."""
    moved = (Text(t.text, t.words, t.meta, None, t.index, t.pair) if t.pair is not None else t for t in texts)
    return list(moved) if hasattr(texts, "__len__") else moved


def sides(site, batch: Batch) -> tuple[Batch, Batch]:
    """(query side, key side) of a site's probabilities [batch, heads, query, key]: the batch
    itself for every site of a one-stack model and for an encoder's self-attention; the target
    batch for a decoder's self-attention; target queries and source keys for cross-attention.

    Raises:
        ValueError: a decoder site of an encoder-decoder model on a batch without targets.
    """
    if batch.target is None or site.stack == "encoder":
        return batch, batch
    if site.kind == "cross":
        return batch.target, batch
    return batch.target, batch.target


def check_generate(lm, max_new_tokens: int) -> None:
    """Check that ``lm`` can write targets (``--generate N``).

    Raises:
        InputError: ``lm`` is not an encoder-decoder model, or max_new_tokens below 1.
    """
    if lm.kind != "encoder-decoder":
        raise InputError(f"--generate writes targets for encoder-decoder models (BART, Marian, T5); {lm.name} is "
                         "not one")
    validate.positive_int("--generate", max_new_tokens)


def check_generate_config(config, name: str, max_new_tokens: int) -> None:
    """:func:`check_generate` decided from a model's config (:func:`probe.loading.models.peek_config`),
    before its weights load.

    Raises:
        InputError: the config is not an encoder-decoder model's, or max_new_tokens below 1.
    """
    if get_spec(config).kind != "encoder-decoder":
        raise InputError(f"--generate writes targets for encoder-decoder models (BART, Marian, T5); {name} is "
                         "not one")
    validate.positive_int("--generate", max_new_tokens)


def generate_targets(lm, sources: Sequence[str], max_new_tokens: int) -> list[str]:
    """Greedy decoding (no sampling, one beam) of at most ``max_new_tokens`` tokens per source.

    Returns:
        The generated targets as text (special tokens dropped); an empty string where the model
        ended at once. Analysing them re-tokenizes that text as a target.

    Raises:
        InputError: max_new_tokens below 1.
    """
    validate.positive_int("--generate", max_new_tokens)
    tok = lm.tokenizer
    device = input_device(lm.model)
    with quiet_transformers(progress_bars=True):
        enc = tok(list(sources), return_tensors="pt", padding=True, truncation=True, max_length=lm.max_length)
    pad = tok.pad_token_id if tok.pad_token_id is not None else decoder_start_id(lm)
    from transformers import DynamicCache, EncoderDecoderCache  # deferred: transformers takes ~1.5 s to import

    # a cache that grows layer by layer: generate's own is sized from config.num_layers, the
    # encoder's depth, and breaks on T5 models whose decoder is deeper (num_decoder_layers)
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    # under measuring: eval mode, every flag restored, every id checked against its table (probe.capture.lookups)
    with torch.no_grad(), quiet_transformers(progress_bars=True), measuring(lm.model, eager=False):
        out = lm.model.generate(input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device),
                                max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                decoder_start_token_id=decoder_start_id(lm), pad_token_id=pad,
                                cache=cache)
    return [tok.decode(row[1:], skip_special_tokens=True).strip() for row in out.cpu()]


def with_generated_targets(lm, texts: Iterable[Text], max_new_tokens: int) -> Iterator[Text]:
    """The texts with ``target`` set to the model's own greedy target (:func:`generate_targets`),
    generated :data:`GENERATE_BATCH` sources at a time as the texts are read.

    Raises (while iterating):
        InputError: a text that already has a target, or max_new_tokens below 1.
    """
    validate.positive_int("--generate", max_new_tokens)
    chunk: list[Text] = []

    def flush():
        for t, target in zip(chunk, generate_targets(lm, [t.text for t in chunk], max_new_tokens)):
            yield Text(t.text, t.words, t.meta, None, t.index, target)

    for i, t in enumerate(texts):
        if target_text(t) is not None:
            raise InputError(f"text {(t.index if t.index is not None else i) + 1} already has a target; "
                             "--generate writes targets for sources only")
        chunk.append(t)
        if len(chunk) == GENERATE_BATCH:
            yield from flush()
            chunk = []
    if chunk:
        yield from flush()
