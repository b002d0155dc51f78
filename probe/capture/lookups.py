"""Every id a model looks up, checked against the table it indexes, before the forward pass.

An embedding lookup past the end of its table fails deep inside the model with "index out of
range in self" (on a GPU, a device-side assert that poisons the process). The ids come from the
tokenizer, the model from its config, and the two may not fit: a RoBERTa-style encoder with one
segment type saved with a BERT tokenizer that numbers the segments of a sentence pair 0 and 1, a
tokenizer whose vocabulary is larger than the model's, a sequence longer than the position table.
:func:`check_lookups` compares, for one forward call:

* token ids (``input_ids``, and ``decoder_input_ids`` of encoder-decoder models) with the rows of
  the token embedding table the model reads them from;
* segment ids (``token_type_ids``) with the rows of the segment embedding table
  (``type_vocab_size``); a model whose config gives token types no table of their own gets none
  (GPT-2 would look them up in its token table: see :func:`has_type_table`), with a note;
* positions (``position_ids`` where given, else those the model derives: ``0 .. past + T - 1``
  plus the offset of the table's first used row: RoBERTa numbers positions from
  ``pad_token_id + 1`` and counts only non-padding tokens, OPT and BART start at 2) with the rows
  of a learned or fixed position table; rotary and relative positions have no table and no limit
  here.

A model with a single segment type has never seen another one: every token of its training data
sat in segment 0, which is what its own tokenizer sends (RoBERTa's sends no segment ids at all).
Segment ids above 0 for such a model are therefore dropped (the model then uses its segment 0 for
every token) with a note, instead of an error; any other id past its table is an error naming the
id and the table's size.

:func:`probe.capture.hooks.measuring`, through which every forward pass of probe runs (analysis, capture,
``show``, verification, the circuit probe, pruning), calls :func:`check_lookups` in a forward
pre-hook on the model, so there is one check for every path.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from ..architectures import get_spec
from ..architectures.modules import has_type_table
from ..errors import InputError, UnsupportedArchitectureError

#: Attribute names of the position tables of the supported families (learned or sinusoidal).
POSITION_TABLES = ("position_embeddings", "wpe", "embed_positions")
#: Attribute names of the segment (token type) tables.
SEGMENT_TABLES = ("token_type_embeddings",)


def _tables(model: nn.Module, names: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    """(dotted name, module) of every sub-module whose last name is one of ``names`` and that has rows
    (an embedding: ``num_embeddings``, or a fixed sinusoidal table: ``weight`` [rows, width])."""
    return [(n, m) for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in names and _rows(m) is not None]


def _rows(module: nn.Module) -> int | None:
    """Rows of a lookup table (the offset rows of OPT/BART-style tables included), or None."""
    rows = getattr(module, "num_embeddings", None)
    if isinstance(rows, int):
        return rows
    weight = getattr(module, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def _padding_row(model: nn.Module) -> int | None:
    """The padding row of a model that numbers positions RoBERTa's way (from the row after it,
    counting only tokens other than that id: RoBERTa's ``pad_token_id``, MPNet's fixed 1), or None:
    positions 0, 1, ... (:attr:`probe.architectures.ArchSpec.position_offset`, the padding row + 1)."""
    try:
        offset = get_spec(model.config).position_offset(model.config)
    except UnsupportedArchitectureError:
        return None
    return offset - 1 if offset > 0 else None


def _token_tables(model: nn.Module) -> dict[str, tuple[str, int]]:
    """input name -> (what, rows) of the token embedding tables."""
    out = {}
    try:
        emb = model.get_input_embeddings()
    except NotImplementedError:  # no token table to name (raw-waveform speech encoders: wav2vec2, HuBERT)
        emb = None
    if emb is not None and _rows(emb) is not None:
        out["input_ids"] = ("vocabulary (vocab_size)", _rows(emb))
    decoder = getattr(getattr(model, "base_model", model), "decoder", None)
    dec_emb = getattr(decoder, "embed_tokens", None) if decoder is not None else None
    if dec_emb is not None and _rows(dec_emb) is not None:
        out["decoder_input_ids"] = ("decoder vocabulary", _rows(dec_emb))
    return out


@dataclass(frozen=True)
class _Tables:
    """The lookup tables of one model, found once (the hook runs on every forward call)."""

    tokens: dict  # input name -> (what, rows)
    segments: list  # (name, module) of the segment tables
    positions: list  # (name, module) of the position tables
    padding_row: int | None  # positions numbered RoBERTa's way from the row after this one, or None
    typed: bool = True  # the config gives token types a table of their own (type_vocab_size > 0)
    misread: bool = False  # without one, the forward still takes token_type_ids (GPT-2: from its token table)

    @classmethod
    def of(cls, model: nn.Module) -> _Tables:
        return cls(_token_tables(model), _tables(model, SEGMENT_TABLES), _tables(model, POSITION_TABLES),
                   _padding_row(model), has_type_table(getattr(model, "config", None)), cls.misreads(model))

    @staticmethod
    def misreads(model: nn.Module) -> bool:
        """No token type table in the config, none declared (``type_vocab_size`` absent, not 0), and a
        forward that takes ``token_type_ids``: the model would read them some other way (GPT-2)."""
        config = getattr(model, "config", None)
        return (not has_type_table(config) and getattr(config, "type_vocab_size", None) is None
                and _takes_types(model))


def type_note(model: nn.Module, tokenizer) -> str | None:
    """The note for a model loaded with a tokenizer that emits token types the model's config gives no
    table of their own while its forward would still read them (GPT-2: from its token table), or None.
    Such a model gets none (:func:`probe.text.inputs.collate`, and :func:`check_lookups` for a call
    made with them)."""
    names = getattr(tokenizer, "model_input_names", None) or ()
    return NO_TYPE_TABLE if "token_type_ids" in names and _Tables.misreads(model) else None


def _takes_types(model: nn.Module) -> bool:
    """Whether the model's forward names ``token_type_ids`` among its parameters."""
    try:
        return "token_type_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


