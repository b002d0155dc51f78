"""The supported architectures: one :class:`~probe.architectures.spec.ArchSpec` per ``model_type``
(:data:`SPECS`), and :func:`get_spec`."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..errors import UnsupportedArchitectureError
from .discovered import DISCOVERED, model_kind
from .disentangled import disentangled_scaling, separate_position_projections
from .falcon import FALCON_ALIBI, alibi_note, kv_heads_multi_query, rope_unless_alibi
from .gpt_neo import always_upcast, local_window, no_scaling
from .mpnet import MPNET_RELATIVE, mpnet_offset, shared_bias_table
from .position_bias import ALIBI, DISENTANGLED, T5_RELATIVE
from .spec import (  # the rules the entries point at
    ArchSpec,
    SiteSpec,
    _final_logit_softcap,
    _gemma2_softcap,
    _gpt2_scaling,
    _gpt2_upcast,
    _no_softcap,
    _pack_t5,
    _probs_third,
    _query_pre_attn_scaling,
    _residual_inside,
    _roberta_offset,
    _rope_by_layer_type,
    _window_by_layer_type,
    _window_every_layer,
    one_stack,
)

_BERT = ArchSpec(
    family="bert", kind="encoder",
    site_specs=one_stack("encoder", "encoder.layer", "attention.self", "attention.output.dense",
                         q="attention.self.query", k="attention.self.key", v="attention.self.value"),
    head_count_attrs=("num_attention_heads",), width_attrs=("all_head_size",),
)
_ROBERTA = replace(_BERT, family="roberta", position_offset=_roberta_offset)
_DEBERTA_V2 = ArchSpec(
    family="deberta-v2", kind="encoder",
    site_specs=one_stack("encoder", "encoder.layer", "attention.self", "attention.output.dense",
                         q="attention.self.query_proj", k="attention.self.key_proj", v="attention.self.value_proj",
                         rel_embeddings="encoder.rel_embeddings", rel_norm="encoder.LayerNorm"),
    scaling=disentangled_scaling, divide_keys=True, position_bias=DISENTANGLED, probs_argument="output_attentions",
    padding_rows_masked=True, removal_refusal=separate_position_projections,
    head_count_attrs=("num_attention_heads",), width_attrs=("all_head_size",),
)
_MPNET = ArchSpec(
    family="mpnet", kind="encoder",
    site_specs=one_stack("encoder", "encoder.layer", "attention.attn", "attention.attn.o", q="attention.attn.q",
                         k="attention.attn.k", v="attention.attn.v", bias_table="encoder.relative_attention_bias"),
    position_bias=MPNET_RELATIVE, position_offset=mpnet_offset, probs_argument="output_attentions",
    removal_refusal=shared_bias_table,
    head_count_attrs=("num_attention_heads",), width_attrs=("all_head_size",),
)
_DISTILBERT = ArchSpec(
    family="distilbert", kind="encoder",
    site_specs=one_stack("encoder", "transformer.layer", "attention", "attention.out_lin",
                         q="attention.q_lin", k="attention.k_lin", v="attention.v_lin"),
    head_count_attrs=("n_heads",),
)
_GPT2 = ArchSpec(
    family="gpt2", kind="decoder",
    site_specs=one_stack("decoder", "h", "attn", "attn.c_proj", qkv="attn.c_attn", input_norm="ln_1", mlp="mlp",
                         mlp_norm="ln_2"),
    qkv_layout="conv1d", conv1d=True, final_norm="ln_f", scaling=_gpt2_scaling, upcast=_gpt2_upcast,
    head_count_attrs=("num_heads",), width_attrs=("split_size", "embed_dim"),
)
_GPT_NEO = ArchSpec(
    family="gpt_neo", kind="decoder",
    site_specs=one_stack("decoder", "h", "attn.attention", "attn.attention.out_proj", q="attn.attention.q_proj",
                         k="attn.attention.k_proj", v="attn.attention.v_proj", input_norm="ln_1", mlp="mlp",
                         mlp_norm="ln_2"),
    final_norm="ln_f", scaling=no_scaling, upcast=always_upcast, window=local_window,
    cache_kwargs=("layer_past", "cache", "past_key_values"), head_count_attrs=("num_heads",),
)
#: a pre-norm decoder block's norm, MLP and the MLP's norm
_PRE_NORM = dict(input_norm="input_layernorm", mlp="mlp", mlp_norm="post_attention_layernorm")
_LLAMA_SITES = one_stack("decoder", "layers", "self_attn", "self_attn.o_proj", q="self_attn.q_proj",
                         k="self_attn.k_proj", v="self_attn.v_proj", **_PRE_NORM)
_QK_NORM_SITES = one_stack("decoder", "layers", "self_attn", "self_attn.o_proj", q="self_attn.q_proj",
                           k="self_attn.k_proj", v="self_attn.v_proj", q_norm="self_attn.q_norm",
                           k_norm="self_attn.k_norm", **_PRE_NORM)
_LLAMA = ArchSpec(
    family="llama", kind="decoder", site_specs=_LLAMA_SITES, rotary=True, softmax_dtype=torch.float32,
    kv_group_attr="num_key_value_groups", final_norm="norm", norm="rmsnorm",
)
_MISTRAL = replace(_LLAMA, family="mistral", window=_window_every_layer)
_QWEN2 = replace(_LLAMA, family="qwen2", window=_window_by_layer_type)
_QWEN3 = replace(_QWEN2, family="qwen3", site_specs=_QK_NORM_SITES)
_GPT_NEOX = ArchSpec(
    family="gpt_neox", kind="decoder",
    site_specs=one_stack("decoder", "layers", "attention", "attention.dense", qkv="attention.query_key_value",
                         **_PRE_NORM),
    qkv_layout="per_head", rotary=True, softmax_dtype=torch.float32, final_norm="final_layer_norm",
    cache_kwargs=("layer_past", "cache", "past_key_values"),
)
_PHI3 = ArchSpec(
    family="phi3", kind="decoder",
    site_specs=one_stack("decoder", "layers", "self_attn", "self_attn.o_proj", qkv="self_attn.qkv_proj",
                         **_PRE_NORM),
    final_norm="norm", norm="rmsnorm", qkv_layout="stacked", rotary=True, softmax_dtype=torch.float32,
    window=_window_every_layer,
    kv_group_attr="num_key_value_groups", kv_head_count_attrs=("num_key_value_heads",),
    config_head_attrs=("num_attention_heads",),
)
_GEMMA = replace(_LLAMA, family="gemma", norm_offset=1.0)  # Gemma's RMSNorm multiplies by 1 + weight
#: Gemma 2 and 3: a norm on each sub-layer's output before its residual add, and the MLP's own norm
_SANDWICH = dict(input_norm="input_layernorm", mlp="mlp", mlp_norm="pre_feedforward_layernorm",
                 attn_post="post_attention_layernorm", mlp_post="post_feedforward_layernorm")
_GEMMA2 = replace(_GEMMA, family="gemma2", scaling=_query_pre_attn_scaling, final_softcap=_final_logit_softcap,
                  window=_window_by_layer_type, softcap=_gemma2_softcap,
                  site_specs=one_stack("decoder", "layers", "self_attn", "self_attn.o_proj", q="self_attn.q_proj",
                                       k="self_attn.k_proj", v="self_attn.v_proj", **_SANDWICH))
_GEMMA3 = replace(_GEMMA2, family="gemma3", softcap=_no_softcap, rope=_rope_by_layer_type,
                  site_specs=one_stack("decoder", "layers", "self_attn", "self_attn.o_proj", q="self_attn.q_proj",
                                       k="self_attn.k_proj", v="self_attn.v_proj", q_norm="self_attn.q_norm",
                                       k_norm="self_attn.k_norm", **_SANDWICH))

def _bart_sites(prefix_q: str = "q_proj", out: str = "out_proj") -> tuple[SiteSpec, ...]:
    def site(stack, kind, module, causal):
        return SiteSpec(stack, kind, f"{stack}.layers", module, f"{module}.{out}", q=f"{module}.{prefix_q}",
                        k=f"{module}.k_proj", v=f"{module}.v_proj", causal=causal, stack_module=stack,
                        n_layers=lambda c, s=stack: getattr(c, f"{s}_layers"))
    return (site("encoder", "self", "self_attn", False), site("decoder", "self", "self_attn", True),
            site("decoder", "cross", "encoder_attn", False))


def _t5_sites() -> tuple[SiteSpec, ...]:
    def site(stack, kind, module, causal):
        return SiteSpec(stack, kind, f"{stack}.block", module, f"{module}.o", q=f"{module}.q", k=f"{module}.k",
                        v=f"{module}.v", causal=causal, stack_module=stack,
                        n_layers=lambda c, s=stack: c.num_layers if s == "encoder" else c.num_decoder_layers,
                        bias_table=f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias"
                        if kind == "self" else None)
    return (site("encoder", "self", "layer.0.SelfAttention", False),
            site("decoder", "self", "layer.0.SelfAttention", True),
            site("decoder", "cross", "layer.1.EncDecAttention", False))


_BART = ArchSpec(
    family="bart", kind="encoder-decoder", site_specs=_bart_sites(), head_count_attrs=("num_heads",),
    width_attrs=("embed_dim",),
)
_T5 = ArchSpec(
    family="t5", kind="encoder-decoder", site_specs=_t5_sites(), scaling=no_scaling, probs=_probs_third,
    pack=_pack_t5, position_bias=T5_RELATIVE, head_count_attrs=("n_heads",), width_attrs=("inner_dim",),
)
_BLOOM = ArchSpec(
    family="bloom", kind="decoder",
    site_specs=one_stack("decoder", "h", "self_attention", "self_attention.dense",
                         qkv="self_attention.query_key_value", **_PRE_NORM),
    final_norm="ln_f", qkv_layout="per_head", softmax_dtype=torch.float32, position_bias=ALIBI,
    residual=_residual_inside,
    cache_kwargs=("layer_past", "cache", "past_key_values"), head_count_attrs=("num_heads",),
    width_attrs=("hidden_size", "split_size"),
)
_FALCON = ArchSpec(
    family="falcon", kind="decoder",
    site_specs=one_stack("decoder", "h", "self_attention", "self_attention.dense",
                         qkv="self_attention.query_key_value", input_norm="input_layernorm|ln_attn", mlp="mlp",
                         mlp_norm="post_attention_layernorm|ln_mlp"),
    final_norm="ln_f", qkv_layout="grouped", rotary=True, rope=rope_unless_alibi, kv_heads=kv_heads_multi_query,
    position_bias=FALCON_ALIBI, kv_head_count_attrs=("num_kv_heads",), probs_argument="output_attentions",
    note=alibi_note,
    cache_kwargs=("layer_past", "cache", "past_key_values"),
)

#: model_type (``config.model_type``) -> spec. The supported architectures.
SPECS: dict[str, ArchSpec] = {
    "bert": _BERT,
    "roberta": _ROBERTA,
    "electra": _BERT,
    "distilbert": _DISTILBERT,
    "mpnet": _MPNET,
    "deberta-v2": _DEBERTA_V2,
    "gpt2": _GPT2,
    "gpt_neo": _GPT_NEO,
    "llama": _LLAMA,
    "qwen2": _QWEN2,
    "qwen3": _QWEN3,
    "mistral": _MISTRAL,
    "gpt_neox": _GPT_NEOX,
    "phi3": _PHI3,
    "gemma": _GEMMA,
    "gemma2": _GEMMA2,
    "gemma3_text": _GEMMA3,
    "bloom": _BLOOM,
    "falcon": _FALCON,
    "bart": _BART,
    "marian": _BART,
    "t5": _T5,
}


def get_spec(config) -> ArchSpec:
    """Return the :class:`ArchSpec` for a Hugging Face config: the hand-written entry of
    :data:`SPECS`, else the spec discovered when a model of that type was loaded
    (:data:`probe.architectures.discovered.DISCOVERED`).

    Raises:
        UnsupportedArchitectureError: ``config.model_type`` is in neither (the message names the
            hand-written types), or a configuration probe cannot measure (an encoder family
            configured as a decoder, a Gemma model with bidirectional attention).
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in SPECS and model_type in DISCOVERED:
        return DISCOVERED[model_type]
    if model_type not in SPECS:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type!r}; supported model types: {', '.join(sorted(SPECS))}, and "
            "any type whose attention calls transformers' AttentionInterface (discovered when loaded)"
        )
    if model_type in ("bert", "roberta", "electra") and getattr(config, "is_decoder", False):
        raise UnsupportedArchitectureError(
            f"{model_type} configured as a decoder (is_decoder=True) is not supported; use it as an encoder"
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedArchitectureError(
            f"{model_type} with use_bidirectional_attention=True is not supported (probe treats it as causal)")
    return SPECS[model_type]


def kind_of(config) -> str:
    """The kind of model of a config (``"encoder"``, ``"decoder"``, ``"encoder-decoder"``): its hand
    spec's, else read from the config and transformers' auto classes
    (:func:`probe.architectures.discovered.model_kind`), before any discovery."""
    model_type = getattr(config, "model_type", None)
    return SPECS[model_type].kind if model_type in SPECS else model_kind(config)
