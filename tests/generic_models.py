"""Tiny random models of model types without a hand-written spec (probe discovers them through
transformers' AttentionInterface): 2 layers, hidden 64, 4 heads (2 key/value heads where grouped),
vocabulary the test tokenizer's. ``generic_model(model_type)`` builds one in eval mode."""

from __future__ import annotations

import torch

#: Types whose attention calls the interface, and the tokenizer each uses (encoders: WordPiece).
GENERIC = (
    "opt", "gptj", "phi", "mixtral", "qwen2_moe", "qwen3_moe", "olmo", "olmo2", "stablelm", "cohere",
    "deepseek_v2", "deepseek_v3", "smollm3", "gpt_oss", "granite", "glm4", "starcoder2",
    "modernbert", "xlm-roberta", "albert", "mbart", "pegasus", "mt5", "umt5",
)
#: Types in transformers 5.24 whose attention modules compute attention themselves (refused).
OWN_ATTENTION = ("gpt_neox_japanese", "convbert")
ENCODER_TYPES = ("modernbert", "xlm-roberta", "albert", "convbert")

H, HEADS, KV, LAYERS, POS = 64, 4, 2, 2, 64


def _rotary(**extra) -> dict:
    return {**dict(hidden_size=H, intermediate_size=2 * H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                   num_key_value_heads=KV, max_position_embeddings=POS), **extra}


def _moe(**extra) -> dict:
    return _rotary(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, **extra)


def _seq2seq(**extra) -> dict:
    return dict(d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                decoder_attention_heads=HEADS, encoder_ffn_dim=2 * H, decoder_ffn_dim=2 * H,
                max_position_embeddings=POS, pad_token_id=0, decoder_start_token_id=1, bos_token_id=1,
                eos_token_id=2, **extra)


def _t5(**extra) -> dict:
    return dict(d_model=H, d_kv=16, d_ff=2 * H, num_layers=LAYERS, num_heads=HEADS, decoder_start_token_id=0,
                pad_token_id=0, eos_token_id=1, **extra)


def _mla(**extra) -> dict:
    return _rotary(num_key_value_heads=HEADS, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                   qk_nope_head_dim=16, v_head_dim=12, moe_intermediate_size=32, n_routed_experts=4,
                   num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1, **extra)


