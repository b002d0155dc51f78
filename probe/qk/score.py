"""Why a head attends where it does: each attention score split by what built its query and its key
(Elhage et al. 2021, "the QK circuit"; Kissane et al. 2024; Anthropic 2025, QK attributions).

The stream the head reads at positions i and j is a sum over sources (:mod:`probe.qk.stream`), its
norms frozen at the run. The head's query is then a sum too: q_{a,i} = R_i qn(W_Q n(c_{a,i})), with
R_i the rotation at position i (linear), qn the per-head q norm (Qwen3, Gemma 3) frozen the same way;
the ``bias`` source also carries W_Q beta + b_Q. The same for keys with W_K at j (grouped heads: the
key/value head that serves the query head). So, exactly at the run,

    s_ij = scale * q_i . k_j = sum_a sum_b C_ij[a, b],   C_ij[a, b] = scale * q_{a,i} . k_{b,j},

where s_ij is the score probe's attention function computes from the query and key it receives
(before soft-capping, Gemma 2, and before a position bias, which is reported beside it). The check
``residual`` = max_j |sum C_ij - s_ij| over the keys the mask keeps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..architectures.discovered import needs_weights, refuse_capture_only
from ..architectures.modules import head_geometry, site_block, site_spec
from ..architectures.weights import attention_weights
from ..capture.interface import repeat_heads
from ..capture.maps import encode
from ..capture.reference.rotary import Rope
from ..causal.heads import normalize_heads
from ..circuits.wiring import TURNS, turn
from ..errors import InputError, UnsupportedAnalysisError
from ..sites import Site, head_name
from ..text.sequence import Text
from ..text.tokens import display_tokens
from .cross import cross_sides
from .stream import BIAS, close, frozen_map, reads, record

#: The identity's tolerance in float32: |sum C - s| <= TOLERANCE (1 + max |s|).
TOLERANCE = 1e-5


@dataclass
class Why:
    """One head's scores at one query row, split by source.

    Attributes:
        model: the model's name; layer, head: the head; query: the query row i (0-based).
        tokens: the sequence's tokens, as reports show them.
        sources: the source names (``token embedding``, ``L3H5``, ``MLP3``, ``bias`` ...).
        contributions: [sources (query side), sources (key side), keys] float64, C_ij[a, b] (score units).
        scores: [keys] s_ij, the model's score read at probe's attention function (pre-cap; without
            the position bias).
        position_bias: [keys] the bias added to the scores (ALiBi, T5 buckets, a float mask), or None.
        pattern: [keys] the model's attention probabilities A_ij.
        keep: [keys] bool, the keys the mask keeps.
        softcap: the soft-capping constant (Gemma 2): the contributions add to the pre-cap score.
        residual: max over kept keys of |sum_ab C_ij[a, b] - s_ij|; tolerance: the bound it is held to.
        frozen: whether the norms were frozen at the run (False: each source normed by itself; the
            sum then misses by ``residual``).
        seconds: wall time; notes: what the reader must know.
        query_tokens: cross-attention: the target's tokens (the query rows; ``tokens`` are then the
            source's, the keys); None elsewhere.
        site: cross-attention: the head's :class:`~probe.sites.Site` (named ``cross L0H1``); None elsewhere.
    """

    model: str
    layer: int
    head: int
    query: int
    tokens: list[str]
    sources: list[str]
    contributions: np.ndarray
    scores: np.ndarray
    position_bias: np.ndarray | None
    pattern: np.ndarray
    keep: np.ndarray
    softcap: float | None
    residual: float
    tolerance: float
    frozen: bool = True
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    query_tokens: list[str] | None = None
    site: Site | None = None

    @property
    def name(self) -> str:
        return head_name(self.layer if self.site is None else self.site, self.head)

    @property
    def query_token(self) -> str:
        """The query row's token (cross-attention: the target's; else ``tokens[query]``)."""
        return (self.tokens if self.query_tokens is None else self.query_tokens)[self.query]

    @property
    def holds(self) -> bool:
        """Whether the contributions add up to the model's scores within :attr:`tolerance`."""
        return self.residual <= self.tolerance

    def top_keys(self, n: int = 5) -> list[int]:
        """The ``n`` kept keys with the largest attention, in decreasing order."""
        order = np.argsort(-np.where(self.keep, self.pattern, -1.0), kind="stable")
        return [int(j) for j in order[:min(n, int(self.keep.sum()))]]

    def matrix(self, key: int) -> np.ndarray:
        """[sources, sources] C_ij[a, b] at ``key``."""
        return self.contributions[:, :, key]


