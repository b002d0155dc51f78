"""probe's attention inside transformers' ``AttentionInterface``: one capture point for every model
whose attention modules call it.

In transformers 5, most model folders send every attention call through the function registered in
``ALL_ATTENTION_FUNCTIONS`` under ``config._attn_implementation``: it receives ``(module, query, key,
value, attention_mask, scaling=..., dropout=..., **kwargs)`` with query [batch, heads, query, d_qk],
key [batch, kv_heads, key, d_qk] and value [batch, kv_heads, key, d_v] after projection and
rotation, and returns ``(attn_output [batch, query, heads, d_v], attn_weights)``. :func:`probe_attention`
is such a function, computed by probe's verified from-scratch operation
(:func:`probe.capture.op.attention`: scores, scaling, soft-capping, position bias, mask, softmax,
weighted values; sink logits as one more column of the softmax), registered under :data:`NAME`
with :func:`install`. Its masks come from :func:`probe_mask` (transformers' boolean mask, never
skipped: causality and padding are always in it).

Inside, the probabilities and the value states are handed to whoever listens to the calling module
(:func:`listen`, a registry keyed by module that capture fills), so capture does not depend on the
module returning its weights. The function is also probe's one intervention point: *editors*
(:func:`edit`, registered per attention module through :class:`probe.capture.hooks.Hooks`) may read or
replace each head's query, key, value, pattern and output (before the output projection) at the
named :data:`POINTS`; the setters built on them are in :mod:`probe.capture.intervene`. A keyword argument
that could change the maths and that the function does not compute is refused in one line
(:class:`InterfaceError`); the pass-through ones are in :data:`HARMLESS`. Scores and softmax run in
float32 (the LLaMA-style eager functions already do; float32 models are unchanged; float64 ones in
float64).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch
from torch import nn

from ..architectures import ArchSpec, site_modules
from ..errors import InterfaceError
from ..sites import Site
from .op import Scores, broadcast_keep, masked_softmax, scaled_scores, scored_attention

#: The name probe's function and mask function are registered under.
NAME = "probe"

#: Keyword arguments that never change the maths here: pass-through (positions, caches, switches),
#: or information already in the mask (``sliding_window``, ``is_causal``) or used by other backends
#: only (flash attention's packed-sequence lengths). Read by discovery where useful.
HARMLESS = frozenset({
    "position_ids", "cache_position", "output_attentions", "output_hidden_states", "output_router_logits",
    "use_cache", "return_dict", "num_items_in_batch", "layer_idx", "cache", "past_key_values", "past_key_value",
    "sliding_window", "is_causal", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
    "seq_idx", "query_length", "key_length", "deterministic", "use_top_left_mask", "position_embeddings",
    "encoder_hidden_states", "target_dtype", "implementation", "token_type_ids",
})
#: Keyword arguments that set how the scores and the softmax are rounded, passed by probe's reference
#: module (:class:`probe.capture.reference.ReferenceAttention`) so that the function computes each family's
#: attention as its own eager code does (:func:`probe.capture.op.attention`): ``softmax_dtype``,
#: ``upcast`` (GPT-Neo's float32 scores), ``fused_bias`` (BLOOM's ALiBi in one GEMM), ``divide_keys``
#: (DeBERTa's keys divided before the product) and ``inner_bias`` (Falcon's eager ALiBi, added to
#: q k^T before the scaling, [batch|1, heads, query|1, key]). Absent: float32 scores and softmax.
ARITHMETIC = frozenset({"softmax_dtype", "upcast", "fused_bias", "divide_keys", "inner_bias"})
#: Keyword arguments the function computes (besides ``scaling`` and ``dropout``); ``indices``: the keys a
#: sparse-attention indexer chose for each query ([batch, query, top-k]: DeepSeek-V3.2's DSA, GLM-MoE-DSA,
#: HY-V4, AXK2 pass it to any function but eager and SDPA, whose mask they fold it into), kept by
#: :func:`index_keep`.
COMPUTED = frozenset({"softcap", "position_bias", "s_aux", "sinks", "indices"}) | ARITHMETIC


@dataclass
class Call:
    """One attention call as the function saw it, handed to listeners.

    The same object is what an editor (:func:`edit`) receives as its second argument; there the
    fields computed after the editor's point are still None (``keep``, ``probs`` and ``output`` for
    the ``"query"``/``"key"``/``"value"`` points; ``output`` for ``"pattern"``).

    Attributes:
        module: the attention module that called the function.
        query: [batch, heads, query, d_qk] as received (after rotation), after the ``"query"`` editors.
        key: [batch, kv_heads, key, d_qk] as received (grouped heads not repeated), after the
            ``"key"`` editors.
        value: [batch, kv_heads, key, d_v] as received, after the ``"value"`` editors.
        keep: boolean keep-mask broadcastable to [batch, heads, query, key] (True = may attend), or None.
        kwargs: every other keyword argument (``scaling``, ``sliding_window`` ...).
        probs: [batch, heads, query, key] the probabilities (rows of real queries sum to 1 without
            sinks; masked keys exactly 0), after the ``"pattern"`` editors.
        output: [batch, query, heads, d_v] what the function returns as ``attn_output`` (each head's
            output before the output projection), after the ``"output"`` editors.
        rows: under :func:`row_blocks`, the query rows (i0, i1) of this block (``probs`` [batch,
            heads, i1 - i0, key], ``output`` [batch, i1 - i0, heads, d_v], ``keep`` the block's rows);
            None: the whole map.
        mask_bias: the finite values of a float (additive) mask where they are not all 0, [batch|1,
            heads|1, query|1, key] (:func:`split_mask`; Doge's dynamic mask), added to the scores; else None.
        scores: under :func:`scored`, the :class:`~probe.capture.op.Scores` the softmax read (this
            call's or block's rows); None otherwise, with sink logits, and where a ``"pattern"``
            editor changed the probabilities.
    """

    module: nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    keep: torch.Tensor | None
    kwargs: dict
    probs: torch.Tensor | None
    output: torch.Tensor | None
    rows: tuple[int, int] | None = None
    mask_bias: torch.Tensor | None = None
    scores: Scores | None = None


#: ``listener(call)``.
Listener = Callable[[Call], None]

_LISTENERS: WeakKeyDictionary = WeakKeyDictionary()  # module -> [listener, ...] in registration order
_EVERY: list[Listener] = []  # listeners of every module (discovery, verification)
_BLOCKS = {"rows": None}  # query rows per block under row_blocks(), else None
_SCORED = {"depth": 0}  # > 0 inside scored(): calls keep their scores


@contextmanager
def row_blocks(rows: int) -> Iterator[None]:
    """Context manager: probe's function computes each call ``rows`` query rows at a time, hands each
    block to the listeners (:attr:`Call.rows`) and returns no probabilities (``attn_weights`` None):
    no [batch, heads, T, T] tensor exists (the long-context path, :mod:`probe.capture.blocks`)."""
    saved, _BLOCKS["rows"] = _BLOCKS["rows"], rows
    try:
        yield
    finally:
        _BLOCKS["rows"] = saved


@contextmanager
def scored() -> Iterator[None]:
    """Context manager: each call of probe's function hands its listeners the scores its softmax read
    (:attr:`Call.scores`: the probabilities' row entropies then need no logarithm of the map,
    :func:`probe.measures.stats.map_sums`); outside, the function does not keep them."""
    _SCORED["depth"] += 1
    try:
        yield
    finally:
        _SCORED["depth"] -= 1


class Listening:
    """A registered listener; :meth:`remove` takes it away (the handle :class:`probe.capture.hooks.Hooks` keeps)."""

    def __init__(self, module: nn.Module | None, listener: Listener) -> None:
        self.module, self.listener = module, listener

    def remove(self) -> None:
        """Unregister (idempotent)."""
        group = _EVERY if self.module is None else _LISTENERS.get(self.module, [])
        if self.listener in group:
            group.remove(self.listener)


def listen(module: nn.Module | None, listener: Listener) -> Listening:
    """Call ``listener(call)`` (:class:`Call`) each time ``module`` (None: any module) runs probe's
    attention function. Returns a handle whose ``remove()`` unregisters it."""
    if module is None:
        _EVERY.append(listener)
    else:
        _LISTENERS.setdefault(module, []).append(listener)
    return Listening(module, listener)


#: The named points where editors act, in the order they run within a call:
#:
#: - ``"query"``: [batch, heads, query, d_qk], after rotation;
#: - ``"key"``: [batch, kv_heads, key, d_qk] and ``"value"``: [batch, kv_heads, key, d_v], the key/value
#:   heads as the model has them (grouped heads not yet repeated);
#: - ``"pattern"``: [batch, heads, query, key], the probabilities before they weight the values (an
#:   edited pattern's output is recomputed from it: probs @ v);
#: - ``"output"``: [batch, query, heads, d_v], each head's output before the output projection (z).
#:
#: Under :func:`row_blocks` the ``"pattern"`` and ``"output"`` editors run once per block of query rows
#: (:attr:`Call.rows`; [batch, heads, i1 - i0, key] and [batch, i1 - i0, heads, d_v]); the
#: ``"query"``/``"key"``/``"value"`` editors run once per call, before the blocks.
POINTS = ("query", "key", "value", "pattern", "output")

#: ``editor(tensor, call) -> tensor``: the tensor at a point (:data:`POINTS`) and the call so far
#: (:class:`Call`); returns the tensor the function goes on with, of the same shape (a reader returns
#: its input unchanged).
Editor = Callable[[torch.Tensor, Call], torch.Tensor]

_EDITORS: WeakKeyDictionary = WeakKeyDictionary()  # module -> {point: [editor, ...]} in registration order


class Editing:
    """A registered editor; :meth:`remove` takes it away (the handle :class:`probe.capture.hooks.Hooks` keeps)."""

    def __init__(self, module: nn.Module, point: str, editor: Editor) -> None:
        self.module, self.point, self.editor = module, point, editor

    def remove(self) -> None:
        """Unregister (idempotent)."""
        points = _EDITORS.get(self.module, {})
        group = points.get(self.point, [])
        if self.editor in group:
            group.remove(self.editor)
        if not group:
            points.pop(self.point, None)
        if not points:
            _EDITORS.pop(self.module, None)


def edit(module: nn.Module, point: str, editor: Editor) -> Editing:
    """Register ``editor(tensor, call) -> tensor`` at ``point`` of every call ``module`` makes to
    probe's attention function. Editors of one point run in registration order, each on the previous
    one's result, before the listeners (:func:`listen`) are handed the call. Gradients flow through
    whatever the editors compute (use differentiable, out-of-place operations).

    Args:
        module: the attention module (an attention site's module).
        point: one of :data:`POINTS`.
        editor: :data:`Editor`; it must return a tensor of the same shape.

    Returns:
        A handle whose ``remove()`` unregisters it (give it to :meth:`probe.capture.hooks.Hooks.own`).

    Raises:
        ValueError: ``point`` is not one of :data:`POINTS`.
    """
    if point not in POINTS:
        raise ValueError(f"no edit point {point!r}; points: {', '.join(POINTS)}")
    _EDITORS.setdefault(module, {}).setdefault(point, []).append(editor)
    return Editing(module, point, editor)


def edited(point: str, tensor: torch.Tensor, call: Call) -> torch.Tensor:
    """``tensor`` after the editors of ``call.module`` at ``point`` (itself when there are none)."""
    for editor in list(_EDITORS.get(call.module, {}).get(point, ())):
        out = editor(tensor, call)
        if out.shape != tensor.shape:
            raise InterfaceError(f"an editor at {point!r} of {type(call.module).__name__} returned shape "
                                 f"{tuple(out.shape)} for {tuple(tensor.shape)}")
        tensor = out
    return tensor


def _edits(module: nn.Module, point: str) -> bool:
    return bool(_EDITORS.get(module, {}).get(point))


def has_editors(module: nn.Module, point: str) -> bool:
    """Whether editors are registered at ``point`` (:data:`POINTS`) of ``module``'s calls now (a
    reader of :attr:`Call.output` learns whether it is still the probabilities times the values)."""
    return _edits(module, point)


def probe_mask(*args, **kwargs):
    """The mask function registered for :data:`NAME`: transformers' boolean ``sdpa_mask`` (True =
    keep, [batch, 1, query, key]) never skipped, so that causality, windows and padding are always in
    the mask the function receives."""
    from transformers.masking_utils import sdpa_mask  # deferred: transformers takes ~1.5 s to import

    kwargs.pop("allow_is_causal_skip", None)
    kwargs.pop("allow_is_bidirectional_skip", None)
    return sdpa_mask(*args, allow_is_causal_skip=False, allow_is_bidirectional_skip=False, **kwargs)


def install() -> str:
    """Register :func:`probe_attention` and :func:`probe_mask` with transformers under :data:`NAME`
    (idempotent). Returns the name."""
    from transformers import AttentionInterface  # deferred: transformers takes ~1.5 s to import
    from transformers.masking_utils import AttentionMaskInterface  # deferred: as above

    AttentionInterface.register(NAME, probe_attention)
    AttentionMaskInterface.register(NAME, probe_mask)
    return NAME


def refuse_unknown(module: nn.Module, kwargs: dict) -> None:
    """Refuse a keyword argument that is neither computed nor harmless and is not None.

    Raises:
        InterfaceError: one line naming the argument and the module's class.
    """
    for name, value in kwargs.items():
        if value is None or name in HARMLESS or name in COMPUTED:
            continue
        raise InterfaceError(f"{type(module).__name__} passes {name!r} to the attention function, which probe's "
                             "attention does not compute; refusing rather than measuring a different attention")


def index_keep(indices: torch.Tensor, n_keys: int) -> torch.Tensor:
    """The keep-mask [batch, 1, query, key] of a sparse indexer's choice: True at the ``indices``
    [batch, query, top-k] of each query's keys, False elsewhere (DeepSeek-V3.2's eager path masks the
    keys it did not choose in the same way: ``ones.scatter(-1, indices, False)`` as its masked keys)."""
    out = torch.zeros(*indices.shape[:2], n_keys, dtype=torch.bool, device=indices.device)
    return out.scatter(-1, indices.long(), True).unsqueeze(1)


def split_mask(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor
               ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """An attention function's mask as (keep-mask [batch|1, heads|1, query|1, key] bool, bias or None).

    A boolean or integer mask is a keep-mask (:func:`probe.capture.op.as_keep_mask`). A float mask is
    additive, as transformers' eager functions add it to the scores: keys at -inf or at or below half the
    dtype's lowest value are masked, and the values of the other keys are a bias added to the scaled
    scores (0 for most models, so a mask of zeros keeps every key; Doge's dynamic mask adds learned
    values), None where they are all 0.
    """
    if mask is None:
        return None, None
    B, H, Tq, _ = query.shape
    if not mask.is_floating_point():
        return broadcast_keep(mask, B, H, Tq, key.shape[-2]), None
    keep = mask > torch.finfo(mask.dtype).min / 2  # -inf and finfo.min (also after adding a finite bias)
    bias = mask.masked_fill(~keep, 0.0)
    keep = broadcast_keep(keep, B, H, Tq, key.shape[-2])
    return keep, (bias if bool(bias.any()) else None)


def repeat_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[batch, kv_heads, T, d] -> [batch, heads, T, d]: key/value head g serves query heads
    g * (heads / kv_heads) ... (g + 1) * (heads / kv_heads) - 1 (transformers' ``repeat_kv`` order)."""
    kv = x.shape[1]
    if kv == n_heads:
        return x
    if n_heads % kv:
        raise InterfaceError(f"{n_heads} query heads cannot share {kv} key/value heads evenly")
    B, _, T, d = x.shape
    # expand and reshape as transformers' repeat_kv does, not repeat_interleave: with one key/value head
    # the reshape stays a stride-0 view, and the matmuls that read it then take the same kernel as the
    # model's own eager attention (a copy takes another one on some CPUs, AVX-512 among them, and rounds
    # differently in the last bit)
    return x[:, :, None].expand(B, kv, n_heads // kv, T, d).reshape(B, n_heads, T, d)


def with_sinks(q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor | None, scale: float,
               sinks: torch.Tensor, softcap: float | None, bias: torch.Tensor | None) -> torch.Tensor:
    """Probabilities with a sink logit: softmax over the keys and the sink, the sink's column dropped
    (rows sum to less than 1). [batch, heads, query, key] float32.

    ``sinks``: one logit per head ([heads], gpt-oss ``s_aux``), or one per head and query row
    ([batch, heads, query, 1], Inkling 2's per-token sinks, projected from each token's hidden state)."""
    scores = scaled_scores(q.float(), k.float(), scale, softcap=softcap, bias=bias)
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    B, H, Tq, _ = scores.shape
    per_row = sinks.dim() == 4
    sink = (sinks.float() if per_row else sinks.float().reshape(1, -1, 1, 1)).expand(B, H, Tq, 1)
    combined = torch.cat([scores, sink], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    return masked_softmax(combined, None, torch.float32)[..., :-1]


def probe_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """probe's attention as a transformers attention function (:data:`NAME`).

    Args:
        module: the calling attention module.
        query: [batch, heads, query, d_qk]; key: [batch, kv_heads, key, d_qk]; value: [batch,
            kv_heads, key, d_v] (grouped heads repeated here).
        attention_mask: boolean keep-mask (:func:`probe_mask`), an additive 0/-inf (or finfo.min)
            mask or 0/1, broadcastable to [batch, heads, query, key]; None: every key.
        scaling: multiplier of q k^T (default d_qk ** -0.5).
        dropout: attention dropout; only 0 (or a module in eval mode) is measured.
        kwargs: ``softcap`` (scores become cap * tanh(scores / cap)), ``position_bias`` (added to
            the scores: T5; DeBERTa's c2p and p2c terms, ALiBi and MPNet's buckets from the reference
            module), ``s_aux`` / ``sinks`` (a sink logit per head: gpt-oss; per head and query row:
            Inkling 2), the rounding of :data:`ARITHMETIC` and the pass-through arguments of :data:`HARMLESS`.

    Returns:
        ``(attn_output [batch, query, heads, d_v], attn_weights [batch, heads, query, key])`` in
        value's dtype; scores and softmax in float32.

    Raises:
        InterfaceError: an argument that would change the maths and that probe does not compute,
            or dropout in train mode.
    """
    refuse_unknown(module, kwargs)
    if dropout and module.training:
        raise InterfaceError(f"{type(module).__name__} runs attention dropout {dropout:g} in train mode; "
                             "probe measures in eval mode")
    call = Call(module, query, key, value, None, {"scaling": scaling, **kwargs}, None, None)
    for point in ("query", "key", "value"):
        setattr(call, point, edited(point, getattr(call, point), call))
    query, H = call.query, call.query.shape[1]
    k, v = repeat_heads(call.key, H), repeat_heads(call.value, H)
    keep, mask_bias = split_mask(attention_mask, query, k)
    if kwargs.get("indices") is not None:  # a sparse indexer's keys: the others masked, as the eager path does
        chosen = index_keep(kwargs["indices"], k.shape[-2])
        keep = chosen if keep is None else keep & chosen
    call.keep, call.mask_bias = keep, mask_bias
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    bias = kwargs.get("position_bias")
    if mask_bias is not None:
        bias = mask_bias if bias is None else bias + mask_bias
    terms = {"softcap": kwargs.get("softcap"), "bias": bias, "sinks": kwargs.get("s_aux", kwargs.get("sinks")),
             "options": {name: kwargs[name] for name in ARITHMETIC if name in kwargs}}
    rows, Tq = _BLOCKS["rows"], query.shape[2]
    if rows is None:
        probs, output, scores = _attend(query, k, v, keep, scale, **terms)
        call = _finish(call, probs, output, v, scores)
        return call.output, call.probs
    outputs = []
    for i0 in range(0, Tq, rows):
        i1 = min(Tq, i0 + rows)
        part = {**terms, "bias": _rows(terms["bias"], i0, i1), "options": _rows_of(terms["options"], i0, i1),
                "sinks": _rows(terms["sinks"], i0, i1)}
        probs, output, scores = _attend(query[:, :, i0:i1], k, v, _rows(keep, i0, i1), scale, **part)
        block = dataclasses.replace(call, keep=_rows(keep, i0, i1), rows=(i0, i1),
                                    mask_bias=_rows(mask_bias, i0, i1))
        outputs.append(_finish(block, probs, output, v, scores).output)
    return torch.cat(outputs, dim=1), None


def _finish(call: Call, probs: torch.Tensor, output: torch.Tensor, v: torch.Tensor, scores: Scores | None) -> Call:
    """The call (or block) completed: the ``"pattern"`` editors (the output recomputed from an edited
    pattern), the ``"output"`` editors, then the listeners. v: [batch, heads, key, d_v] repeated."""
    call.probs, call.scores = probs, scores
    if _edits(call.module, "pattern"):
        pattern = edited("pattern", probs, call)
        if pattern is not probs:
            call.probs, call.scores = pattern, None  # the scores are no longer those of the probabilities
            output = (pattern.to(v.dtype) @ v).transpose(1, 2).contiguous()
    call.output = output
    call.output = edited("output", output, call)
    _hand(call)
    return call


def _rows(x: torch.Tensor | None, i0: int, i1: int) -> torch.Tensor | None:
    """Query rows i0..i1-1 of a [batch, heads, query, key] tensor (a broadcast query dimension kept)."""
    return x if x is None or x.dim() < 4 or x.shape[2] == 1 else x[:, :, i0:i1]


def _rows_of(options: dict, i0: int, i1: int) -> dict:
    """The :data:`ARITHMETIC` options of query rows i0..i1-1 (``inner_bias`` cut like the bias)."""
    return {**options, "inner_bias": _rows(options["inner_bias"], i0, i1)} if "inner_bias" in options else options


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, scale: float,
            softcap: float | None, bias: torch.Tensor | None, sinks: torch.Tensor | None, options: dict) -> tuple:
    """(probs [batch, heads, query, key], output [batch, query, heads, d_v], the :class:`Scores` under
    :func:`scored` or None); k and v repeated; ``options``: the :data:`ARITHMETIC` keywords given."""
    scores = None
    if sinks is not None:
        probs = with_sinks(q, k, keep, scale, sinks, softcap, bias).to(v.dtype)
        out = probs @ v
    else:  # d_v may differ from d_qk (MLA)
        wide = q.dtype in (torch.float32, torch.float64)  # float64 models keep their precision
        rounding = {"softmax_dtype": q.dtype if wide else torch.float32, "upcast": not wide, **options}
        out, probs, scores = scored_attention(q, k, v, keep, scale=scale, softcap=softcap, bias=bias,
                                              scored=_SCORED["depth"] > 0, **rounding)
    return probs, out.transpose(1, 2).contiguous(), scores


def _hand(call: Call) -> None:
    for listener in list(_EVERY) + list(_LISTENERS.get(call.module, ())):
        listener(call)


def served_sites(model: nn.Module, spec: ArchSpec) -> dict[nn.Module, list[Site]]:
    """Each attention module of a model with the sites it serves, in forward order (one site each,
    except a module shared by several layers: ALBERT's)."""
    served: dict = {}
    for site, module in site_modules(model, spec):
        served.setdefault(module, []).append(site)
    return served


def in_turn(items: list) -> Callable[[Call], object]:
    """``pick(call)``: for a module serving several sites, the item of the site this call belongs to:
    ``items`` in turn, one per call (the blocks of one call under :func:`row_blocks` share its item)."""
    state: dict = {"n": 0, "item": items[0]}

    def pick(call: Call):
        if call.rows is None or call.rows[0] == 0:  # a new call (its first block)
            state["item"] = items[state["n"] % len(items)]
            state["n"] += 1
        return state["item"]
    return pick


def site_listeners(hooks, model: nn.Module, spec: ArchSpec, on_call: Callable[[Site, Call], None]) -> None:
    """Register, into ``hooks`` (a :class:`probe.capture.hooks.Hooks`), one listener per attention module of
    a discovered spec, calling ``on_call(site, call)``. A module that serves several sites (ALBERT's
    shared layer) hands them in turn, in forward order (:func:`in_turn`)."""
    for module, sites in served_sites(model, spec).items():
        pick = in_turn(sites)
        hooks.own(listen(module, lambda call, pick=pick: on_call(pick(call), call)))
