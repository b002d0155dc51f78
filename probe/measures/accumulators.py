"""The accumulator protocol of the analysis loop, and the small accumulators every run uses.

:func:`probe.runs.analysis.run` hands each site's attention probabilities, batch by batch, to a list of
accumulators::

    acc.begin_batch(batch)                 # optional, before the forward pass
    acc.update(site, probs, batch)         # every site; probs [batch, heads, query, key]
                                           # (+ values=ValueNorms when acc.reads_values,
                                           #  scores=Scores or None when acc.reads_scores)
    acc.end_batch(batch)                   # optional, after the forward pass
    acc.merge(other)                       # add another accumulator of the same kind (in place)
    acc.result()                           # what it measured

Row blocks (block capture of long sequences, :mod:`probe.capture.blocks`): an accumulator whose class sets
``row_blocks = True`` may instead be called ``acc.update(site, probs, batch, rows=(i0, i1))`` with
probs [batch, heads, i1 - i0, key], query rows i0..i1-1 (absolute positions) against every key.
For one site and one batch the calls come in row order, are disjoint and together cover every
query row; a ``values`` passed with a block covers the same rows. Without ``rows`` (the dense path)
probs are whole maps. An accumulator with ``row_blocks = False`` gets whole maps only: on a
block-captured batch :func:`probe.runs.analysis.run` does not call it (nor its ``begin_batch`` /
``end_batch``) and notes it; :func:`probe.runs.analysis.analyze` refuses it when blocks are demanded.

Merging is addition (or union), so batches, processes and machines combine the same way. The
per-head statistics (:class:`probe.measures.stats.HeadStatistics`), the example maps
(:class:`ExampleMaps`) and the token counts (:class:`TokenCounts`) are accumulators; so are
the coreference and syntax scores, head distances, pattern types and health checks
(docs/contributing.md says how to write one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..architectures import MODEL_KINDS
from ..errors import UnsupportedAnalysisError
from ..loading.seq2seq import sides
from ..sites import KINDS, Site
from ..text.inputs import Batch, Text


def present_heads(probs: torch.Tensor) -> torch.Tensor:
    """[heads] bool on ``probs``' device: the heads that have attention probabilities in ``probs``
    [batch, heads, query, key].

    A model whose heads were physically removed (:mod:`probe.pruning`) hands accumulators NaN
    probabilities for those heads (:func:`probe.runs.analysis.run`, original numbering); every other
    head has a number at the first query row's first key, which every row may see. Accumulators
    leave the other heads' values out of what they report (NaN, not a made-up number).
    """
    return ~torch.isnan(probs[0, :, 0, 0])


def sum_device(device: torch.device | str) -> torch.device:
    """Where running float64 sums of probabilities that sit on ``device`` are kept: that device (no
    copy to the CPU per batch), except an MPS device, which has no float64: the CPU there.

    Accumulators keep their state where their inputs are (:meth:`Accumulator.follow`) and move it to
    the CPU only when a result leaves (``result``, ``means``, pickling for other processes).
    """
    device = torch.device(device)
    return torch.device("cpu") if device.type == "mps" else device


class Accumulator:
    """Base class: override :meth:`update`, :meth:`merge` and :meth:`result`.

    What an analysis measures is said here, once, on its class: ``model_kinds`` and ``site_kinds``
    (:meth:`refusal` reads them; :func:`probe.runs.analysis.run` and :func:`probe.runs.analysis.analyze`
    refuse an accumulator that does not fit the model, and the CLI leaves it out).

    Attributes:
        name: key of the result in :attr:`probe.records.AnalysisResult.results`.
        title: what the analysis is called in messages.
        model_kinds: the kinds of model it measures (:data:`probe.architectures.MODEL_KINDS`).
        site_kinds: the kinds of site it reads (``"self"``, ``"cross"``).
    """

    name: str = "accumulator"
    title: str = "this analysis"
    model_kinds: tuple[str, ...] = MODEL_KINDS
    site_kinds: tuple[str, ...] = KINDS
    #: attributes not sent to other processes when accumulators are gathered (a tokenizer, a
    #: model): merging reads only the measured state.
    transient: tuple[str, ...] = ()
    #: :func:`probe.runs.analysis.run` hooks the value projections and calls ``update(site, probs, batch,
    #: values=...)`` with the site's :class:`probe.capture.values.ValueNorms`.
    reads_values: bool = False
    #: :func:`probe.runs.analysis.run` calls ``update(site, probs, batch, scores=...)`` with the
    #: :class:`probe.capture.op.Scores` the probabilities were computed from (or None).
    reads_scores: bool = False
    #: :meth:`update` takes blocks of query rows, ``update(site, probs, batch, rows=(i0, i1))`` (the
    #: module docstring's protocol), and its results equal the whole-map ones within 1e-5 (float32).
    #: False: whole maps only (left out of block-captured batches, with a note).
    row_blocks: bool = False

    #: tensor attributes kept on the device of the probabilities (:meth:`follow`), moved there on
    #: the first update; on the CPU when pickled.
    on_device: tuple[str, ...] = ()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for key in self.transient:
            state[key] = None
        for key, value in state.items():  # another process may have another device: the CPU travels
            if isinstance(value, torch.Tensor):
                state[key] = value.cpu()
        return state

    def follow(self, device: torch.device | str) -> None:
        """On the first update: move the :attr:`on_device` tensors to :func:`sum_device` of ``device``
        (the device of the probabilities just handed in), so that no batch copies its sums to the
        CPU. Later calls do nothing: the layers of a model spread over several devices (a device
        map) add into the state where it is, each site's small sums moved there."""
        if self.__dict__.get("_followed"):
            return
        self._followed = True
        dev = sum_device(device)
        for key in self.on_device:
            value = getattr(self, key, None)
            if isinstance(value, torch.Tensor) and value.device != dev:
                setattr(self, key, value.to(dev))

    @classmethod
    def refusal(cls, lm) -> str | None:
        """Why this analysis cannot measure ``lm`` (a :class:`~probe.loading.models.LoadedModel`): a kind of
        model or a kind of site it does not cover, in one line; None where it can."""
        if lm.kind not in cls.model_kinds:
            return (f"{cls.title} is for {' and '.join(cls.model_kinds)} models; {lm.name} is "
                    f"{_article(lm.kind)} {lm.kind} model")
        other = sorted({s.kind for s in lm.sites} - set(cls.site_kinds))
        if other:
            return (f"{cls.title} is for {' and '.join(cls.site_kinds)}-attention sites; {lm.name} has "
                    f"{other[0]}-attention sites")
        return None

    def begin_batch(self, batch: Batch) -> None:
        """Called before the forward pass of each batch."""

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, rows: tuple[int, int] | None = None) -> None:
        """Fold in one site's attention probabilities [batch, heads, query, key] for ``batch``
        (with ``rows`` = (i0, i1), only where :attr:`row_blocks`: query rows i0..i1-1 of the map)."""
        raise NotImplementedError

    def end_batch(self, batch: Batch) -> None:
        """Called after the forward pass of each batch."""

    def merge(self, other: Accumulator) -> Accumulator:
        """Add ``other`` (same kind, same model) into this one, in place; return self."""
        raise NotImplementedError

    def result(self):
        """What was measured."""
        raise NotImplementedError

    def columns(self):
        """Per-head columns for ``heads.csv`` (a DataFrame with ``layer`` and ``head`` plus its own
        columns), or None. :func:`probe.runs.analysis.analyze` merges them into ``result.heads``."""
        return None

    def head_labels(self) -> list[tuple[int, int, str, float]]:
        """Labels this analysis gives heads: ``(layer, head, label, strength)`` with strength the
        ratio of the head's value to the label's bar (>= 1 when it holds; the primary label is the
        strongest). Default: none."""
        return []


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def check_supported(lm, accumulators) -> None:
    """Refuse accumulators (or their classes) that do not fit ``lm`` (:meth:`Accumulator.refusal`).

    Raises:
        UnsupportedAnalysisError: the first refusal, in one line.
    """
    for acc in accumulators:
        why = acc.refusal(lm) if hasattr(acc, "refusal") else None
        if why is not None:
            raise UnsupportedAnalysisError(why)