#: The note of token types dropped for a model without a table of their own.
NO_TYPE_TABLE = ("the tokenizer gives token types (token_type_ids) but the model's config gives them no table of "
                 "their own (no type_vocab_size): they are not passed (a GPT-2-style model would read them as "
                 "tokens of its vocabulary, adding token 0's embedding at every position)")


def _id_range(ids: torch.Tensor) -> tuple[int, int]:
    """(lowest, highest) id, read from the device in one transfer."""
    low, high = torch.stack([ids.min(), ids.max()]).tolist()
    return int(low), int(high)


def _check_tokens(tables: _Tables, inputs: dict) -> None:
    for name, (what, rows) in tables.tokens.items():
        ids = inputs.get(name)
        if not isinstance(ids, torch.Tensor) or ids.numel() == 0:
            continue
        low, high = _id_range(ids)
        if low < 0 or high >= rows:
            bad = low if low < 0 else high
            raise InputError(f"token id {bad} ({name}) is outside the model's {what} of {rows} tokens (ids 0 to "
                             f"{rows - 1}): the tokenizer does not fit this model")


def _check_segments(tables: _Tables, inputs: dict, notes: list[str]) -> dict:
    """``inputs`` with segment ids checked (dropped for a model with one segment type, or with no
    table of their own)."""
    ids = inputs.get("token_type_ids")
    if not isinstance(ids, torch.Tensor) or ids.numel() == 0:
        return inputs
    if not tables.typed:  # a model that declares no type table (DeBERTa-v3's 0) ignores them: said only where not
        if tables.misread and NO_TYPE_TABLE not in notes:
            notes.append(NO_TYPE_TABLE)
        return {k: v for k, v in inputs.items() if k != "token_type_ids"}
    if not tables.segments:
        return inputs
    rows = min(_rows(m) for _, m in tables.segments)
    low, high = _id_range(ids)
    if low >= 0 and high < rows:
        return inputs
    if rows == 1 and low >= 0:
        note = (f"the tokenizer gives segment ids up to {high} but the model has 1 segment type "
                "(type_vocab_size=1): segment ids dropped, every token is read as segment 0 (what the "
                "model's own tokenizer sends)")
        if note not in notes:
            notes.append(note)
        return {k: v for k, v in inputs.items() if k != "token_type_ids"}
    bad = low if low < 0 else high
    raise InputError(f"segment id {bad} (token_type_ids) is outside the model's segment table of {rows} types "
                     f"(type_vocab_size={rows}, ids 0 to {rows - 1}): the tokenizer does not fit this model")


