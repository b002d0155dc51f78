"""The architecture spec: :class:`ArchSpec` (one per ``model_type``), :class:`SiteSpec` (one per
kind of site of a stack) and the behaviour rules their fields point at (score scale, windows,
rotary settings, softcap, position offset)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..sites import Site
from .layout import QKV_LAYOUTS, ProjectionLayout, projection_layout
from .position_bias import NO_POSITION_BIAS, PositionBias

#: How a family's norms compute (see :attr:`ArchSpec.norm`).
NORMS = ("layernorm", "rmsnorm")


def _inverse_sqrt_head(config, d_head: int, layer: int) -> float:
    """1/sqrt(d_head): Vaswani et al. 2017, sec. 3.2.1."""
    return d_head ** -0.5


def _gpt2_scaling(config, d_head: int, layer: int) -> float:
    """GPT-2: 1/sqrt(d_head) if ``scale_attn_weights`` (else 1), divided by (layer + 1) if
    ``scale_attn_by_inverse_layer_idx`` (the Mistral/GPT-2 "stability" option)."""
    scale = d_head ** -0.5 if config.scale_attn_weights else 1.0
    if config.scale_attn_by_inverse_layer_idx:
        scale /= float(layer + 1)
    return scale


def _query_pre_attn_scaling(config, d_head: int, layer: int) -> float:
    """Gemma 2/3: 1/sqrt(query_pre_attn_scalar), a config value that need not equal d_head
    (Gemma Team 2024, "Gemma 2", sec. 2)."""
    return float(config.query_pre_attn_scalar) ** -0.5


def _no_window(config, layer: int) -> int | None:
    return None


def _window_every_layer(config, layer: int) -> int | None:
    """Mistral, Phi-3: ``config.sliding_window`` (None = full causal attention) in every layer."""
    return getattr(config, "sliding_window", None)


def _window_by_layer_type(config, layer: int) -> int | None:
    """Qwen2/3, Gemma 2/3: ``config.sliding_window`` only in layers whose ``layer_types`` entry is
    ``"sliding_attention"``."""
    types = getattr(config, "layer_types", None)
    if types and types[layer] == "sliding_attention":
        return getattr(config, "sliding_window", None)
    return None


def _rope_single(config, layer: int) -> dict:
    """The config's RoPE settings as one dict (``rope_parameters``; older configs' ``rope_theta`` /
    ``rope_scaling`` / ``partial_rotary_factor`` folded in)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(scaling, dict):
        params = {**scaling, **params}
    if "partial_rotary_factor" not in params and isinstance(getattr(config, "partial_rotary_factor", None), float):
        params["partial_rotary_factor"] = config.partial_rotary_factor
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def _kv_heads_from_config(config) -> int:
    """Key/value heads: ``num_key_value_heads``, else the query heads (multi-head attention)."""
    return getattr(config, "num_key_value_heads", None) or _query_heads(config)


def _query_heads(config) -> int:
    return getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", None) or config.n_head


def _rope_by_layer_type(config, layer: int) -> dict:
    """Gemma 3: one RoPE setting per layer type (local sliding layers and global layers differ)."""
    params = getattr(config, "rope_parameters", None) or {}
    types = getattr(config, "layer_types", None)
    if types and isinstance(params.get(types[layer]), dict):
        return _rope_single(type("C", (), {"rope_parameters": params[types[layer]]})(), layer)
    return _rope_single(config, layer)


def _no_note(config) -> str | None:
    return None


def _no_refusal(config) -> str | None:
    return None


def _no_upcast(config) -> bool:
    return False


def _gpt2_upcast(config) -> bool:
    """GPT-2's ``reorder_and_upcast_attn``: scores and softmax in float32."""
    return bool(getattr(config, "reorder_and_upcast_attn", False))


def _no_softcap(config) -> float | None:
    return None


def _final_logit_softcap(config) -> float | None:
    """Gemma 2 and 3: the final logits become cap * tanh(logits / cap) (``final_logit_softcapping``)."""
    return getattr(config, "final_logit_softcapping", None)