def check_block_ready(accumulators, query_block: int | None) -> None:
    """Refuse accumulators that need whole attention maps when every batch is to be captured in
    blocks (``query_block`` >= 1; None and 0 refuse nothing).

    Raises:
        UnsupportedAnalysisError: the first accumulator without ``row_blocks``, named.
    """
    if not query_block:
        return
    for acc in accumulators:
        if not getattr(acc, "row_blocks", False):
            title = getattr(acc, "title", type(acc).__name__)
            raise UnsupportedAnalysisError(f"{title} needs whole attention maps and cannot run with a query block "
                                           f"of {query_block} rows; leave the query block automatic or 0, or leave "
                                           "it out")


@dataclass
class Example:
    """One example sequence with its attention maps, cropped to what is shown.

    Attributes:
        index: position of the text in the corpus.
        text: the input text.
        ids: token ids of the whole sequence as analysed (special tokens included).
        offsets: characters each token covers in ``text``.
        special: per token, whether the tokenizer added it.
        probs: [sites, heads, n, n] float32 attention probabilities of the first n = min(T, crop)
            tokens (query rows, key columns), in site order.
        truncated: the text was cut to the model's token limit.
        word_ids: per token, the index of its word (:attr:`probe.text.inputs.Batch.word_ids`; -1 for
            special and whitespace-only tokens), or None where unknown.
        labels: readable token labels (:func:`probe.text.tokens.display_tokens`) where they were stored
            with the example (a run folder read back by :func:`probe.compare.load_run`), else None.
        target: encoder-decoder models: the decoder's side, ``{"text", "ids", "offsets",
            "special"}`` (the decoder start token first); ``probs`` then holds the encoder's sites.
        decoder: encoder-decoder models: site name -> [heads, t, t] (decoder self-attention) or
            [heads, t, s] (cross-attention: target queries, source keys) probabilities, cropped.
        pair: the second segment of a sentence-pair input (``--pairs`` on an encoder or decoder),
            else None.
    """

    index: int
    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    special: list[bool]
    probs: np.ndarray
    truncated: bool = False
    word_ids: list[int] | None = None
    labels: list[str] | None = None
    target: dict | None = None
    decoder: dict | None = None
    pair: str | None = None

    def as_text(self) -> Text:
        """The input as it was analysed (its second segment or its target included), for a view
        that runs the model on it again."""
        target = (self.target or {}).get("text")
        return Text(self.text, pair=self.pair) if target is None else Text(self.text, target=target)

    @property
    def n_tokens(self) -> int:
        """Tokens in the sequence as analysed (may exceed the cropped map)."""
        return len(self.ids)

    @property
    def cropped(self) -> bool:
        """The maps cover fewer tokens than the sequence."""
        return self.probs.shape[-1] < len(self.ids)