def _past_length(inputs: dict, length: int) -> int:
    """Tokens before this call's (a key/value cache): the attention mask covers past + new tokens."""
    mask = inputs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        return max(0, int(mask.shape[1]) - length)
    return 0


def _highest_position(model: nn.Module, table: nn.Module, ids: torch.Tensor, inputs: dict,
                      given, padding_row: int | None) -> tuple[int, str]:
    """(highest row of ``table`` this call reads, how it was found) for token ids [batch, T]."""
    own = getattr(table, "offset", None)  # OPT, BART: position p reads row p + offset
    offset = own if isinstance(own, int) else 0
    if isinstance(given, torch.Tensor) and given.numel():
        return int(given.max()) + offset, "position_ids" + (f" + offset {offset}" if offset else "")
    if own is None and padding_row is not None:
        counted = int((ids != padding_row).sum(-1).max())
        return padding_row + counted, f"{counted} non-padding tokens numbered from padding id {padding_row} + 1"
    n = _past_length(inputs, ids.shape[1]) + ids.shape[1]
    return offset + n - 1, f"{n} tokens" + (f" from row {offset}" if offset else "")


def _check_positions(model: nn.Module, tables: _Tables, inputs: dict) -> None:
    for name, table in tables.positions:
        # a decoder's table reads the decoder's ids in an encoder-decoder model, the input ids in a
        # decoder alone (WhisperForCausalLM's model.decoder.embed_positions)
        decoder = "decoder" in name.split(".") and bool(getattr(model.config, "is_encoder_decoder", False))
        ids = inputs.get("decoder_input_ids" if decoder else "input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.numel() == 0:
            continue
        given = inputs.get("decoder_position_ids" if decoder else "position_ids")
        highest, how = _highest_position(model, table, ids, inputs if not decoder else {}, given,
                                         tables.padding_row)
        rows = _rows(table)
        if highest >= rows:
            limit = getattr(model.config, "max_position_embeddings", None)
            size = f"; max_position_embeddings={limit}" if isinstance(limit, int) else ""
            raise InputError(f"position row {highest} ({how}) is outside the model's position table of {rows} "
                             f"rows ({name}{size}): use a shorter text or --max-length")


def check_lookups(model: nn.Module, inputs: dict, notes: list[str] | None = None,
                  tables: _Tables | None = None) -> dict:
    """Check every id of one forward call against the table it indexes.

    Args:
        model: a Hugging Face model (its embedding modules are read, nothing is changed).
        inputs: the forward call's keyword arguments (``input_ids`` [batch, T], ``token_type_ids``
            [batch, T], ``position_ids`` [batch, T], ``attention_mask`` [batch, past + T],
            ``decoder_input_ids`` [batch, T'] ...); tensors on any device.
        notes: where the note of dropped segment ids goes (appended once).
        tables: the model's tables found before (:func:`lookup_hook` keeps them); None: found now.

    Returns:
        ``inputs``, or a copy without ``token_type_ids`` for a model with one segment type fed
        segment ids above 0, or a model without a token type table of its own (see the module
        docstring).

    Raises:
        InputError: a token id outside the vocabulary table, a segment id outside a segment table
            of two or more types, or a position past the position table (each message names the
            id and the table's size).
    """
    notes = notes if notes is not None else []
    tables = tables if tables is not None else _Tables.of(model)
    _check_tokens(tables, inputs)
    inputs = _check_segments(tables, inputs, notes)
    _check_positions(model, tables, inputs)
    return inputs


def lookup_hook(notes: list[str]):
    """A forward pre-hook (``with_kwargs=True``) running :func:`check_lookups` on every call of the
    model it is registered on (a positional first argument is read as ``input_ids``). The model's
    tables are found on the first call and kept (the modules do not change while the hook is on)."""
    found: dict[int, _Tables] = {}

    def hook(module, args, kwargs):
        inputs = dict(kwargs)
        if args and isinstance(args[0], torch.Tensor) and "input_ids" not in inputs:
            inputs["input_ids"] = args[0]
        if id(module) not in found:
            found[id(module)] = _Tables.of(module)
        checked = check_lookups(module, inputs, notes, found[id(module)])
        if "token_type_ids" in kwargs and "token_type_ids" not in checked:
            kwargs = {k: v for k, v in kwargs.items() if k != "token_type_ids"}
            return args, kwargs
        return None
    return hook
