"""A tiny random model of any text model type of the installed transformers.

:func:`text_types` lists the model types (``config.model_type``) whose auto classes hold a text
model: encoder-decoders (``AutoModelForSeq2SeqLM``), decoders (``AutoModelForCausalLM``) and
encoders (``AutoModelForMaskedLM``, built bare with ``AutoModel``, as probe loads them).
:func:`tiny_config` shrinks a type's default config generically (2 layers, width 64, 4 heads, 2
key/value heads where the config has them, 64-wide feed-forward, 128 positions, 4 experts, layer
type lists cut to the layer count) and :func:`build` builds it with ``torch.manual_seed(0)``,
paired with a test tokenizer whose vocabulary the config is given.

Used by ``tools/models_table.py`` (the supported-models table) and its tests; not part of the
package.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers.models.auto import configuration_auto, modeling_auto

ROOT = Path(__file__).resolve().parents[1]
BPE = ROOT / "tests" / "data" / "bpe"

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, POSITIONS, EXPERTS = 2, 64, 4, 2, 64, 128, 4
HEAD_DIM = HIDDEN // HEADS

#: Sub-configs that say a type is not a text model (vision, speech, image tokens ...).
NOT_TEXT = ("vision", "audio", "vq", "image", "acoustic", "semantic", "projector", "speech", "video")

#: Config attributes set to a fixed tiny value wherever the default config has them (not None).
SIZES = {
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                     "num_decoder_layers", "num_encoder_layers", "num_hidden_groups"), LAYERS),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "model_dim", "embedding_size",
                     "word_embed_proj_dim", "hidden_dim_size", "backbone_hidden_size", "hidden_size_global"),
                    HIDDEN),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "n_attn_heads"), HEADS),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
                     "hidden_dim", "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "expert_intermediate_size", "dense_intermediate_size", "moe_ffn_hidden_size"), FFN),
    **dict.fromkeys(("head_dim", "d_kv", "attention_head_size", "kv_channels", "v_head_dim"), HEAD_DIM),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "n_ctx",
                     "max_target_positions", "max_source_positions", "seq_length", "max_length"), POSITIONS),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), EXPERTS),
    **dict.fromkeys(("mamba_d_ssm", "mamba_expand_dim"), HIDDEN),
    **dict.fromkeys(("mamba_n_heads", "mamba_num_heads", "ssm_num_heads"), HEADS),
    **dict.fromkeys(("mamba_d_head", "mamba_head_dim", "mamba_d_state", "ssm_state_size", "state_size", "d_state",
                     "mamba_chunk_size", "chunk_size"), HEAD_DIM),
    "moe_shared_expert_intermediate_size": FFN,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "rotary_dim": HEAD_DIM // 2, "rotary_emb_dim": HEAD_DIM // 2, "hidden_size_per_layer_input": HEAD_DIM,
}
#: Attributes capped (not raised) at a value: top-k routing, groups, windows.
CAPS = {"num_experts_per_tok": 2, "num_experts_per_token": 2, "moe_topk": 2, "top_k": 2, "moe_k": 2,
        "n_shared_experts": 1, "num_shared_experts": 1,
        "n_group": 1, "topk_group": 1, "sliding_window": 8, "attention_window": 8, "first_k_dense_replace": 1,
        "num_kv_heads": KV_HEADS, "num_kv_shared_layers": 0, "local_window_size": 8, "window_size": 8,
        "expand": 1, "mamba_expand": 1, "num_centroids": 64, "n_groups": 1, "mamba_n_groups": 1,
        "encoder_hash_byte_group_vocab": 1000, "attn_layer_period": LAYERS, "attn_layer_offset": LAYERS - 1}
#: Sizes set where the default config leaves them None (a model that cannot be built without them).
NONE_DEFAULTS = {"n_routed_experts": EXPERTS, "num_experts_per_tok": 2, "n_shared_experts": 1}
#: Structured settings with a tiny form (positions as axial factors, attention kinds as a pattern).
STRUCTURED = {"axial_pos_embds_dim": [HIDDEN // 2, HIDDEN // 2], "axial_pos_shape": [8, POSITIONS // 8],
              "attention_types": [[["global", "local"], LAYERS // 2]], "block_sizes": [1, 1],
              "block_repeats": [1, 1], "attn_layer_indices": [LAYERS - 1]}
#: Per-type settings where the shrunk default config does not build (the default itself leaves a value the
#: model needs unset, or a rule the config checks fails at the tiny sizes): the smallest change that builds,
#: merged into the shrunk config (a dict into a sub-config's dict).
OVERRIDES = {
    # the rotary embedding reads rope_parameters[layer_type]; the default leaves them empty
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # the attention reads its sub-config's rope_theta, which the default sub-config does not hold, and clamps
    # q, k, v with clip_qkv, None in the default (DBRX's checkpoints: 8)
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    # the default leaves layer_types None (a conv layer, then an attention layer)
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # the sparse-attention indexer's sizes are None in the default: 2 heads of 16, a budget of 16 keys in blocks of 4
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": HEAD_DIM,
                       "indexer_budget": 16, "indexer_compress_ratio": 4},
    # the indexer's heads per key head, and its layers inside the tiny model's two
    "kolibri1_1": {"index_num_heads": 1, "index_layers": [LAYERS - 1]},
    # the model needs a language id for each input; its config names the language its adapters use by default
    "xmod": {"default_language": "en_XX"},
    # hybrids whose default pattern puts no attention layer among the tiny model's two (Granite 4's checkpoints
    # and RecurrentGemma's mix them in): a recurrent layer, then an attention layer
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # one shared attention block tied across its hybrid layers: two of them, so that there is a layer to tie
    "zamba": {"layers_block_type": ["hybrid", "hybrid"]},
    # the query/key width is qk_nope + qk_rope (not derived); the linear-attention heads split the width; one
    # group of experts (8 groups of 4 experts would be empty)
    "bailing_hybrid": {"qk_head_dim": 16, "linear_head_dim": HEAD_DIM, "linear_num_heads": HEADS,
                       "num_expert_group": 1},
}
VOCAB_KEYS = ("vocab_size", "n_vocab", "padded_vocab_size", "vocab_size_per_layer_input")
LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers", "num_decoder_layers")
#: Key/value head counts: 2 where the default is grouped (fewer than the heads), else the head count.
KV_NAMES = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
             "cls_token_id", "mask_token_id", "unk_token_id")
#: Token ids set even where the default config does not list them (read by generation and shifting).
ALWAYS_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")


def text_types() -> list[tuple[str, str]]:
    """Every model type of the installed transformers with its kind, in the mapping's order.

    Returns:
        ``(model_type, kind)`` pairs; kind is ``"encoder-decoder"``, ``"decoder"``, ``"encoder"``
        or ``"not text"`` (no text auto class, or a sub-config that holds images, audio, video).
    """
    s2s = set(modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
    mlm = set(modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    clm = set(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    out = []
    for name in sorted(configuration_auto.CONFIG_MAPPING_NAMES):
        kind = ("encoder-decoder" if name in s2s else "encoder" if name in mlm else "decoder" if name in clm
                else "not text")
        if kind != "not text" and _multimodal(name):
            kind = "not text"
        out.append((name, kind))
    return out


def _multimodal(name: str) -> bool:
    try:
        subs = getattr(configuration_auto.CONFIG_MAPPING[name], "sub_configs", None) or {}
    except Exception:  # noqa: BLE001 - a config class that cannot even be imported: let build() report it
        return False
    return any(word in key for key in subs for word in NOT_TEXT)


def auto_class(kind: str):
    """The auto class probe loads a model of ``kind`` with (``probe.loading.checkpoints.model_class``)."""
    import transformers as tr

    return {"encoder-decoder": tr.AutoModelForSeq2SeqLM, "decoder": tr.AutoModelForCausalLM}.get(kind, tr.AutoModel)


def tokenizer_for(kind: str):
    """The test tokenizer a kind is paired with: the tests' byte-level BPE (vocab 1000) for every kind
    (small embeddings: fast builds), with ``<|im_end|>`` as pad, BOS ``<|im_start|>``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BPE)