class ExampleMaps(Accumulator):
    """Keeps the attention maps of a few chosen texts, cropped to their first ``crop`` tokens.

    Memory is bounded by what is shown: sites x heads x crop x crop floats per
    example, whatever the text's length. ``crop=None`` keeps whole maps (Python API only: a
    1,024-token SmolLM2 text then takes 30 x 9 x 1024^2 x 4 bytes = 1.1 GB).

    Args:
        indices: corpus positions of the texts to keep (e.g. ``range(3)``).
        sites: the model's sites, in order.
        crop: tokens kept per side (default 64, what the report draws), or None for all.
    """

    name = "examples"
    title = "example maps"
    row_blocks = True

    def __init__(self, indices, sites: list[Site], crop: int | None = 64) -> None:
        self.indices = set(int(i) for i in indices)
        self.sites = list(sites)
        self._site_pos = {s: i for i, s in enumerate(self.sites)}
        self.crop = crop
        self._maps: dict[int, list[np.ndarray | None]] = {}
        self._meta: dict[int, dict] = {}
        self._rows: list[tuple[int, int, int]] = []

    def begin_batch(self, batch: Batch) -> None:
        self._rows = []
        lengths = batch.lengths.tolist()
        for row, idx in enumerate(batch.index):
            if idx in self.indices and idx not in self._meta:
                n = lengths[row] if self.crop is None else min(lengths[row], self.crop)
                self._rows.append((row, idx, n))
                self._maps[idx] = [None] * len(self.sites)
                self._meta[idx] = {
                    "text": batch.texts[row].text, "ids": batch.input_ids[row, :lengths[row]].tolist(),
                    "offsets": [tuple(o) for o in batch.offsets[row, :lengths[row]].tolist()],
                    "special": batch.special[row, :lengths[row]].tolist(), "truncated": batch.truncated[row],
                    "word_ids": batch.word_ids[row, :lengths[row]].tolist(), "pair": batch.texts[row].pair,
                }
                if batch.target is not None:
                    t, m = batch.target, int(batch.target.lengths[row])
                    self._meta[idx]["target"] = {
                        "text": t.texts[row].text, "ids": t.input_ids[row, :m].tolist(),
                        "offsets": [tuple(o) for o in t.offsets[row, :m].tolist()],
                        "special": t.special[row, :m].tolist(),
                    }

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, rows: tuple[int, int] | None = None) -> None:
        """Keep the cropped map of each chosen text in ``batch``: probs [batch, heads, query, key];
        with ``rows`` = (i0, i1) a block of query rows, of which only those inside the crop are kept."""
        if not self._rows:
            return
        queries, keys = sides(site, batch)
        q_len, k_len = queries.lengths.tolist(), keys.lengths.tolist()
        i0, i1 = (0, probs.shape[2]) if rows is None else rows
        for row, idx, _ in self._rows:
            nq, nk = q_len[row], k_len[row]
            if self.crop is not None:
                nq, nk = min(nq, self.crop), min(nk, self.crop)
            pos = self._site_pos[site]
            if rows is None:
                self._maps[idx][pos] = probs[row, :, :nq, :nk].float().cpu().numpy()
                continue
            if i0 >= nq:  # a block below the crop
                continue
            if self._maps[idx][pos] is None:
                self._maps[idx][pos] = np.zeros((probs.shape[1], nq, nk), dtype=np.float32)
            hi = min(i1, nq)
            self._maps[idx][pos][:, i0:hi] = probs[row, :, :hi - i0, :nk].float().cpu().numpy()

    def merge(self, other: ExampleMaps) -> ExampleMaps:
        for idx, maps in other._maps.items():
            if idx not in self._maps:
                self._maps[idx], self._meta[idx] = maps, other._meta[idx]
        self.indices |= other.indices
        return self

    def result(self) -> list[Example]:
        """The kept examples, in corpus order."""
        out = []
        for idx in sorted(self._maps):
            m = self._meta[idx]
            maps = self._maps[idx]
            encoder = [p for s, p in zip(self.sites, maps) if s.stack == "encoder"] if "target" in m else maps
            decoder = {s.name: p for s, p in zip(self.sites, maps) if s.stack == "decoder"} if "target" in m else None
            out.append(Example(idx, m["text"], m["ids"], m["offsets"], m["special"], np.stack(encoder),
                               m["truncated"], m["word_ids"], target=m.get("target"), decoder=decoder,
                               pair=None if "target" in m else m.get("pair")))
        return out