def parse_head(head, n_layers: int, n_heads: int) -> tuple[int, int]:
    """``(layer, head)`` or ``"L5H1"`` as (layer, head), checked against the model.

    Raises:
        InputError: another form, or a head out of range (naming the model's ranges).
    """
    if isinstance(head, str):
        text = head.strip().upper()
        if not (text.startswith("L") and "H" in text and text[1:].replace("H", "", 1).isdigit()):
            raise InputError(f"head {head!r} is not of the form L5H1 (layer and head, 0-based)")
        layer, h = text[1:].split("H")
        head = (int(layer), int(h))
    (layer, hs), = normalize_heads([tuple(head)], n_layers, n_heads).items()
    return layer, hs[0]


def _rotation(lm, rec, layer: int, T: int):
    """(cos, sin) [1, T, w] float64 the layer's queries and keys turn by, or None."""
    turns = rec.blocks[layer].turns
    if turns is not None:
        return turns
    spec, config = lm.spec, lm.model.config
    params = spec.rope(config, layer) if spec.rotary and not spec.discovered else None
    if params is None:
        return None
    rope = Rope.from_config(params, lm.geometry.d_head, getattr(config, "max_position_embeddings", None))
    return rope.cos_sin(torch.arange(T)[None], torch.float64)


def _side(lm, rec, layer: int, parts: torch.Tensor, W: torch.Tensor, b, norm, received: torch.Tensor, frozen: bool,
          rows: slice, bias_at: int):
    """One side (query or key) of one head per source: [sources, rows, d_head], rotated, with the
    per-head norm frozen; ``received`` [rows, d_head] what the attention function got (picks the
    rotation's layout); the projection's bias joins source ``bias_at`` (``bias``)."""
    x = torch.einsum("std,de->ste", parts[:, rows], W.detach().double().cpu())
    if b is not None:
        x[bias_at] = x[bias_at] + b.detach().double().cpu()
    if norm is not None:
        total = x.sum(0)
        fn, _ = frozen_map(lm.spec, norm, total, None, f"on layer {layer}'s queries or keys")
        x = fn(x) if frozen else torch.stack([frozen_map(lm.spec, norm, p, None, "", check=False)[0](p) for p in x])
    turns = _rotation(lm, rec, layer, rec.blocks[layer].x_in.shape[0])
    if turns is None:
        return x
    cos, sin = (t[:, rows].double() for t in turns)
    best = None
    for how in TURNS:
        try:
            turned = turn(x[None], cos, sin, how)[0]
        except (RuntimeError, ValueError):
            continue
        err = float((turned.sum(0) - received).abs().max())
        if best is None or err < best[0]:
            best = (err, turned)
    return x if best is None else best[1]


def _at(x: torch.Tensor | None, h: int, i: int) -> torch.Tensor | None:
    """Row (h, i) of a [batch|1, heads|1, query|1, key] tensor, as [key] (broadcast dimensions read once)."""
    if x is None:
        return None
    x = x[0]
    x = x[0] if x.shape[0] == 1 else x[h]
    return x[0] if x.shape[0] == 1 else x[i]


def _text(lm, batch) -> list[str]:
    n = int(batch.attention_mask[0].sum())
    t = batch.texts[0]
    return display_tokens(lm.tokenizer, t.text, batch.input_ids[0, :n].tolist(),
                          [tuple(o) for o in batch.offsets[0, :n].tolist()], batch.special[0, :n].tolist())


@dataclass
class Sides:
    """One head's query and key split by source on one sequence (:func:`sides`).

    Attributes:
        names: the source names; q: [sources, rows, d_head] the query rows asked for; k: [sources, T,
            d_head] every key; scale: the scores' multiplier; call: the layer's
            :class:`~probe.capture.interface.Call`; T: real tokens; ids: [T] token ids; batch: the
            encoded sequence.
    """

    names: list[str]
    q: torch.Tensor
    k: torch.Tensor
    scale: float
    call: object
    T: int
    ids: torch.Tensor
    batch: object


