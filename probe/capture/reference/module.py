"""``ReferenceAttention``: one layer's attention written from the formula, around the model's own
projection modules. Each step is a small method, in forward order, so a deliberately broken
variant (:mod:`probe.capture.reference.mutants`) overrides exactly one of them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ...architectures import ArchSpec, SiteSpec, head_geometry, site_spec
from ...errors import ProbeError
from ...sites import Site, causal_keep
from ..interface import probe_attention
from ..op import MaskError, as_keep_mask
from .blocked import attend_in_blocks
from .recorded import record_steps
from .rotary import Rope, apply_rope


@dataclass
class ForwardContext:
    """What the reference modules of one model read about the current forward pass.

    Filled by a forward pre-hook on the base model (see :func:`probe.capture.reference.swap.swap_attention`) from
    the arguments the caller passed, before Hugging Face turns them into a 4D mask that already
    contains causality.

    Attributes:
        active: a forward pass of the swapped model is running.
        attention_mask: [batch, past + T] keep-mask (bool) of the current pass, or None (no padding).
        position_ids: [batch, T] (or [1, T]) positions, or None (then counted from the cache).
        masks: encoder-decoder models: keep-masks by stack (``"encoder"``, ``"decoder"``) and of the
            source as the decoder's cross-attention reads it (``"source"``).
    """

    active: bool = False
    attention_mask: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    masks: dict = field(default_factory=dict)

    def padding(self, site: Site | None) -> torch.Tensor | None:
        """The keep-mask of the keys a site reads: its stack's own, or the source's for
        cross-attention (encoder-decoder models record one per stack in ``masks``)."""
        if site is not None and self.masks:
            return self.masks.get("source" if site.kind == "cross" else site.stack)
        return self.attention_mask


class ReferenceAttention(nn.Module):
    """One layer's attention, from the formula, using the original module's projections.

    The projection modules are the original ones (same objects, registered under the same names, so
    ``state_dict`` keys and hooks on them are unchanged); nothing is copied or transformed, and no
    weight is preprocessed.

    Forward: ``hidden_states`` [batch, T, d_model] (plus whatever the Hugging Face layer passes:
    cache, ``position_ids`` ...) -> ``(attn_output, attn_probs)``: attn_output [batch, T, d_model]
    (after the output projection where the architecture has it inside the attention module;
    BERT's stays in ``BertSelfOutput``), attn_probs [batch, heads, T, past + T]. Hugging Face's 4D
    ``attention_mask`` is ignored: the padding keep-mask comes from the :class:`ForwardContext` (or
    the ``padding_mask`` keyword, [batch, past + T]); the causal mask is built here. No dropout.

    Raises (at forward):
        MaskError: called outside a swapped model's forward with a Hugging Face mask but no
            ``padding_mask``; a padding mask whose length is not past + T.
        ProbeError: a cross-attention site called without the encoder's output, or a self-attention
            site given keys and values from another sequence.
    """

    #: The deliberately broken step, for mutants (None: this is the correct module).
    mutant: str | None = None
    #: The head whose intermediate steps the next forward records into :attr:`steps` (batch row 0), or None.
    step_request: int | None = None
    #: What the last forward with a :attr:`step_request` recorded (:meth:`record_steps`).
    steps: dict | None = None
    #: Query rows per block (:meth:`attend_in_blocks`), or None: whole maps (the probabilities are
    #: then returned in the output tuple, as the original module does).
    query_block: int | None = None
    #: With :attr:`query_block`: ``on_block(probs, (i0, i1), n_query)`` gets each block's
    #: probabilities [batch, heads, i1 - i0, key] (query rows i0..i1-1 of ``n_query``), in row order.
    on_block: Callable[[torch.Tensor, tuple[int, int], int], None] | None = None

    def __init__(self, original: nn.Module, spec: ArchSpec, config, layer_idx: int,
                 context: ForwardContext | None = None, *, site: Site | None = None,
                 bias_table: nn.Module | None = None, rel_embeddings: tuple | None = None) -> None:
        super().__init__()
        geo = head_geometry(config)
        self.spec, self.config, self.layer_idx, self.site = spec, config, layer_idx, site
        self.paths: SiteSpec = site_spec(spec, site) if site is not None else spec.site_specs[0]
        self.d_head, self.d_model = geo.d_head, geo.d_model
        self.context = context if context is not None else ForwardContext()
        self.notes: list[str] = []
        self._signature = inspect.signature(original.forward)
        self.is_cross = self.paths.kind == "cross"
        self._bias_table = [bias_table]  # T5: the stack's relative position bias (a list: not a child here)
        self._rel_embeddings = [rel_embeddings]  # DeBERTa: (the stack's table, its LayerNorm or None)

        # The original projections (and q/k norms), by reference, under their original attribute names.
        self._names: dict[str, str] = {}
        for role in ("q", "k", "v", "qkv", "o", "q_norm", "k_norm"):
            rel = self.paths.relative(getattr(self.paths, role))
            if rel is not None:
                name = rel.replace(".", "_")
                self.add_module(name, original.get_submodule(rel))
                self._names[role] = name
        for name, child in original.named_children():  # any other weights (T5's bias table) keep their names
            if name not in self._modules and any(True for _ in child.parameters()):
                self.add_module(name, child)
        self.n_head, self.n_kv_head = self._head_counts(original, config)

        self.scale = spec.scaling(config, self.d_head, layer_idx)  # multiplier of q k^T
        own = getattr(original, "scaling", None)
        if isinstance(own, float) and abs(own - self.scale) > 1e-6 * abs(self.scale):
            self.notes.append(f"layer {layer_idx}: the model's own scaling attribute {own} differs from "
                              f"the architecture's rule {self.scale}")
        self.is_causal = self.paths.causal
        self.window = None if self.is_cross else spec.window(config, layer_idx)
        self.softmax_dtype = spec.softmax_dtype
        self.upcast = spec.upcast(config)
        self.softcap = spec.softcap(config)
        self.rope = None
        params = spec.rope(config, layer_idx) if spec.rotary else None  # None: no rotation (Falcon's ALiBi)
        if params is not None:
            self.rope = Rope.from_config(params, self.d_head, getattr(config, "max_position_embeddings", None))

    def _head_counts(self, original: nn.Module, config) -> tuple[int, int]:
        """Query and key/value heads, from the projections' widths (so physically pruned heads work)."""
        def n_kv() -> int:  # the fused stacked/grouped widths do not tell query and key/value heads apart
            attrs = [getattr(original, a, None) for a in (*self.spec.kv_head_count_attrs, "num_key_value_heads")]
            return int(next((a for a in attrs if a is not None), None) or head_geometry(config).n_kv_heads)

        return self.spec.layout.head_counts(self._module, self.d_head, n_kv)

    def _module(self, role: str) -> nn.Module:
        return getattr(self, self._names[role])

    def projection(self, role: str) -> nn.Module:
        """The original module of a role: ``"query"``/``"q"``, ``"key"``/``"k"``, ``"value"``/``"v"``,
        ``"qkv"``, ``"o"`` (DeBERTa's position terms project with the layer's own q and k)."""
        return self._module({"query": "q", "key": "k", "value": "v"}.get(role, role))

    def extra_repr(self) -> str:
        return (f"heads={self.n_head}, kv_heads={self.n_kv_head}, d_head={self.d_head}, scale={self.scale:.6g}, "
                f"causal={self.is_causal}, window={self.window}, rope={self.rope.rope_type if self.rope else None}, "
                f"mutant={self.mutant}")

    # -- the steps, in forward order ----------------------------------------------------------------

    def project(self, x: torch.Tensor, source: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """x [batch, T, d_model] -> q [batch, heads, T, d_head], k, v [batch, kv_heads, T, d_head].

        Cross-attention: q from ``x``, k and v from ``source`` [batch, S, d_model] (the encoder's
        output) -> [batch, heads, S, d_head], or None when the cache already holds them.
        """
        B, T, _ = x.shape
        if self.is_cross:  # separate projections (BART, Marian, T5)
            q = self._module("q")(x).view(B, T, self.n_head, self.d_head).transpose(1, 2)  # (B, nh, T, hs)
            if source is None:
                return q, None, None
            S = source.shape[1]
            k = self._module("k")(source).view(B, S, self.n_kv_head, self.d_head).transpose(1, 2)  # (B, nkv, S, hs)
            v = self._module("v")(source).view(B, S, self.n_kv_head, self.d_head).transpose(1, 2)
            return q, k, v
        return self.spec.layout.project(self._module, x, self.n_head, self.n_kv_head, self.d_head)

    def normalize(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head RMS norms of q and k (Gemma 3, Qwen3), where the architecture has them."""
        if "q_norm" in self._names:
            q, k = self._module("q_norm")(q), self._module("k_norm")(k)
        return q, k

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary position embedding on q and k (Su et al. 2021); positions [batch|1, T]."""
        if self.rope is None:
            return q, k
        cos, sin = self.rope.cos_sin(positions, q.dtype)  # (B|1, T, d_rot)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention: each key/value head serves nh / nkv query heads (Ainslie et al.
        2023); key/value head j serves query heads j*rep .. j*rep + rep - 1. [B, nkv, Tk, hs] -> [B, nh, Tk, hs]."""
        B, nkv, Tk, hs = x.shape
        if nkv == self.n_head:
            return x
        rep = self.n_head // nkv
        return x[:, :, None].expand(B, nkv, rep, Tk, hs).reshape(B, self.n_head, Tk, hs)

    def score_scale(self) -> float:
        """The multiplier of q k^T: the architecture's rule (1/sqrt(d_head), Vaswani et al. sec. 3.2.1)."""
        return self.scale

    @property
    def bias_table(self) -> nn.Module | None:
        """T5: the embedding of the stack's relative position bias [buckets, heads]; else None."""
        return self._bias_table[0]

    @property
    def rel_embeddings(self) -> tuple:
        """DeBERTa: (the stack's relative position embedding [2 * span, d_model], its LayerNorm or
        None); ``(None, None)`` elsewhere."""
        return self._rel_embeddings[0] or (None, None)

    def position_bias(self, n_query: int, n_key: int, past: int, key_positions: torch.Tensor | None,
                      device, content: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | None:
        """A bias added to the scores, [batch|1, heads, query|1, key], or None: the rule the spec
        chose (:attr:`ArchSpec.position_bias`: ALiBi's m_h * j for BLOOM, j = the key's position
        among the real tokens; T5's learned bias of the bucket of j - i on self-attention sites;
        DeBERTa's c2p and p2c terms, which read ``content`` = (q [batch, heads, query, d_head],
        k [batch, heads, key, d_head]))."""
        return self.spec.position_bias(self, n_query, n_key, past, key_positions, device, content)

    #: +1: ALiBi as published; the ``alibi-sign`` mutant flips it.
    alibi_sign: float = 1.0
    #: +1: DeBERTa's c2p term at the relative position i - j; the ``c2p-sign`` mutant flips it.
    c2p_sign: int = 1

    def causal_mask(self, n_query: int, n_key: int, device) -> torch.Tensor | None:
        """[query, key] keep-mask of the site's causality and sliding window (None for encoders)."""
        if not self.is_causal:
            return None
        return causal_keep(n_query, n_key, window=self.window, device=device)

    def padding_mask(self, padding: torch.Tensor | None) -> torch.Tensor | None:
        """[batch, key] keep-mask of real keys (None: no padding)."""
        return padding

    def merge(self, y: torch.Tensor) -> torch.Tensor:
        """Merge heads: [B, nh, T, hs] -> [B, T, nh, hs] -> [B, T, nh*hs]."""
        B, nh, T, hs = y.shape
        return y.transpose(1, 2).contiguous().view(B, T, nh * hs)

    def record_steps(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None,
                     bias: torch.Tensor | None, inner: torch.Tensor | None = None) -> None:
        """Keep the steps of head :attr:`step_request` of this pass in :attr:`steps`
        (:func:`probe.capture.reference.recorded.record_steps`: the arguments, the keys and raises)."""
        record_steps(self, q, k, v, keep, bias, inner)

    # -- forward ------------------------------------------------------------------------------------

    def _arguments(self, hidden_states, args, kwargs) -> dict:
        """The call's arguments by name, whatever order the Hugging Face layer passed them in."""
        if not args:
            return kwargs
        bound = self._signature.bind_partial(hidden_states, *args, **kwargs).arguments
        extra = {}
        for name, param in self._signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                extra = bound.pop(name, {})
        bound.pop("hidden_states", None)
        return {**bound, **extra}

    def _padding_keep(self, kw: dict, batch: int, n_key: int) -> torch.Tensor | None:
        """[batch, key] boolean keep-mask of the keys this site reads in the current pass, or None."""
        mask = kw.get("padding_mask")
        if mask is None and self.context.active:
            mask = self.context.padding(self.site)
        elif mask is None and (kw.get("attention_mask") is not None or kw.get("mask") is not None):
            raise MaskError("the reference attention builds its own causal mask and needs the 2D padding mask: "
                            "run it through the model inside swap_attention(), or pass padding_mask=[batch, key]")
        if mask is None:
            return None
        keep = as_keep_mask(mask)
        if keep.dim() != 2 or keep.shape != (batch, n_key):
            raise MaskError(f"padding mask of shape {tuple(mask.shape)} does not cover the {n_key} keys of "
                            f"batch {batch} (with a key/value cache it must cover the cached and the new tokens)")
        return keep

    def _caches(self, kw: dict):
        """(the cache this site updates or reads, whether it already holds this cross-attention's
        keys and values, the whole cache object)."""
        cache = next((kw[n] for n in self.spec.cache_kwargs if kw.get(n) is not None), None)
        if cache is None or not hasattr(cache, "self_attention_cache"):
            return cache, False, cache
        if self.is_cross:  # EncoderDecoderCache: the static cross-attention half, filled once
            return cache.cross_attention_cache, bool(cache.is_updated.get(self.layer_idx)), cache
        return cache.self_attention_cache, False, cache

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> tuple:
        kw = self._arguments(hidden_states, args, kwargs)
        source = kw.get("key_value_states", kw.get("encoder_hidden_states"))
        if self.is_cross and source is None:
            raise ProbeError(f"cross-attention site {self.site} called without the encoder's output")
        if not self.is_cross and source is not None:
            raise ProbeError("keys and values from another sequence were passed to a self-attention site")
        cache, reuse, whole = self._caches(kw)
        B, T, _ = hidden_states.shape  # batch, new tokens, d_model
        past = 0 if cache is None or self.is_cross else cache.get_seq_length(self.layer_idx)  # tokens cached

        # 1. project and split into heads; rotary positions; key/value cache
        q, k, v = self.project(hidden_states, None if reuse else source)  # (B, nh, T, hs), (B, nkv, Tk, hs) x2
        q, k = self.normalize(q, k)
        positions = kw.get("position_ids")
        if positions is None and self.context.active:
            positions = self.context.position_ids
        if positions is None:
            positions = torch.arange(past, past + T, device=q.device)[None]  # (1, T)
        if not self.is_cross:
            q, k = self.rotate(q, k, positions)
        if reuse:  # cross-attention after the first step: the encoder's keys and values from the cache
            k, v = cache.layers[self.layer_idx].keys, cache.layers[self.layer_idx].values
        elif cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, nkv, Tk, hs), Tk = past + T
            if self.is_cross:
                whole.is_updated[self.layer_idx] = True
        Tk = k.size(-2)  # a sliding-window cache returns only the last Tk <= past + T positions
        own = k, v  # the key/value heads as the model has them (the attention function's "key"/"value")
        k, v = self.repeat_kv(k), self.repeat_kv(v)  # (B, nh, Tk, hs)

        # 2. which keys each query may see, and a position bias on the scores
        n_keys = Tk if self.is_cross else past + T
        padding = self._padding_keep(kw, B, n_keys)  # (B, n_keys) or None
        key_positions = None if padding is None else ((padding.long().cumsum(-1) - 1) * padding)[:, -Tk:]
        padding = self.padding_mask(None if padding is None or bool(padding.all()) else padding)
        keep = None if padding is None else padding[:, -Tk:][:, None, None, :]  # (B, 1, 1, Tk)
        if self.query_block is not None and self.on_block is not None and self.step_request is None:
            y = self.attend_in_blocks(q, k, v, keep, past, key_positions)  # (B, nh, T, hs); no T x Tk tensor
            zero = torch.zeros((), dtype=y.dtype, device=y.device).expand(1, self.n_head, T, Tk)  # T5: no memory
            return self._output(y, kw, None, zero)
        tri = self.causal_mask(T, Tk, q.device)  # (T, Tk) or None
        if tri is not None:
            keep = tri[None, None] if keep is None else keep & tri  # (B|1, 1, T, Tk)
        bias = self.position_bias(T, Tk, past, key_positions, q.device, (q, k))  # (B|1, nh, T|1, Tk) or None
        inner = self.spec.position_bias.inner_bias(self, T, Tk, past, key_positions, q.device)  # Falcon's ALiBi
        if bias is not None and not self.upcast:
            bias = bias.to(q.dtype)

        if self.step_request is not None:
            self.record_steps(q, k, v, keep, bias, inner)
        # 3. softmax(q k^T * scale + bias, masked) v in probe's attention function; merge heads; output projection
        y, probs = self.attend(q, *own, keep, bias, inner)  # (B, nh, T, hs), (B, nh, T, Tk)
        return self._output(y, kw, probs, bias)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None,
               bias: torch.Tensor | None, inner: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """softmax(q k^T * scale + bias, masked) v, computed by probe's attention function
        (:func:`probe.capture.interface.probe_attention`, this module as the caller), so that its
        editors and listeners serve this site as they serve a model calling transformers' interface.

        Args:
            q: [batch, heads, T, d_head]; k, v: [batch, kv_heads, Tk, d_head] (not repeated).
            keep: boolean keep-mask broadcastable to [batch, heads, T, Tk], or None.
            bias: the position terms added to the scaled scores (:meth:`position_bias`), or None.
            inner: Falcon's eager ALiBi, added to q k^T before the scaling, or None.

        Returns:
            ``(y [batch, heads, T, d_head], probs [batch, heads, T, Tk])`` (probs None under
            :func:`probe.capture.interface.row_blocks`), rounded as the family's eager code rounds
            (the spec's softmax dtype and upcast, BLOOM's fused GEMM, DeBERTa's divided keys).
        """
        out, probs = probe_attention(self, q, k, v, keep, scaling=self.score_scale(), softcap=self.softcap,
                                     position_bias=bias, softmax_dtype=self.softmax_dtype, upcast=self.upcast,
                                     fused_bias=self.spec.position_bias.fused, divide_keys=self.spec.divide_keys,
                                     inner_bias=inner)  # (B, T, nh, hs)
        return out.transpose(1, 2), probs

    def _output(self, y: torch.Tensor, kw: dict, probs: torch.Tensor | None, bias: torch.Tensor | None) -> tuple:
        """Merge heads, output projection, the architecture's residual; the original's output tuple
        (T5: the bias for the next layer). ``probs`` None: captured in blocks, none returned."""
        y = self.merge(y)  # (B, T, nh*hs)
        if "o" in self._names:
            y = self._module("o")(y)  # (B, T, d_model)
        y = self.spec.residual(y, kw)  # BLOOM adds the residual inside its attention module
        return self.spec.pack(y, probs, bias)

    def block_causal(self, i0: int, i1: int, n_query: int, n_key: int, device) -> torch.Tensor | None:
        """[i1 - i0, n_key] keep-mask of the site's causality and window for query rows i0..i1-1 of
        ``n_query`` (the queries are the last ``n_query`` of ``n_key`` positions), or None: rows
        i0..i1-1 of :meth:`causal_mask` (n_query, n_key), built without the whole [query, key] mask."""
        seen = n_key - (n_query - i1)  # keys at or before the block's last query
        tri = self.causal_mask(i1 - i0, seen, device)  # (i1 - i0, seen): the block's rows are the last of seen
        if tri is None or seen == n_key:
            return tri
        return torch.cat([tri, tri.new_zeros(i1 - i0, n_key - seen)], dim=1)  # later keys: never visible

    def attend_in_blocks(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor | None,
                         past: int, key_positions: torch.Tensor | None) -> torch.Tensor:
        """The attention output [batch, heads, T, d_head], :attr:`query_block` query rows at a time,
        each block's probabilities handed to :attr:`on_block`
        (:func:`probe.capture.reference.blocked.attend_in_blocks`)."""
        return attend_in_blocks(self, q, k, v, padding, past, key_positions)