@dataclass
class Counts:
    """What went through the loop.

    Attributes:
        sequences: sequences analysed.
        tokens: real tokens, special tokens included.
        truncated: sequences cut to the limit.
        batches: batches run.
        unknown: tokens that are the tokenizer's unknown-word token.
        longest: tokens of the longest sequence.
    """

    sequences: int = 0
    tokens: int = 0
    truncated: int = 0
    batches: int = 0
    unknown: int = 0
    longest: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"sequences": self.sequences, "tokens": self.tokens, "truncated": self.truncated,
                "batches": self.batches, "unknown_tokens": self.unknown, "longest": self.longest, **self.extra}


class TokenCounts(Accumulator):
    """Counts sequences, tokens, truncations and unknown-word tokens (for the run's record)."""

    name = "counts"
    title = "token counts"
    row_blocks = True

    def __init__(self, unk_id: int | None = None) -> None:
        self.unk_id = unk_id
        self.counts = Counts()

    def begin_batch(self, batch: Batch) -> None:
        c = self.counts
        lengths = batch.lengths
        c.sequences += len(batch)
        c.tokens += int(lengths.sum())
        c.truncated += sum(batch.truncated)
        c.batches += 1
        c.longest = max(c.longest, int(lengths.max()))
        if self.unk_id is not None:
            c.unknown += int(((batch.input_ids == self.unk_id) & batch.real).sum())
        if batch.target is not None:  # encoder-decoder: the decoder's tokens (start token included)
            c.extra["target_tokens"] = c.extra.get("target_tokens", 0) + int(batch.target.lengths.sum())

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, rows: tuple[int, int] | None = None) -> None:
        pass

    def merge(self, other: TokenCounts) -> TokenCounts:
        a, b = self.counts, other.counts
        a.sequences += b.sequences
        a.tokens += b.tokens
        a.truncated += b.truncated
        a.batches += b.batches
        a.unknown += b.unknown
        a.longest = max(a.longest, b.longest)
        for key, value in b.extra.items():
            a.extra[key] = a.extra.get(key, 0) + value
        return self

    def result(self) -> Counts:
        return self.counts