def check_model(lm, head) -> tuple[int, int]:
    """(layer, head) of ``head`` on ``lm``, after the model checks of :func:`why` (one-stack models).

    Raises:
        UnsupportedAnalysisError: an encoder-decoder model (:func:`check_cross` reads its cross-attention
            heads) or a model of another kind.
        UnsupportedArchitectureError: a capture-only type (its attention is its own code: no score to split).
    """
    if lm.kind == "encoder-decoder":
        raise UnsupportedAnalysisError(f"why: {lm.name} is an encoder-decoder model; probe splits its cross-attention "
                                       "heads one query row at a time (probe.why with --text, a head named "
                                       "'cross L0H1'), not over a corpus and not its self-attention heads")
    if lm.kind not in ("decoder", "encoder"):
        raise UnsupportedAnalysisError(f"why: {lm.name} is an {lm.kind} model; probe splits the scores of decoder-only "
                                       "and encoder-only models and the cross-attention of encoder-decoder models")
    lm.require_all_heads("why")
    # a capture-only type (RoFormer, MPT ...): said as every other analysis it refuses says it, not as a missing call
    refuse_capture_only(lm.spec, "why (each score split by the sources of its query and key)")
    if lm.spec.discovered:
        needs_weights(lm.spec, "why")
    g = lm.geometry
    if isinstance(head, str) and head.strip().lower().startswith("cross"):
        raise InputError(f"head {head!r}: {lm.name} is {'an' if lm.kind == 'encoder' else 'a'} {lm.kind} model with "
                         "no cross-attention; its heads are named L5H1 (layer and head, 0-based)")
    return parse_head(head, g.n_layers, g.n_heads)


def check_cross(lm, head) -> tuple[Site, int]:
    """(cross-attention site, head) of ``head`` (``"cross L0H1"`` or ``(site, head)``) on an
    encoder-decoder model ``lm``.

    Raises:
        InputError: a head without its site kind, or out of range (naming the cross-attention layers
            and heads).
        UnsupportedAnalysisError: an encoder or decoder self-attention head (not split yet), a model
            whose spec lacks the projection weights.
    """
    lm.require_all_heads("why")
    if lm.spec.discovered:
        needs_weights(lm.spec, "why")
    cross = [s for s in lm.sites if s.kind == "cross"]
    if isinstance(head, tuple) and len(head) == 2 and isinstance(head[0], Site):
        head = head_name(head[0], head[1])
    layer, h = _cross_head(lm.name, head, len(cross), lm.geometry.n_heads)
    return cross[layer], h


def _cross_head(model: str, head, n_layers: int | None, n_heads: int | None) -> tuple[int, int] | None:
    """(layer, head) of a cross-attention head named ``cross L0H1`` on the encoder-decoder model
    ``model`` with ``n_layers`` cross-attention layers of ``n_heads`` heads (None, unknown: the form
    alone is checked and None returned).

    Raises:
        UnsupportedAnalysisError: an encoder or decoder self-attention head (not split yet).
        InputError: a head without its site kind, or out of range.
    """
    prefix, _, rest = str(head).strip().partition(" ")
    if prefix.lower() in ("enc", "dec") and rest:
        raise UnsupportedAnalysisError(f"why: on the encoder-decoder model {model} probe splits the scores of "
                                       f"cross-attention heads (cross L0H1); its {prefix.lower()} self-attention "
                                       "heads are not split yet")
    if prefix.lower() != "cross" or not rest:
        raise InputError(f"head {head!r}: on an encoder-decoder model name a cross-attention head with its site kind, "
                         "as probe names them: 'cross L0H1'")
    if n_layers is None or n_heads is None:
        return None
    return parse_head(rest, n_layers, n_heads)


def check_head_config(head: str, config, model: str) -> None:
    """Refuse a ``--head`` that the model's config alone rules out, before any weight loads (a second
    where loading and the short analysis take half a minute): a self-attention head of an
    encoder-decoder model (only cross-attention heads are split), a head without its site kind there,
    a cross-attention head of a model without cross-attention, a layer or head out of range. What
    the config cannot tell (a discovered architecture's counts) is checked once the model has loaded
    (:func:`check_model`, :func:`check_cross`, which refuse the same heads).

    Args:
        head: as ``--head`` gives it (``L5H1``, ``cross L1H2``).
        config: the model's ``transformers`` config (:func:`probe.loading.models.peek_config`), or None
            (nothing is checked: the model is not on this machine yet).
        model: the model's name, for the message.

    Raises:
        InputError, UnsupportedAnalysisError: as :func:`check_model` and :func:`check_cross` would
            raise once the model is loaded.
    """
    if config is None:
        return
    if getattr(config, "is_encoder_decoder", False):
        layers = getattr(config, "decoder_layers", None) or getattr(config, "num_decoder_layers", None)
        heads = getattr(config, "decoder_attention_heads", None) or getattr(config, "num_heads", None)
        _cross_head(model, head, layers, heads)
        return
    if str(head).strip().lower().startswith("cross"):
        raise InputError(f"head {head!r}: {model} has no cross-attention (it is not an encoder-decoder model); its "
                         "heads are named L5H1 (layer and head, 0-based)")
    try:
        g = head_geometry(config)
    except Exception:  # noqa: BLE001 - an architecture the config alone does not describe: checked once loaded
        return
    parse_head(head, g.n_layers, g.n_heads)