def _shrunk_value(key: str, value, default: dict):
    if isinstance(value, bool):
        return value
    if value is None:  # a size the model derives (head width, key/value heads) or a broken default
        return {"head_dim": HEAD_DIM, "num_key_value_heads": KV_HEADS, **NONE_DEFAULTS}.get(key)
    if key in SIZES and isinstance(value, int | float):
        return SIZES[key]
    if key in CAPS and isinstance(value, int) and value > 0:
        return min(value, CAPS[key])
    if key in KV_NAMES and isinstance(value, int):
        heads = next((default[k] for k in ("num_attention_heads", "n_head", "num_heads") if k in default), None)
        return KV_HEADS if heads is None or value < heads else HEADS
    return value


def _equal(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that do not compare are different
        return False


def _per_layer(key: str, values: list, layers: int) -> list:
    """A per-layer list cut to ``layers`` entries that keeps every distinct value it can, in order of
    first appearance (a mix of sliding and full attention stays a mix); sizes shrunk like scalars."""
    distinct = []
    for v in values:
        if not any(_equal(v, d) for d in distinct):
            distinct.append(v)
    out = (distinct + [values[i % len(values)] for i in range(layers)])[:layers]
    if key in SIZES:
        out = [SIZES[key] if isinstance(v, int | float) and not isinstance(v, bool) else v for v in out]
    return out


def _per_layer_overrides(overrides: dict, default: dict) -> dict:
    """Per-layer overrides (``{"05": {"head_dim": 512}}``) kept for the last of the tiny model's layers
    (where the first one overridden moves), sizes scaled by the same ratio to the default as before."""
    first = overrides[min(overrides, key=int)]
    scaled = {}
    for key, value in first.items():
        base = default.get(key)
        if key in SIZES and isinstance(value, int) and isinstance(base, int) and base > 0:
            value = SIZES[key] * max(1, min(4, value // base))
        scaled[key] = value
    heads = first.get("num_attention_heads")
    for key in KV_NAMES:  # key/value heads as many as the query heads stay so (a config may require it)
        if key in first and heads is not None:
            scaled[key] = scaled["num_attention_heads"] if first[key] == heads else min(first[key], KV_HEADS)
    return {str(LAYERS - 1): scaled}


def _layer_count(default: dict) -> int | None:
    return next((default[k] for k in LAYER_KEYS if isinstance(default.get(k), int)), None)


def _rope(params, key_prefix: str = ""):
    """Rope parameters kept valid at 128 positions: an original length above it scaled down."""
    if not isinstance(params, dict):
        return params
    if all(isinstance(v, dict) for v in params.values()) and params:  # per layer type
        return {k: _rope(v) for k, v in params.items()}
    out = dict(params)
    if isinstance(out.get("original_max_position_embeddings"), int):
        out["original_max_position_embeddings"] = min(out["original_max_position_embeddings"], POSITIONS // 4)
    for name in ("short_factor", "long_factor"):  # longrope: one factor per rotary frequency
        if isinstance(out.get(name), list):
            out[name] = [1.0 + i / 10 for i in range(HEAD_DIM // 2)]
    if isinstance(out.get("mrope_section"), list):
        out.pop("mrope_section")
    return out


def tiny_config(model_type: str, vocab_size: int, token_ids: dict | None = None):
    """The default config of ``model_type`` shrunk to a tiny model (module docstring's sizes).

    Args:
        model_type: a key of ``transformers.CONFIG_MAPPING``.
        vocab_size: the tokenizer's vocabulary size (the model's embedding rows).
        token_ids: special token ids to set where the config has the attribute (pad, bos, eos ...).

    Returns:
        a config instance; sub-configs (encoder/decoder, text) shrunk the same way.

    Raises:
        Exception: whatever the config class raises on the shrunk values.
    """
    cls = configuration_auto.CONFIG_MAPPING[model_type]
    return _shrink(cls, vocab_size, token_ids or {})


def _shrink(cls, vocab_size: int, token_ids: dict, given: dict | None = None):
    default = cls(**(given or {})).to_dict()
    kw = {k: _shrunk_value(k, v, default) for k, v in default.items()
          if k in SIZES or k in CAPS or k in KV_NAMES or k in NONE_DEFAULTS or k == "head_dim"}
    layers = _layer_count(default)
    for key, value in default.items():
        if isinstance(value, list) and value and layers and len(value) == layers != LAYERS:
            kw[key] = _per_layer(key, value, LAYERS)
    kw.update({k: v for k, v in STRUCTURED.items() if k in default})
    if isinstance(default.get("per_layer_config"), dict) and default["per_layer_config"]:
        kw["per_layer_config"] = _per_layer_overrides(default["per_layer_config"], default)
    if "qk_rope_head_dim" in kw and default.get("head_dim") == default.get("qk_rope_head_dim"):
        kw["head_dim"] = kw["qk_rope_head_dim"]  # MLA configs rotate head_dim features: the rotary part's size
    kw = {k: v for k, v in kw.items() if not _equal(v, default[k])}
    for key in VOCAB_KEYS:
        if key in default:
            kw[key] = vocab_size
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(default.get(key), dict):
            kw[key] = _rope(default[key])
    for key, value in token_ids.items():
        if (key in default or key in ALWAYS_IDS) and value is not None:
            kw[key] = value
    for key, sub in (getattr(cls, "sub_configs", None) or {}).items():
        if isinstance(default.get(key), dict) and default[key].get("model_type") in configuration_auto.CONFIG_MAPPING:
            sub = configuration_auto.CONFIG_MAPPING[default[key]["model_type"]]  # an AutoConfig slot: its type
        if isinstance(default.get(key), dict) and hasattr(sub, "to_dict"):
            shrunk = _shrink(sub, vocab_size, token_ids, default[key]).to_dict()
            if any(not _equal(shrunk.get(k), v) for k, v in default[key].items() if k != "attn_implementation"):
                kw[key] = shrunk  # only a changed sub-config: some parents fill theirs in only when absent
    kw["attn_implementation"] = "eager"
    for key, value in (OVERRIDES.get(default.get("model_type"), {}) if given is None else {}).items():
        kw[key] = {**(kw.get(key) or default.get(key) or {}), **value} if isinstance(value, dict) and isinstance(
            default.get(key), dict) else value
    return cls(**{**(given or {}), **kw})


def special_ids(tokenizer) -> dict:
    """The tokenizer's special token ids by config attribute name (``pad_token_id`` ...)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else pad
    return {"pad_token_id": pad, "bos_token_id": bos, "eos_token_id": eos, "decoder_start_token_id": pad or 0,
            "sep_token_id": eos, "cls_token_id": bos, "mask_token_id": tokenizer.unk_token_id or 0,
            "unk_token_id": tokenizer.unk_token_id or 0}


def build(model_type: str, kind: str):
    """A tiny random model of ``model_type`` and its tokenizer, built with ``torch.manual_seed(0)``.

    Args:
        model_type: a key of ``transformers.CONFIG_MAPPING``.
        kind: ``"encoder"``, ``"decoder"`` or ``"encoder-decoder"`` (from :func:`text_types`).

    Returns:
        ``(model, tokenizer)``: the model in eval mode, float32, eager attention.

    Raises:
        Exception: whatever the config or model class raises.
    """
    tok = tokenizer_for(kind)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    config = tiny_config(model_type, len(tok), special_ids(tok))
    if kind == "decoder":  # a causal LM class of an encoder family (BertGeneration) reads the flag
        config.is_decoder = True
    torch.manual_seed(0)
    auto = auto_class(kind)
    entry = auto._model_mapping[type(config)]
    if isinstance(entry, tuple | list):  # several classes for one config: the first, named so from_config can pick
        config.architectures = [entry[0].__name__]
    model = auto.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    return model, tok