def generic_config(model_type: str, vocab_size: int, init: float = 0.3):
    """A tiny config of ``model_type`` (see :data:`GENERIC`)."""
    import transformers as tr

    builders = {
        "opt": lambda: tr.OPTConfig(hidden_size=H, num_hidden_layers=LAYERS, ffn_dim=2 * H, num_attention_heads=HEADS,
                                    word_embed_proj_dim=H, max_position_embeddings=POS, init_std=init),
        # OPT-350m's variants: project_in/project_out around a narrower embedding; post-LN blocks
        "opt-proj": lambda: tr.OPTConfig(hidden_size=H, num_hidden_layers=LAYERS, ffn_dim=2 * H,
                                         num_attention_heads=HEADS, word_embed_proj_dim=H // 2,
                                         max_position_embeddings=POS, init_std=init),
        "opt-postln": lambda: tr.OPTConfig(hidden_size=H, num_hidden_layers=LAYERS, ffn_dim=2 * H,
                                           num_attention_heads=HEADS, word_embed_proj_dim=H,
                                           do_layer_norm_before=False, max_position_embeddings=POS, init_std=init),
        "gptj": lambda: tr.GPTJConfig(n_embd=H, n_layer=LAYERS, n_head=HEADS, rotary_dim=8, n_positions=POS,
                                      bos_token_id=1, eos_token_id=2),
        "codegen": lambda: tr.CodeGenConfig(n_embd=H, n_layer=LAYERS, n_head=HEADS, rotary_dim=8, n_positions=POS,
                                            n_ctx=POS, bos_token_id=1, eos_token_id=2),
        "gpt_neox_japanese": lambda: tr.GPTNeoXJapaneseConfig(hidden_size=H, num_hidden_layers=LAYERS,
                                                              num_attention_heads=HEADS, intermediate_multiple_size=2,
                                                              max_position_embeddings=POS, bos_token_id=1,
                                                              eos_token_id=2),
        "phi": lambda: tr.PhiConfig(**_rotary(partial_rotary_factor=0.5)),
        "mixtral": lambda: tr.MixtralConfig(**_rotary(num_local_experts=4, num_experts_per_tok=2)),
        "qwen2_moe": lambda: tr.Qwen2MoeConfig(**_moe(shared_expert_intermediate_size=32)),
        "qwen3_moe": lambda: tr.Qwen3MoeConfig(**_moe(head_dim=16)),
        "olmo": lambda: tr.OlmoConfig(**_rotary(pad_token_id=0)),
        "olmo2": lambda: tr.Olmo2Config(**_rotary(pad_token_id=0)),
        "stablelm": lambda: tr.StableLmConfig(**_rotary(partial_rotary_factor=0.25)),
        "cohere": lambda: tr.CohereConfig(**_rotary(pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        "deepseek_v2": lambda: tr.DeepseekV2Config(**_mla()),
        "deepseek_v3": lambda: tr.DeepseekV3Config(**_mla()),
        "smollm3": lambda: tr.SmolLM3Config(**_rotary(pad_token_id=0, no_rope_layer_interval=2)),
        "gpt_oss": lambda: tr.GptOssConfig(**_rotary(head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                                     sliding_window=4, layer_types=["sliding_attention",
                                                                                    "full_attention"])),
        "granite": lambda: tr.GraniteConfig(**_rotary(attention_multiplier=0.2)),
        "diffllama": lambda: tr.DiffLlamaConfig(**_rotary()),
        "granite_swa": lambda: tr.GraniteSWAConfig(**_rotary(attention_multiplier=0.2, sliding_window=4,
                                                             layer_types=["sliding_attention", "full_attention"])),
        "glm4": lambda: tr.Glm4Config(**_rotary(head_dim=16, pad_token_id=0)),
        "starcoder2": lambda: tr.Starcoder2Config(**_rotary(sliding_window=4)),
        "modernbert": lambda: tr.ModernBertConfig(hidden_size=H, intermediate_size=2 * H, num_hidden_layers=LAYERS,
                                                  num_attention_heads=HEADS, max_position_embeddings=POS,
                                                  global_attn_every_n_layers=2, local_attention=POS,
                                                  pad_token_id=0, cls_token_id=101, sep_token_id=102),
        "xlm-roberta": lambda: tr.XLMRobertaConfig(hidden_size=H, intermediate_size=2 * H, num_hidden_layers=LAYERS,
                                                   num_attention_heads=HEADS, max_position_embeddings=POS + 2,
                                                   pad_token_id=0),
        "albert": lambda: tr.AlbertConfig(hidden_size=H, embedding_size=32, intermediate_size=2 * H,
                                          num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                          max_position_embeddings=POS, pad_token_id=0),
        "convbert": lambda: tr.ConvBertConfig(hidden_size=H, embedding_size=H, intermediate_size=2 * H,
                                              num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                              max_position_embeddings=POS, pad_token_id=0),
        "mbart": lambda: tr.MBartConfig(**_seq2seq()),
        "pegasus": lambda: tr.PegasusConfig(**_seq2seq()),
        "mt5": lambda: tr.MT5Config(**_t5()),
        "umt5": lambda: tr.UMT5Config(**_t5()),
    }
    config = builders[model_type]()
    config.vocab_size = vocab_size
    if hasattr(config, "initializer_range"):
        config.initializer_range = init
    for attr in ("init_std", "initializer_factor"):
        if hasattr(config, attr) and not model_type.startswith("opt"):
            setattr(config, attr, init if attr == "init_std" else 1.0)
    config._attn_implementation = "eager"
    return config


def generic_model(model_type: str, tokenizer, seed: int = 0, masked_lm: bool = False):
    """A random-init model of ``model_type`` (its LM head for decoders and encoder-decoder models,
    the bare model for encoders, or with its masked-LM head where ``masked_lm``), eager attention,
    eval mode."""
    import transformers as tr

    config = generic_config(model_type, len(tokenizer))
    cls = (tr.AutoModelForMaskedLM if masked_lm else tr.AutoModel if model_type in ENCODER_TYPES
           else tr.AutoModelForSeq2SeqLM if config.is_encoder_decoder else tr.AutoModelForCausalLM)
    torch.manual_seed(seed)
    return cls.from_config(config, attn_implementation="eager").eval()


def generic_lm(model_type: str, seed: int = 0, masked_lm: bool = False):
    """:func:`generic_model` wrapped by ``from_pretrained_objects`` (which discovers its spec), with the
    tests' WordPiece tokenizer for encoders and the BPE one otherwise."""
    from conftest import bert_tokenizer, bpe_tokenizer
    from probe.loading.models import from_pretrained_objects

    tok = bert_tokenizer() if model_type in ENCODER_TYPES else bpe_tokenizer()
    return from_pretrained_objects(generic_model(model_type, tok, seed, masked_lm), tok, name=f"tiny-{model_type}")