def sides(lm, batch, layer: int, h: int, rows: slice | None = None, frozen: bool = True, rec=None) -> Sides:
    """The query (rows ``rows``, default all) and key of head (``layer``, ``h``) split by source on the
    first sequence of ``batch``, norms frozen at the run (see the module docstring); ``rec``: that
    sequence's pass already recorded (:func:`probe.qk.stream.record_rows`; ``batch`` then unread)."""
    if rec is None:
        rec = record(lm, batch, layer)
    T = int(rec.blocks[layer].x_in.shape[0])
    rows = slice(0, T) if rows is None else rows
    stream = reads(lm, rec, layer, frozen)
    parts = stream.stacked()  # [S, T, d_model]
    call = rec.call
    g = lm.geometry
    w = attention_weights(lm.model, lm.spec, lm.sites[layer])
    paths, block = site_spec(lm.spec, lm.sites[layer]), site_block(lm.model, lm.spec, lm.sites[layer])
    norms = [None if p is None else block.get_submodule(p) for p in (paths.q_norm, paths.k_norm)]
    kv = h // (g.n_heads // g.n_kv_heads)
    q_recv = call.query[0, h, rows].double().cpu()
    k_recv = call.key[0, kv, :T].double().cpu()
    q = _side(lm, rec, layer, parts, w.W_Q[h], None if w.b_Q is None else w.b_Q[h], norms[0], q_recv, frozen, rows,
              stream.names.index(BIAS))
    k = _side(lm, rec, layer, parts, w.W_K[kv], None if w.b_K is None else w.b_K[kv], norms[1], k_recv,
              frozen, slice(0, T), stream.names.index(BIAS))
    if frozen:
        for side, got, recv in (("queries", q, q_recv), ("keys", k, k_recv)):
            if not close(got.sum(0), recv):
                gap = float((got.sum(0) - recv).abs().max() / recv.abs().max())
                raise UnsupportedAnalysisError(
                    f"why: {lm.name}'s {side} of layer {layer} recomputed from the stream differ from what its "
                    f"attention function receives (relative {gap:.2g}): they change inside the attention module "
                    "after the projection (a scale, or a rotation computed there) in a way probe does not reproduce")
    scaling = call.kwargs.get("scaling")
    scale = q_recv.shape[-1] ** -0.5 if scaling is None else float(scaling)
    return Sides(stream.names, q, k, scale, call, T, rec.ids[:T], batch)


@torch.no_grad()
def why(lm, text: str, head, query: int | None = None, *, frozen: bool = True, max_length: int | None = None,
        target: str | None = None) -> Why:
    """Split head ``head``'s attention scores at query row ``query`` by the sources of its query and key.

    Args:
        lm: a :class:`~probe.loading.models.LoadedModel` (decoders and encoders whose attention calls
            probe's attention function; one sequence; encoder-decoder models: their cross-attention
            heads, :mod:`probe.qk.cross`).
        text: the sequence (encoder-decoder: the source).
        head: ``(layer, head)`` or ``"L5H1"`` (0-based); encoder-decoder: ``"cross L0H1"``.
        query: the query row i (0-based token position; encoder-decoder: of the target); None: the last.
        target: encoder-decoder models: the decoder's text (default: ``text`` itself).
        frozen: freeze every norm at the run (default; the decomposition is exact). False: each source
            normed by its own statistics, to show how far that is from the score (``residual``).
        max_length: token limit (default: the model's).

    Returns:
        A :class:`Why`: contributions [sources, sources, keys] with sum over both source axes equal to
        the model's score s_ij at every kept key (``residual`` says by how much it is not).

    Raises:
        InputError: a head or query row out of range (naming the valid ranges).
        UnsupportedAnalysisError: an encoder-decoder model's self-attention head, or a structure the
            decomposition does not walk (:mod:`probe.qk.stream`, :mod:`probe.qk.cross`).
    """
    started = time.perf_counter()
    if lm.kind == "encoder-decoder":
        return _why_cross(lm, text, target, head, query, frozen, max_length, started)
    if target is not None:
        raise InputError(f"a target goes with encoder-decoder models; {lm.name} is an {lm.kind} model")
    layer, h = check_model(lm, head)
    batch = encode(lm, [text], max_length)
    T = int(batch.attention_mask[0].sum())
    i = T - 1 if query is None else query
    if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < T):
        raise InputError(f"query {query!r} out of range: the text has {T} tokens, rows 0-{T - 1}")
    sd = sides(lm, batch, layer, h, slice(i, i + 1), frozen)
    call, q, k, scale = sd.call, sd.q[:, 0], sd.k, sd.scale
    return _result(lm, layer, h, i, call, q, k, scale, T, frozen, sd.names, _text(lm, batch), started)


