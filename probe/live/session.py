"""A live model session: one loaded model answering, as JSON-ready records, the questions of the live page
and the notebook explorer (:mod:`probe.live.server`, :mod:`probe.live.widget`).

Every number is the library's: the session only calls library functions and packs their results.

- :meth:`LiveSession.edit`: a text's tokens, every head's statistics and label for that text
  (:func:`probe.analyze` on the one text), the head view of one layer and the model view of every layer
  (:func:`probe.view.data.view_data`, :func:`probe.view.modelview.model_view_data`, from the maps the
  analysis kept: one forward pass).
- :meth:`LiveSession.head`: one head's attention steps (:func:`probe.measures.steps.heads_steps`, drawn by
  the step view) and ``why`` for a query row (:func:`probe.qk.run.measure`: :func:`probe.why` and its
  table of the largest (query source, key source) pairs, with the check: their sum against the model's
  score), with the heads' labels beside it as ``probe why`` shows them (the head's own and each source
  head's: :func:`probe.qk.labels.head_labels`, probe's analysis of its built-in sample texts, cached per
  model). The default row is the last token's, or on an encoder with its masked-LM head whose text holds
  the mask token, the first mask's: the position whose predictions the output panel shows.
- :meth:`LiveSession.ablate`: heads switched off (zero or mean ablation, :func:`probe.effects.ablation.ablating`
  at the heads' outputs before the output projection; Michel et al. 2019), the model's output before and
  after (a decoder's next-token probabilities, a masked-LM encoder's predictions at its first [MASK], a
  bare encoder's sentence embedding: cosine to the unablated one) and the maps downstream: one forward
  pass of the ablated text, the output before kept from the text's edit (the same analyze pass) or its
  last ablation; a text seen by neither runs two copies in one pass, the first unablated.
- :meth:`LiveSession.patch`: a corrupted text beside the clean one: every head's activation-patching
  effect as ``probe patch`` computes it (:func:`probe.effects.patching.patch_heads`, denoising; Meng et
  al. 2022), the answer and the wrong answer being the two texts' top next tokens unless given.

The caps are a :class:`~probe.settings.LiveSettings` (``probe live``'s options). Each method checks its
arguments with the route's request settings (:mod:`probe.settings.live`: ``top`` and ``query`` are
``probe why``'s fields, the ablation is checked as ``probe effects --ablation``), then what needs the model
with the library's own lines (a layer or head out of range as :func:`probe.causal.heads.normalize_heads`
says it, a query row past the text as :func:`probe.why` says it): a value out of range raises
:class:`~probe.errors.InputError` (the server answers 400 with its line), the same line from the command
line, the Python call and the server.

On an encoder with its masked-LM head the mask token typed is the mask for every answer (the grid, the
views, the output panel, the steps, ``why`` and patching: texts passed as
``probe.Text(text, parse_special_tokens=True)``), so that a position is the same token in every panel.
Model work is serialized: one forward pass at a time (:attr:`LiveSession.lock`), and :class:`Latest`
drops a request that a newer one from the same page has made stale.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import bounds
from ..architectures.modules import base_model
from ..capture.hooks import Hooks
from ..capture.maps import attention_hooks, encode, forward
from ..capture.values import shared_grams
from ..causal.heads import head_ranges, normalize_heads
from ..causal.objectives import head_kind, mean_pool, sentence_embedding
from ..effects.ablation import ablating, check_model, head_means, repeat_batch
from ..effects.patching import check_patchable, patch_heads
from ..entries.notebook import batch_sides
from ..errors import InputError, ProbeError, UnsupportedAnalysisError
from ..loading import models as loading  # load_model and peek_config read as attributes: a test may stand in for them
from ..measures.steps import heads_steps
from ..qk.labels import head_labels
from ..qk.run import LABELS_NOTE, measure
from ..qk.table import REST
from ..records import AnalysisResult
from ..runs.analysis import analyze
from ..runs.overlap import serial
from ..settings import AblateRequest, EditRequest, HeadRequest, LiveSettings, PatchRequest
from ..sites import head_name
from ..text.corpus import sample_texts
from ..text.pairfile import Pair
from ..text.sequence import Text
from ..view.html import example_maps, result_view, site_labels, text_view
from ..view.modelview import model_view_data
from ..view.stepview import STEP_MAX_TOKENS, step_view_data
from .work import Work

#: Most characters of a text the session takes (the page's box says so; ``LiveSettings.max_chars``' default).
MAX_CHARS = LiveSettings().max_chars
#: Most tokens of a text the session runs (the step view holds at most STEP_MAX_TOKENS).
MAX_TOKENS = 128
#: Next-token (or [MASK]) predictions listed before and after an ablation.
TOP_K = 8
#: Texts whose analysis the session keeps (the last few edits: a head click or an ablation reuses it).
KEPT = 4
#: Columns of the heads table that are not per-head statistics.
NOT_STATISTICS = ("stack", "kind", "layer", "head", "label", "labels", "cluster", "group", "window")


def two_stack_refusal(name: str) -> str:
    """The line that refuses an encoder-decoder model (the live page draws one-stack models)."""
    return (f"{name} is an encoder-decoder model; probe live draws encoders and decoders "
            "(use probe.show(lm, probe.Text(source, target=...)) in a notebook)")


def media_refusal(name: str) -> str:
    """The line that refuses an image or speech model (the live page reads typed text)."""
    return (f"{name} is an image or speech model; probe live reads typed text "
            "(use probe analyze --image FILE or --audio FILE for its attention)")


def check_live_config(config, name: str) -> None:
    """Refuse what the config alone decides, before the weights load (``config`` None: nothing to read).

    Raises:
        InputError: an encoder-decoder model (:func:`two_stack_refusal`).
    """
    if config is not None and getattr(config, "is_encoder_decoder", False):
        raise InputError(two_stack_refusal(name))


def check_live_model(name: str) -> None:
    """Refuse a model by name from its config alone, before its weights load (``probe live`` calls this before
    it binds its port and loads the model; a name whose config cannot be read locally is checked by
    :class:`LiveSession` once loaded).

    Raises:
        InputError: an encoder-decoder model (:func:`two_stack_refusal`).
    """
    check_live_config(loading.peek_config(name), name)


def open_session(name: str, settings: LiveSettings | None = None, *, dtype: str | None = None,
                 device: str | None = None) -> LiveSession:
    """Load the model ``name`` (:func:`probe.loading.models.load_model` with ``dtype`` and ``device``) and open a
    :class:`LiveSession` on it with ``settings``: what ``probe live`` serves.

    Raises:
        InputError: as :func:`check_live_model` (checked first, before the weights load), as
            :func:`probe.loading.models.load_model` (a name it cannot load) and as :class:`LiveSession` (an image
            or speech model, a cap out of bounds).
    """
    check_live_model(name)
    return LiveSession(loading.load_model(name, dtype=dtype, device=device), settings)


def _finite(x) -> float | None:
    """A float for JSON (NaN and infinities: None)."""
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass
class Latest:
    """The newest sequence number of each (page, kind) of request: a request whose number is below the
    newest when its turn comes is stale (the page has edited since) and is dropped unanswered.

    Thread-safe; a page is any string the client picks (the page's random id)."""

    newest: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, page: str, kind: str, seq: int) -> None:
        """Record that request ``seq`` of ``page``'s ``kind`` arrived."""
        with self.lock:
            key = (page, kind)
            self.newest[key] = max(seq, self.newest.get(key, seq))
            if len(self.newest) > 4096:  # forget the oldest pages
                for old in list(self.newest)[:1024]:
                    del self.newest[old]

    def stale(self, page: str, kind: str, seq: int) -> bool:
        """Whether a newer request of ``page``'s ``kind`` has arrived since ``seq``."""
        with self.lock:
            return self.newest.get((page, kind), seq) > seq

    def seq(self, page: str, kind: str) -> int | None:
        """The newest sequence number of ``page``'s ``kind`` arrived so far (None: none yet)."""
        with self.lock:
            return self.newest.get((page, kind))