def _gemma2_softcap(config) -> float | None:
    """Gemma 2: scores become cap * tanh(scores / cap) before masking (``attn_logit_softcapping``)."""
    return getattr(config, "attn_logit_softcapping", None)


def _probs_second(output) -> torch.Tensor | None:
    """``(attn_output, attn_probs)``: the probabilities second (most architectures)."""
    return output[1] if isinstance(output, tuple) and len(output) > 1 else None


def _probs_third(output) -> torch.Tensor | None:
    """T5: ``(attn_output, position_bias, attn_probs)``."""
    return output[2] if isinstance(output, tuple) and len(output) > 2 else None


def _pack_pair(y: torch.Tensor, probs: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """``(attn_output, attn_probs)``."""
    return y, probs


def _pack_t5(y: torch.Tensor, probs: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """T5: ``(attn_output, position_bias, attn_probs)``; the bias goes to the next layer of the
    stack (zeros [1, heads, query, key] where this site adds none)."""
    if bias is None:
        bias = torch.zeros(1, *probs.shape[1:], dtype=y.dtype, device=y.device)
    return y, bias, probs


def _no_residual(y: torch.Tensor, kwargs: dict) -> torch.Tensor:
    return y


def _residual_inside(y: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """BLOOM: the attention module adds its input's residual (``dropout_add(output, residual)``)."""
    return y + kwargs["residual"]


def _no_offset(config) -> int:
    return 0


def _roberta_offset(config) -> int:
    """RoBERTa numbers positions from ``pad_token_id + 1``: that many rows of the position table
    never hold a token."""
    return (config.pad_token_id or 0) + 1


#: The kinds of model (:attr:`ArchSpec.kind`): one bidirectional stack, one causal stack, or an
#: encoder that reads the source and a decoder that writes the target while reading the encoder.
MODEL_KINDS = ("encoder", "decoder", "encoder-decoder")


@dataclass(frozen=True)
class SiteSpec:
    """Where one kind of attention site lives: a layer list and, in each layer, an attention module.

    The site specs of an :class:`ArchSpec` are the only place that names module paths. Paths:
    ``layers``, ``stack_module``, ``bias_table``, ``rel_embeddings`` and ``rel_norm`` are relative to
    the base model (``model.base_model``); every other path to one layer.

    Attributes:
        stack: ``"encoder"`` or ``"decoder"`` (:class:`~probe.sites.Site`).
        kind: ``"self"`` or ``"cross"`` (queries from the decoder, keys and values from the encoder).
        layers: path of the ``nn.ModuleList`` of this stack's blocks.
        attention: path of the attention module in a block: its forward returns the attention
            probabilities [batch, heads, query, key] in its output tuple (:attr:`ArchSpec.probs`).
        o: path of the output projection; its input is [batch, seq, heads * d_head] (the place
            where head gates act). It lies inside ``attention`` (GPT-2, LLaMA ...) or in a sibling
            module (BERT's ``attention.output.dense``).
        q, k, v, qkv: the projection paths the layout uses (:attr:`ArchSpec.qkv_layout`; the
            others None).
        q_norm, k_norm: paths of per-head RMS norms applied to q and k before RoPE (Gemma 3, Qwen3),
            or None.
        input_norm: path of the norm before the attention in a pre-norm block (what the attention
            reads is this norm of the residual stream), or None where probe's weight analyses do not
            apply (post-norm encoders, encoder-decoder models). ``"a|b"``: the first of the
            alternatives the block has (a family whose configurations name it differently).
        mlp: path of the block's MLP (its output is the MLP's write to the residual stream), or None.
        mlp_norm: path of the norm whose output is the MLP's input (what the MLP reads is this norm
            of the residual stream), or None where it is not a module of its own (GPT-J and Falcon
            share the attention's norm) or not named; alternatives as ``input_norm``.
        attn_post, mlp_post: paths of the norms on the attention's and the MLP's output, before
            their residual adds (Gemma 2 and 3: ``post_attention_layernorm`` and
            ``post_feedforward_layernorm``), or None.
        causal: queries see only keys at or before their own position.
        stack_module: path of the module whose forward receives this stack's 2D padding mask
            (``"encoder"``/``"decoder"`` of an encoder-decoder model; ``""`` = the base model).
        n_layers: ``config -> int`` layers of this stack (None: :func:`head_geometry`'s count).
        bias_table: T5, MPNet: path, relative to the base model, of the embedding holding the
            stack's learned relative position bias [buckets, heads] (T5: in the stack's first block;
            MPNet: in the encoder), shared by the stack's layers; None elsewhere.
        rel_embeddings: DeBERTa-v2/v3: path, relative to the base model, of the stack's relative
            position embeddings [2 * span, d_model] (shared by all layers); None elsewhere.
        rel_norm: DeBERTa-v2/v3: path of the LayerNorm applied to those embeddings where the config's
            ``norm_rel_ebd`` asks for it (absent otherwise); None elsewhere.
    """

    stack: str
    kind: str
    layers: str
    attention: str
    o: str
    q: str | None = None
    k: str | None = None
    v: str | None = None
    qkv: str | None = None
    q_norm: str | None = None
    k_norm: str | None = None
    input_norm: str | None = None
    mlp: str | None = None
    mlp_norm: str | None = None
    attn_post: str | None = None
    mlp_post: str | None = None
    causal: bool = False
    stack_module: str = ""
    n_layers: Callable[..., int] | None = None
    bias_table: str | None = None
    rel_embeddings: str | None = None
    rel_norm: str | None = None

    def relative(self, path: str | None) -> str | None:
        """A layer-relative path made relative to the attention module (None if outside it)."""
        if path is None or not path.startswith(self.attention + "."):
            return None
        return path[len(self.attention) + 1:]


def one_stack(stack: str, layers: str, attention: str, o: str, **paths) -> tuple[SiteSpec]:
    """The one site kind of an encoder (``stack="encoder"``, bidirectional) or of a decoder-only
    model (``"decoder"``, causal self-attention): self-attention in every block of ``layers``."""
    return (SiteSpec(stack, "self", layers, attention, o, causal=stack == "decoder", **paths),)


@dataclass(frozen=True)
class ArchSpec:
    """Where the attention pieces of one architecture family live, and how it computes attention.

    Attributes:
        family: display name of the family (``"bert"``, ``"gpt2"``, ``"llama"``, ``"gpt_neox"`` ...).
        kind: ``"encoder"``, ``"decoder"`` (decoder-only, causal) or ``"encoder-decoder"``
            (:data:`MODEL_KINDS`).
        site_specs: the kinds of attention site, in forward order within a layer, each with its
            module paths (:class:`SiteSpec`): one self-attention kind for encoders and decoders;
            encoder self, decoder self and cross-attention for encoder-decoder models.
        qkv_layout: how queries, keys and values are projected:
            ``"separate"`` three ``nn.Linear`` (paths ``q``, ``k``, ``v``);
            ``"conv1d"`` one GPT-2 ``Conv1D`` (path ``qkv``, weight [in, 3 * heads * d_head], output
            q | k | v along the last dimension);
            ``"per_head"`` one ``nn.Linear`` whose output is laid out per head, [heads, 3, d_head]
            (GPT-NeoX ``query_key_value``);
            ``"stacked"`` one ``nn.Linear`` whose output is q (heads * d_head) | k | v
            (kv_heads * d_head each) (Phi-3 ``qkv_proj``);
            ``"grouped"`` one ``nn.Linear`` whose output is laid out per key/value head,
            [kv_heads, heads / kv_heads + 2, d_head]: the group's query heads, then its key and its
            value (Falcon's ``query_key_value``: ``[heads, 3, d_head]`` without grouping, q | k | v
            with one shared key/value head).
        conv1d: projections are GPT-2 ``Conv1D`` modules (``y = x @ W + b``, W is [in, out]), the
            output projection included; False for ``nn.Linear`` (W is [out, in]). The two fields are
            decoded once into :attr:`layout` (:mod:`probe.architectures.layout`).
        final_norm: path, relative to the base model, of a decoder's norm between the last block and
            the unembedding (None: none known).
        norm: how the family's norms compute: ``"layernorm"`` (centred, scaled, with a bias) or
            ``"rmsnorm"`` (scaled by the root mean square, no bias) (:data:`NORMS`).
        norm_offset: added to a norm's stored weight to give its gain (Gemma stores gain - 1: 1.0).
        final_softcap: ``config -> float | None``: the cap of the final logits' soft-capping
            (Gemma 2 and 3: ``cap * tanh(logits / cap)``), None for none.
        rotary: rotary position embedding applied to q and k (Su et al. 2021, RoFormer), in the
            "rotate half" layout on the first ``partial_rotary_factor * d_head`` dimensions.
        scaling: ``(config, d_head, layer) -> float``, the multiplier of q k^T.
        divide_keys: the original divides the keys by 1/scale before the product q k^T (DeBERTa);
            the reference does the same, for the original's rounding.
        softmax_dtype: dtype the original's eager softmax runs in (float32 for the LLaMA-style
            families, which upcast; None = the scores' dtype).
        upcast: ``config -> bool``: scores as well as softmax in float32 (GPT-2 option).
        window: ``(config, layer) -> int | None``: keys a query may see under a sliding window
            (itself included), None for no window.
        rope: ``(config, layer) -> dict | None``: RoPE settings of a layer (``rope_type``,
            ``rope_theta``, ``partial_rotary_factor`` and the type's own keys); None: no rotation in
            this configuration (Falcon with ALiBi).
        kv_heads: ``config -> int``: key/value heads per layer in the config (Falcon's multi-query
            and grouped variants).
        softcap: ``config -> float | None``: logit soft-capping cap (Gemma 2), None for none.
        position_offset: ``config -> int``: position-table rows before the first token (RoBERTa).
        head_count_attrs: attributes of the attention module equal to its number of query heads
            (what head pruning must update; empty where the module infers it from the weights).
        width_attrs: attributes equal to heads * d_head (the width of q and of the output
            projection's input).
        kv_group_attr: attribute holding query heads per key/value head (grouped-query attention),
            or None.
        kv_head_count_attrs: attributes of the attention module equal to its number of key/value
            heads, read at run time (Phi-3 slices its stacked projection by ``num_key_value_heads``).
        config_head_attrs: config attributes a module reads the head count from at run time
            (Phi-3 splits its fused projection by ``config.num_attention_heads``), which pruning must
            give the module its own value of (:func:`probe.pruning.removal.remove_heads` gives the
            module a view of the config with its own head count).
        cache_kwargs: names under which the attention module receives the key/value cache.
        probs: ``output -> probs | None``: the attention probabilities [batch, heads, query, key]
            in the attention module's output tuple (second; T5's modules return
            ``(output, position_bias, probs)``).
        note: ``config -> str | None``: what a user of this configuration must know about its maps,
            added to the loaded model's notes (Falcon with ALiBi), or None.
        padding_rows_masked: the model masks whole padding query rows as well as padding keys
            (DeBERTa's mask is m_i m_j), so a padding query's weights spread evenly over every key,
            padding included; checks of padding keys read real query rows only.
        probs_argument: name of the attention module's forward argument that must be True for it to
            return its probabilities (DeBERTa's ``output_attentions``; capture sets it), or None.
        removal_refusal: ``config -> str | None``: why physical head removal does not cover this
            configuration (DeBERTa's separate position projections), or None.
        pack: ``(attn_output, probs, bias) -> tuple``: the output tuple a replacement module returns
            (the original's layout).
        position_bias: the bias added to the scores
            (:class:`~probe.architectures.position_bias.PositionBias`: none, ALiBi for BLOOM, Press et
            al. 2022; T5's bucketed relative positions, Raffel et al. 2020).
        residual: ``(attn_output, kwargs) -> attn_output``: what the attention module adds to its
            output (BLOOM adds its input's residual; others nothing).
        implementation: the attention implementation probe measures under: ``"eager"`` (hand
            specs: the module returns its probabilities) or ``"probe"`` (a discovered spec:
            probe's own function inside transformers' ``AttentionInterface``, :mod:`probe.capture.interface`).
        fixed_sites: a discovered spec's sites, as found in a forward pass (empty: from the
            config, :func:`probe.architectures.sites`).
        dims: a discovered spec's ``(n_layers, n_heads, n_kv_heads, d_head, d_model)``
            (:class:`~probe.architectures.HeadGeometry`; d_head is a value head's width, what the
            output projection reads per head), or None: read from the config.
        site_paths: a discovered spec's layer of each fixed site (path relative to the base model;
            a layer shared by several sites, ALBERT's, appears once per site).
        missing: a discovered spec's projections that were not found and checked (``"q"``, ``"k"``,
            ``"v"``, ``"o"``): the analyses that need their weights refuse the model.
        capture_only: the model's attention is its own code, outside transformers' ``AttentionInterface``
            (RoFormer, XGLM ...): probe reads the maps its eager path returns (:attr:`probs`; built by
            :func:`probe.architectures.discovered.build_maps_spec`) for statistics, views and labels, and
            refuses by name everything else (verify, steps, block capture, interventions:
            :func:`probe.architectures.discovered.refuse_capture_only`).
    """

    family: str
    kind: str
    site_specs: tuple[SiteSpec, ...]
    qkv_layout: str = "separate"
    conv1d: bool = False
    final_norm: str | None = None
    norm: str = "layernorm"
    norm_offset: float = 0.0
    final_softcap: Callable[..., float | None] = _no_softcap
    rotary: bool = False
    scaling: Callable[..., float] = _inverse_sqrt_head
    divide_keys: bool = False
    softmax_dtype: torch.dtype | None = None
    upcast: Callable[..., bool] = _no_upcast
    window: Callable[..., int | None] = _no_window
    rope: Callable[..., dict | None] = _rope_single
    kv_heads: Callable[..., int] = _kv_heads_from_config
    softcap: Callable[..., float | None] = _no_softcap
    position_offset: Callable[..., int] = _no_offset
    head_count_attrs: tuple[str, ...] = ()
    width_attrs: tuple[str, ...] = ()
    kv_group_attr: str | None = None
    kv_head_count_attrs: tuple[str, ...] = ()
    config_head_attrs: tuple[str, ...] = ()
    cache_kwargs: tuple[str, ...] = ("cache", "past_key_values")
    probs: Callable[..., torch.Tensor | None] = _probs_second
    probs_argument: str | None = None
    padding_rows_masked: bool = False
    note: Callable[..., str | None] = _no_note
    removal_refusal: Callable[..., str | None] = _no_refusal
    pack: Callable[..., tuple] = _pack_pair
    position_bias: PositionBias = NO_POSITION_BIAS
    residual: Callable[..., torch.Tensor] = _no_residual
    implementation: str = "eager"
    fixed_sites: tuple[Site, ...] = ()
    dims: tuple[int, int, int, int, int] | None = None
    site_paths: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    capture_only: bool = False

    @property
    def discovered(self) -> bool:
        """Built from a forward pass (:mod:`probe.architectures.discovered`), not written by hand."""
        return self.implementation != "eager"

    def __post_init__(self) -> None:
        if self.qkv_layout not in QKV_LAYOUTS:
            raise ValueError(f"qkv_layout must be one of {QKV_LAYOUTS}, got {self.qkv_layout!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"kind must be one of {MODEL_KINDS}, got {self.kind!r}")
        found = {(s.stack, s.kind) for s in self.site_specs}
        expected = {"encoder": {("encoder", "self")}, "decoder": {("decoder", "self")},
                    "encoder-decoder": {("encoder", "self"), ("decoder", "self"), ("decoder", "cross")}}[self.kind]
        if found != expected or len(found) != len(self.site_specs):
            raise ValueError(f"{self.family} ({self.kind}) needs the site kinds {sorted(expected)} once each, "
                             f"got {sorted(found)}")

    @property
    def layout(self) -> ProjectionLayout:
        """The projection layout decoded once (:func:`probe.architectures.layout.projection_layout`)."""
        return projection_layout(self.qkv_layout, self.conv1d)