def _why_cross(lm, text, target, head, query, frozen, max_length, started) -> Why:
    site, h = check_cross(lm, head)
    batch = encode(lm, [Text(text, target=text if target is None else target)], max_length)
    S, T = int(batch.attention_mask[0].sum()), int(batch.target.attention_mask[0].sum())
    i = T - 1 if query is None else query
    if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < T):
        raise InputError(f"query {query!r} out of range: the target has {T} tokens, rows 0-{T - 1}")
    cp = cross_sides(lm, batch, site, h, slice(i, i + 1), frozen)
    w = _result(lm, site.layer, h, i, cp.call, cp.q[:, 0], cp.k, cp.scale, S, frozen, cp.names, _text(lm, batch),
                started, query_tokens=_text(lm, batch.target), site=site)
    if w.position_bias is not None and not w.position_bias.any():  # T5's cross-attention: a bias of zeros
        w.position_bias = None
        w.notes = [n for n in w.notes if not n.startswith("a position bias")]
    if target is None:
        w.notes.append("the decoder read the source itself as its target (give a target to read another)")
    return w


def _result(lm, layer, h, i, call, q, k, scale, T, frozen, names, tokens, started, **extra) -> Why:
    """The :class:`Why` of query row ``i`` from its query parts ``q`` [sources, d_head] and the key
    parts ``k`` [sources, T, d_head] (T keys) and the layer's call."""
    q_recv = call.query[0, h, i].double().cpu()
    C = scale * torch.einsum("ae,bje->abj", q, k)
    s = scale * (repeat_heads(call.key, call.query.shape[1])[0, h, :T].double().cpu() @ q_recv)
    keep = _at(call.keep, h, i)
    keep = torch.ones(T, dtype=torch.bool) if keep is None else keep.cpu()[:T]
    bias = call.kwargs.get("position_bias")
    if call.mask_bias is not None:
        bias = call.mask_bias if bias is None else bias + call.mask_bias
    bias = _at(bias, h, i)
    residual = float((C.sum((0, 1)) - s[:T])[keep].abs().max())
    softcap = call.kwargs.get("softcap")
    notes = []
    if softcap:
        notes.append(f"soft-capped scores (cap {softcap:g}): the contributions add up to the pre-cap score s_ij; the "
                     "pattern reads cap * tanh(s_ij / cap)")
    if bias is not None:
        notes.append("a position bias is added to the scores after the product; it is no source pair and is reported "
                     "beside them")
        if lm.spec.family.startswith("deberta"):
            notes.append("DeBERTa's content-to-position and position-to-content terms are in that bias: they depend on "
                         "the query's and the key's content but are not split by source here")
    if not frozen:
        notes.append(f"norms not frozen (each source normed by its own statistics): the contributions miss the "
                     f"model's scores by up to {residual:.3g}")
    tol = TOLERANCE * (1 + float(s[:T][keep].abs().max()))
    if frozen and residual > tol:
        notes.append(f"the contributions miss the model's scores by {residual:.3g} (tolerance {tol:.2g})")
    pattern = call.probs[0, h, i, :T].double().cpu().numpy()
    return Why(lm.name, layer, h, i, tokens, names, C.numpy(), s[:T].numpy(),
               None if bias is None else bias[:T].double().cpu().numpy(), pattern,
               keep.numpy(), float(softcap) if softcap else None, residual, tol, frozen,
               time.perf_counter() - started, notes, **extra)