class LiveSession:
    """One loaded model answering the live page (every public method returns a JSON-ready dict).

    Args:
        lm: a :class:`~probe.loading.models.LoadedModel` (one-stack: an encoder or a decoder).
        settings: a :class:`~probe.settings.LiveSettings` (its caps: ``max_chars`` characters, ``max_tokens``
            tokens, default :data:`MAX_TOKENS` or the model's limit where lower), or None and its fields as
            keywords (``LiveSession(lm, max_chars=500)``).

    Raises:
        InputError: an encoder-decoder model (the live page draws one-stack models), an image or speech
            model (it reads typed text), a cap below 1 (2 tokens)
            or above the model's limit, an unknown setting.
    """

    def __init__(self, lm, settings: LiveSettings | None = None, **caps) -> None:
        if lm.kind == "encoder-decoder":
            raise InputError(two_stack_refusal(lm.name))
        if hasattr(lm.tokenizer, "discovery_inputs"):  # an image or speech processor (probe.capture.discover)
            raise InputError(media_refusal(lm.name))
        if settings is not None and caps:
            raise InputError("give the live settings as a LiveSettings or as keywords, not both")
        self.settings = settings if settings is not None else LiveSettings.from_mapping(caps)
        self.lm = lm
        #: what the output panel shows: "next-token", "masked-lm" or "embedding"
        self.output_kind = self._output_kind(head_kind(lm))
        # a masked-LM encoder reads the mask token typed as its mask (as probe patch reads its prompts)
        self.parse_special = self.output_kind == "masked-lm"
        self.max_chars = self.settings.max_chars
        self.max_tokens = (min(MAX_TOKENS, lm.max_length) if self.settings.max_tokens is None
                           else bounds.max_length(self.settings.max_tokens, lm.max_length, "--max-tokens"))
        self.lock = threading.Lock()
        self.latest = Latest()
        self.work = Work()  # what runs now, read without the lock (the page's progress line)
        self._analyses: OrderedDict[str, AnalysisResult] = OrderedDict()
        self._ids: OrderedDict[str, list[int]] = OrderedDict()  # token_ids of the last texts
        self.sites = lm.sites  # the model's sites (lm.sites builds the list at every call)
        # per text: (its input ids [1, T], the unablated model's output as the output panel compares it)
        self._clean: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._means: torch.Tensor | None = None
        self._grams: dict = {}  # each output projection's G_h, computed at the first edit (shared_grams)
        self._labels: tuple[dict, str | None] | None = None  # the why panel's head labels (labels, refusal)

    # ------------------------------------------------------------------ checks
    @property
    def n_layers(self) -> int:
        return len(self.sites)

    @property
    def n_heads(self) -> int:
        return self.lm.geometry.n_heads

    def check_text(self, text, what: str = "text") -> str:
        """``text`` as a string of at most :attr:`max_chars` characters and :attr:`max_tokens` tokens
        (``probe live --max-chars``, ``--max-tokens``).

        Raises:
            InputError: not a string, empty, too long (saying the cap).
        """
        if not isinstance(text, str):
            raise InputError(f"{what} must be a string, got {type(text).__name__}")
        bounds.texts(text, what)
        if len(text) > self.max_chars:
            raise InputError(f"the {what} is {len(text):,} characters; the live page takes at most {self.max_chars:,}")
        n = self.n_tokens(text)
        if n > self.max_tokens:
            raise InputError(f"the {what} is {n} tokens; the live page takes at most {self.max_tokens}")
        return text

    def check_layer(self, layer) -> int:
        """A layer (site index) of the model.

        Raises:
            InputError: not an integer, or out of range (as :func:`probe.causal.heads.normalize_heads` says it).
        """
        layer = bounds.positive_int("layer", layer, 0)
        if layer >= self.n_layers:
            raise InputError(f"layer {layer} out of range: the model has {head_ranges(self.n_layers, self.n_heads)}")
        return layer

    def check_head(self, layer, head) -> tuple[int, int]:
        """(layer, head) of the model.

        Raises:
            InputError: either out of range or not an integer (the line of
                :func:`probe.causal.heads.normalize_heads`, which ``probe why --head`` gives too).
        """
        layer, head = bounds.positive_int("layer", layer, 0), bounds.positive_int("head", head, 0)
        (layer, (head,)), = normalize_heads([(layer, head)], self.n_layers, self.n_heads).items()
        return layer, head

    def check_heads(self, heads) -> list[tuple[int, int]]:
        """A list of [layer, head] pairs, each checked, each once, in order.

        Raises:
            InputError: not a list of pairs (:func:`probe.settings.live.head_pairs`), or a head out of range.
        """
        return [self.check_head(*pair) for pair in AblateRequest.check_field("heads", heads)]

    def as_read(self, text: str) -> Text:
        """``text`` as every answer reads it: on an encoder with its masked-LM head, its typed special tokens
        (the mask) are special tokens (``Text(..., parse_special_tokens=True)``)."""
        return Text(text, parse_special_tokens=self.parse_special)

    def token_ids(self, text: str) -> list[int]:
        """The token ids of ``text`` as the model reads it (special tokens included; typed ones as
        :meth:`as_read` reads them), not truncated (the last texts' kept: every answer checks its text)."""
        ids = self._ids.get(text)
        if ids is None:
            ids = self._ids[text] = list(self.lm.tokenizer(text, split_special_tokens=not self.parse_special)
                                         ["input_ids"])
            while len(self._ids) > 4 * KEPT:
                self._ids.popitem(last=False)
        return list(ids)

    def n_tokens(self, text: str) -> int:
        """Tokens of ``text`` as the model reads it (special tokens included)."""
        return len(self.token_ids(text))

    def mask_position(self, text: str) -> int | None:
        """The position of the first mask token of ``text`` on an encoder with its masked-LM head (None
        elsewhere, or without one): the row the output panel predicts at."""
        return self._first_mask(self.token_ids(text)) if self.parse_special else None

    def _first_mask(self, ids: list[int]) -> int | None:
        """The index of the first mask token in ``ids`` (None: the tokenizer has none, or ``ids`` holds none)."""
        mask_id = self.lm.tokenizer.mask_token_id
        return ids.index(mask_id) if mask_id is not None and mask_id in ids else None

    # ------------------------------------------------------------------ the model's answers
    def progress(self, page: str | None = None) -> dict:
        """What the session computes now, for ``page``'s progress line (:meth:`probe.live.work.Work.snapshot`);
        read without :attr:`lock`, so answered while the model works."""
        return self.work.snapshot(page)

    def info(self) -> dict:
        """What the page needs before the first edit: the model, its kind, layers, heads, caps, output, and the line
        saying why patching (``patching``) or switching heads off (``ablation``) does not run on it (None where it
        does)."""
        kind = head_kind(self.lm)
        return {"model": self.lm.name, "kind": self.lm.kind, "layers": self.n_layers, "heads": self.n_heads,
                "headNames": [[head_name(s.layer, h) for h in range(self.n_heads)] for s in self.sites],
                "maxChars": self.max_chars, "maxTokens": self.max_tokens, "output": self._output_kind(kind),
                "patching": self._patch_refusal(), "ablation": self._ablation_refusal()}

    def analysis(self, text: str) -> AnalysisResult:
        """:func:`probe.analyze` of ``text`` alone, whole maps kept (the last :data:`KEPT` texts cached)."""
        if text in self._analyses:
            self._analyses.move_to_end(text)
            return self._analyses[text]
        seen: dict = {}
        # the model's own output of the same pass, kept for an ablation of this text (its "before")
        module = base_model(self.lm.model) if self.output_kind == "embedding" else self.lm.model
        # G_h of every layer once, not at every edit; one short text: the serial loop (probe.runs.overlap.serial)
        with Hooks() as hooks, shared_grams(self._grams), serial():
            hooks.forward(module, lambda m, args, kwargs, out: seen.update(ids=kwargs.get("input_ids"), out=out),
                          with_kwargs=True)
            result = analyze(self.lm, [text], n_examples=1, example_tokens=None, n_clusters=1,
                             max_length=self.max_tokens, parse_special_tokens=self.parse_special)
        self._keep_clean(text, seen.get("ids"), seen.get("out"))
        self._analyses[text] = result
        while len(self._analyses) > KEPT:
            self._analyses.popitem(last=False)
        return result

    def _keep_clean(self, text: str, ids, out) -> None:
        """Keep the unablated model's output of ``text`` (``out``: the model's output, or the bare model's
        for the embedding, of input ids ``ids`` [1, T]) as :meth:`ablate` compares it; nothing where the
        pass was not one whole sequence with its whole output (a block-captured pass keeps fewer logits)."""
        name = "last_hidden_state" if self.output_kind == "embedding" else "logits"
        tensor = getattr(out, name, None)
        if not isinstance(ids, torch.Tensor) or not isinstance(tensor, torch.Tensor) or ids.dim() != 2 \
                or len(ids) != 1 or tensor.shape[:2] != ids.shape:
            return
        ids = ids.detach().cpu()
        reference = self._reference(tensor.detach(), ids, torch.ones_like(ids, dtype=torch.bool))
        if reference is not None:
            self._clean[text] = (ids, reference.clone())
            while len(self._clean) > KEPT:
                self._clean.popitem(last=False)

    def _reference(self, output: torch.Tensor, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor | None:
        """What the output panel compares of each row of a pass: the logits at the position it predicts at
        ([rows, vocab]: a decoder's last token, a masked-LM encoder's first mask token), or the sentence
        embedding (:func:`probe.causal.objectives.mean_pool` of the last hidden states, [rows, d_model]); None:
        a masked-LM text without its mask (nothing to compare).

        Args:
            output: [rows, T, vocab] logits, or [rows, T, d_model] the bare model's last hidden states
                (embedding: already pooled [rows, d_model] is returned as it is).
            ids: [rows, T] input ids (every row the same text). real: [rows, T] bool, the real tokens.
        """
        if self.output_kind == "embedding":
            return output if output.dim() == 2 else mean_pool(output, real)
        at = self._position(ids[0, : int(real[0].sum())].tolist())
        return None if at is None else output[:, at]

    def _position(self, ids: list[int]) -> int | None:
        """The position whose predictions the output panel shows: the last token's (a decoder), the first
        mask token's (a masked-LM encoder; None without one)."""
        return len(ids) - 1 if self.output_kind == "next-token" else self._first_mask(ids)

    def edit(self, text, layer=0) -> dict:
        """A text's tokens, the grid (every head's label and statistics for this text), the head view of
        ``layer`` and the model view (every layer's thumbnails), from one :func:`probe.analyze` pass.

        Returns:
            ``{"tokens", "grid": {"labels": layers x heads, "statistics": {name: layers x heads}},
            "headView": view_data's dict (``layer`` only), "modelView": model_view_data's dict}``.

        Raises:
            InputError: a bad text or layer (:class:`~probe.settings.EditRequest`, then the model's ranges).
        """
        req = EditRequest(text=text, layer=layer)
        text, layer = self.check_text(req.text), self.check_layer(req.layer)
        result = self.analysis(text)
        hv = result_view(result, tokenizer=self.lm.tokenizer, layers=[layer], layer=layer)
        hv.data["title"] = f"{self.lm.name}: layer {layer}, {len(hv.data['tokens'])} tokens"
        maps, sites = example_maps(result.examples[0], self.lm.kind != "encoder")
        mv = model_view_data(maps, sites, head_labels=site_labels(result.heads, sites), shown=[layer])
        return {"text": text, "layer": layer, "tokens": hv.data["tokens"], "grid": self.grid(result),
                "headView": hv.data, "modelView": mv}

    def grid(self, result: AnalysisResult) -> dict:
        """Every head's primary label, all its labels and every statistic of ``result``'s heads table,
        as layers x heads arrays (NaN as None)."""
        heads = result.heads
        L, H = self.n_layers, self.n_heads
        # each head's cell, read once: (layer, head) -> the row (a head twice: its last row, as before)
        where = np.asarray(heads["layer"], dtype=np.int64) * H + np.asarray(heads["head"], dtype=np.int64)

        def cells(values: np.ndarray) -> np.ndarray:
            out = np.full(L * H, None, dtype=object)
            out[where] = values
            return out.reshape(L, H)

        def texts(column):
            return cells(np.array([str(v) for v in heads[column]], dtype=object)).tolist()

        def numbers(column):  # float64 as _finite reads them (NaN and infinities: None)
            v = np.asarray(heads[column], dtype=np.float64)
            return cells(np.where(np.isfinite(v), v.astype(object), None)).tolist()

        stats = [c for c in heads.columns if c not in NOT_STATISTICS and np.issubdtype(heads[c].dtype, np.number)]
        return {"labels": texts("label"), "allLabels": texts("labels"),
                "statistics": {c: numbers(c) for c in stats}}

    def head(self, text, layer, head, query=None, top: int = 5) -> dict:
        """One head's attention steps (every query row; the step view's record, opened at ``query``) and
        ``why`` for ``query`` with its ``top`` keys (``probe why --query``, ``--top``).

        The default query is the last token's row, or on an encoder with its masked-LM head whose text holds
        the mask token, the first mask's (:meth:`mask_position`: the row the output panel predicts at); the
        steps and ``why`` read the mask as the mask (:meth:`as_read`), so the row is the same token in
        every panel.

        Returns:
            ``{"layer", "head", "query", "queryFrom": "given" | "last" | "mask", "steps": step_view_data's dict
            or None, "stepsRefusal": str or None, "why": dict or None, "whyRefusal": str or None}``: a model
            type the steps or ``why`` do not cover gets the line saying why in place of the record. ``why``
            is :func:`why_record`'s (the head's ``label``, each pair's ``query_label`` and ``key_label``:
            :meth:`head_labels`) with ``labelsRefusal`` (None, or the line saying why there are no labels).

        Raises:
            InputError: a bad text, head, query position or top (:class:`~probe.settings.HeadRequest`: the
                lines of ``probe why``; then the model's ranges, as ``probe why`` says them).
        """
        req = HeadRequest(text=text, layer=layer, head=head, query=query, top=top)
        text = self.check_text(req.text)
        layer, head = self.check_head(req.layer, req.head)
        n = self.n_tokens(text)
        query, where = req.query, "given"
        if query is None:
            mask = self.mask_position(text)
            query, where = (n - 1, "last") if mask is None else (mask, "mask")
        if not 0 <= query < n:  # probe.why's line (probe.qk.score.why)
            raise InputError(f"query {query!r} out of range: the text has {n} tokens, rows 0-{n - 1}")
        out: dict = {"layer": layer, "head": head, "query": query, "queryFrom": where, "steps": None,
                     "stepsRefusal": None, "why": None, "whyRefusal": None}
        read = self.as_read(text)
        try:
            if n > STEP_MAX_TOKENS:
                raise InputError(f"the step view holds at most {STEP_MAX_TOKENS} tokens")
            # the step view draws the from-scratch steps; the model's own probabilities (a second pass) it does not
            st = heads_steps(self.lm, read, [(layer, head)], self.max_tokens, model_probs=False)[0]
            out["steps"] = step_view_data(st, site_index=layer, query=query)
        except ProbeError as e:  # InputError included: a type whose steps are refused says so in the panel
            out["stepsRefusal"] = str(e)
        try:
            run = measure(self.lm, read, (layer, head), query, req.top)
        except ProbeError as e:
            out["whyRefusal"] = str(e)
            return out
        run.labels, refusal = self.head_labels()
        out["why"] = why_record(run)
        out["why"]["labelsRefusal"] = refusal
        return out

    def head_labels(self) -> tuple[dict[str, str], str | None]:
        """Head name -> label as ``probe why`` shows them beside the sources (:func:`probe.qk.labels.head_labels`:
        probe's analysis of its built-in sample texts, plus the circuit probe on decoders; computed once per
        model and cached on disk, read once per session), and None; or ``({}, the line saying why not)``
        where that analysis is refused on this model."""
        if self._labels is None:
            try:
                self._labels = head_labels(self.lm), None
            except ProbeError as e:
                self._labels = {}, f"no head labels: {e}"
        return self._labels

    # ------------------------------------------------------------------ ablation
    def _output_kind(self, kind: str | None) -> str:
        if self.lm.kind == "decoder" and kind == "causal-lm":
            return "next-token"
        if kind == "masked-lm":
            return "masked-lm"
        return "embedding"

    def means(self) -> torch.Tensor:
        """Each head's mean output over the built-in sample text (the reference of mean ablation),
        computed once (:func:`probe.effects.ablation.head_means`)."""
        if self._means is None:
            texts = [t for t in sample_texts() if self.n_tokens(t) <= self.max_tokens]
            self._means = head_means(self.lm, [encode(self.lm, texts, self.max_tokens)])
        return self._means

    def ablate(self, text, heads, ablation: str = "zero", layer=0) -> dict:
        """``heads`` switched off: the model's output before and after and the maps of ``layer`` after,
        from one forward pass of the ablated text, the output before kept from the text's edit or last
        ablation (the same ids); else one pass of two copies of the text (the first unablated).

        Args:
            text: the text. heads: [[layer, head], ...] to ablate (none: the model as it is).
            ablation: ``zero`` or ``mean`` (each head's mean output over the built-in sample text).
            layer: the layer whose maps come back (a head view record).

        Returns:
            ``{"output": {"kind", ...before / after...}, "headView": view_data's dict of ``layer`` after,
            "heads": the ablated heads, "ablation": the ablation}``.

        Raises:
            InputError: a bad text, head, layer or ablation (:class:`~probe.settings.AblateRequest`: an unknown
                ablation is ``probe effects --ablation``'s line; then the model's ranges).
            UnsupportedAnalysisError: a model whose heads cannot be ablated (no output projection found).
        """
        req = AblateRequest(text=text, heads=heads, ablation=ablation, layer=layer)
        text, layer, kind = self.check_text(req.text), self.check_layer(req.layer), req.ablation
        heads = self.check_heads(req.heads)
        check_model(self.lm)
        means = self.means() if kind == "mean" else None
        batch = encode(self.lm, [text], self.max_tokens, parse_special_tokens=self.parse_special)
        out_kind, n = self.output_kind, int(batch.attention_mask[0].sum())
        # the unablated output: kept from this text's edit (or an earlier ablation), else the first of two copies
        clean = self._clean.get(text)
        if clean is not None and not torch.equal(clean[0], batch.input_ids.cpu()):
            clean = None
        nothing = out_kind == "masked-lm" and self._position(batch.input_ids[0, :n].tolist()) is None
        copies = 1 if clean is not None or nothing else 2
        run = batch if copies == 1 else repeat_batch(batch, 2)
        sets = torch.zeros(copies, self.n_layers, self.n_heads, dtype=torch.bool)
        for lay, h in heads:
            sets[-1, lay, h] = True
        site = self.sites[layer]
        kept: dict = {}

        def keep(s, probs):
            if s == site:
                kept["probs"] = probs[-1].float().cpu().numpy()

        with torch.no_grad(), ablating(self.lm, kind, means) as state:
            state.arm(self.lm, sets, run)
            try:
                with attention_hooks(self.lm, keep):
                    if out_kind == "embedding":
                        result = sentence_embedding(self.lm, run)
                    else:
                        result = forward(self.lm, run).logits
            finally:
                state.disarm()
        rows = None if nothing else self._reference(result, run.input_ids, run.real)  # [copies, ...]
        if rows is not None and clean is None:  # the first copy: the unablated output, kept for the next one
            self._clean[text] = (batch.input_ids.cpu(), rows[:1].clone())
            while len(self._clean) > KEPT:
                self._clean.popitem(last=False)
        elif rows is not None:
            self._clean.move_to_end(text)
            rows = torch.cat([clean[1].to(rows.device, rows.dtype), rows])
        output = self._compare(out_kind, rows, batch)
        maps: list = [None] * self.n_layers
        maps[layer] = kept["probs"][:, :n, :n]
        first, _ = batch_sides(self.lm, batch)
        hv = text_view(maps, self.sites, first, None, layers=[layer], causal=self.lm.kind != "encoder",
                       title=f"{self.lm.name}: layer {layer} with {len(heads)} head(s) ablated ({kind})")
        return {"heads": [list(x) for x in heads], "ablation": kind, "layer": layer, "output": output,
                "headView": hv.data}

    def _compare(self, kind: str, rows: torch.Tensor | None, batch) -> dict:
        """The outputs before and after side by side (``rows`` [2, ...]: :meth:`_reference` of the unablated
        and the ablated model): top tokens with both probabilities, or the cosine."""
        if kind == "embedding":
            a, b = rows[0].double(), rows[1].double()
            # a cosine is in [-1, 1]; rounding of equal vectors gives 1 + 2e-16 (no head switched off)
            cos = min(1.0, max(-1.0, float(torch.nn.functional.cosine_similarity(a, b, dim=0))))
            return {"kind": "embedding", "cosine": cos, "what": "cosine of the mean-pooled sentence embedding "
                    "to the unablated model's"}
        n = int(batch.attention_mask[0].sum())
        at = self._position(batch.input_ids[0, :n].tolist())
        if kind == "next-token":
            what = "next-token probabilities after the last token"
        elif at is None:
            return {"kind": "masked-lm", "position": None, "what": "type the mask token "
                    f"{self.lm.tokenizer.mask_token or '[MASK]'} in the text to see its predictions"}
        else:
            what = f"predictions at the mask token (position {at})"
        probs = torch.softmax(rows.double(), dim=-1)  # [2, vocab]
        top = lambda p: torch.topk(p, TOP_K).indices.tolist()  # noqa: E731
        ids = list(dict.fromkeys(top(probs[0]) + top(probs[1])))
        rows = [{"id": int(i), "token": self.lm.tokenizer.decode([int(i)]), "before": float(probs[0, i]),
                 "after": float(probs[1, i])} for i in ids]
        return {"kind": kind, "position": at, "what": what, "before": top(probs[0]), "after": top(probs[1]),
                "tokens": rows}

    def _ablation_refusal(self) -> str | None:
        """None where heads can be switched off on this model (:func:`probe.effects.ablation.check_model`), else its
        line saying why not (a capture-only type, a pruned model): the page turns "switch it off" off and says why."""
        try:
            check_model(self.lm)
        except ProbeError as e:
            return str(e)
        return None

    # ------------------------------------------------------------------ patching
    def _patch_refusal(self) -> str | None:
        """None where ``probe patch`` runs on this model, else its line saying why not."""
        try:
            check_patchable(self.lm)
        except ProbeError as e:
            return str(e)
        return None

    def _one_token(self, ids) -> tuple[int, str] | None:
        """The first id of ``ids`` whose text is that one token again (a pair's answers must be)."""
        for i in ids:
            s = self.lm.tokenizer.decode([int(i)])
            if s.strip() and self.lm.tokenizer(s, add_special_tokens=False)["input_ids"] == [int(i)]:
                return int(i), s
        return None

    def _answers(self, clean: str, corrupted: str) -> tuple[str, str]:
        """The answer (the clean text's most probable next token that is one token as text) and the wrong
        answer (the corrupted text's, or the clean text's next one when both agree).

        Raises:
            InputError: no such tokens among the 50 most probable.
        """
        batch = encode(self.lm, [clean, corrupted], self.max_tokens, parse_special_tokens=self.parse_special)
        with torch.no_grad(), attention_hooks(self.lm, lambda s, p: None):
            logits = forward(self.lm, batch).logits
        last = batch.attention_mask.sum(1) - 1
        if self.lm.kind == "encoder":
            ids = batch.input_ids[0].tolist()
            last = torch.tensor([ids.index(self.lm.tokenizer.mask_token_id)] * 2)
        tops = [torch.topk(logits[r, int(last[r])], 50).indices.tolist() for r in range(2)]
        answer = self._one_token(tops[0])
        wrong = self._one_token([i for i in tops[1] if answer is None or i != answer[0]])
        if answer is None or wrong is None:
            raise InputError("no single-token answer among the 50 most probable next tokens; give answer and wrong")
        return answer[1], wrong[1]

    def patch(self, clean, corrupted, answer: str | None = None, wrong: str | None = None, *,
              progress=None) -> dict:
        """Every head's activation-patching effect on the pair (``clean``, ``corrupted``), as ``probe patch``
        computes it (:func:`probe.effects.patching.patch_heads`, denoising: the corrupted run with one
        head's clean output; effect 1 = all of the logit difference restored). Its progress goes to
        :attr:`work` (patched runs done of 2 x layers x heads, the estimate line after the first passes) and to
        ``progress``, a callable ``(done, total)`` called after each patched pass (it may raise, e.g.
        :class:`~probe.live.work.Superseded`, to stop the run there), or None.

        Returns:
            ``{"effect", "effectLast", "raw", "rawLast": layers x heads, "answer", "wrong", "ldClean",
            "ldCorrupted", "normalized", "notes"}``.

        Raises:
            InputError: bad texts (:class:`~probe.settings.PatchRequest`), texts of different token counts,
                answers that are not one token, one of answer and wrong without the other.
            UnsupportedAnalysisError: a model without logits over the vocabulary (a bare encoder).
        """
        req = PatchRequest(text=clean, corrupted=corrupted, answer=answer, wrong=wrong)
        clean, corrupted = self.check_text(req.text), self.check_text(req.corrupted, "corrupted text")
        refusal = self._patch_refusal()
        if refusal is not None:
            raise UnsupportedAnalysisError(refusal)
        if self.lm.kind == "encoder" and self.lm.tokenizer.mask_token not in clean:
            raise InputError(f"patching a masked-LM encoder reads its predictions at the mask token: type "
                             f"{self.lm.tokenizer.mask_token} in both texts")
        if answer is None:
            answer, wrong = self._answers(clean, corrupted)
        def step(done, total):
            self.work.step(done, total)
            if progress is not None:
                progress(done, total)

        frame = patch_heads(self.lm, [Pair(clean, corrupted, str(answer), str(wrong))], progress=step,
                            estimate=self.work.estimate)
        L, H = self.n_layers, self.n_heads

        def grid(col):
            return [[_finite(v) for v in row] for row in frame[col].to_numpy().reshape(L, H)]

        return {"answer": answer, "wrong": wrong, "effect": grid("effect"), "effectLast": grid("effect_last"),
                "raw": grid("raw"), "rawLast": grid("raw_last"), "ldClean": float(frame.attrs["ld_clean"]),
                "ldCorrupted": float(frame.attrs["ld_corrupted"]), "normalized": bool(frame.attrs["normalized"]),
                "notes": list(frame.attrs["notes"])}


def why_record(run) -> dict:
    """A :class:`probe.qk.run.WhyRun` as the page draws it: its run.json record, the largest source pairs of
    each top key (why.csv's rows) and the check (the pairs' sum against the model's score), and the labels
    ``probe why`` shows (from ``run.labels``: head name -> label): ``label`` the head's own, each pair's
    ``query_label`` and ``key_label`` (its source's, "" for a source that is no head and for the rest row),
    ``labelsNote`` where they come from."""
    w = run.why
    record = run.record()
    rows = run.frame.to_dict("records")
    pairs = [{k: (_finite(v) if isinstance(v, (float, np.floating)) else v.item() if isinstance(v, np.generic)
                  else v) for k, v in r.items()} for r in rows]
    labels = run.labels or {}
    for p in pairs:  # as probe why's table: "its label" beside each source (none beside the rest row)
        p["query_label"] = labels.get(p["query_source"], "") if p["query_source"] != REST else ""
        p["key_label"] = labels.get(p["key_source"], "") if p["key_source"] != REST else ""
    sums = {int(j): float(w.contributions[:, :, j].sum()) for j in w.top_keys(run.top)}
    record.update(pairs=pairs, checks=[{"key": j, "sum": s, "score": float(w.scores[j]),
                                        "difference": s - float(w.scores[j])} for j, s in sums.items()],
                  tokens=list(w.tokens), label=labels.get(w.name, ""), labelsNote=LABELS_NOTE if labels else None)
    return record


__all__ = ["LiveSession", "Latest", "MAX_CHARS", "MAX_TOKENS", "TOP_K", "why_record"]
