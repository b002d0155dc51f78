"""Per-architecture knowledge: the only module that knows Hugging Face attribute paths.

Every supported ``model_type`` maps to one :class:`ArchSpec` saying where the transformer layers,
the attention module (the module whose ``forward`` returns ``(attn_output, attn_probs)``), the
query/key/value projections and the output projection live, and whether the model is causal,
rotary or uses grouped key/value heads. Everything else in ``probe`` asks this module instead of
hard-coding attribute names, so adding an architecture is one entry in :data:`SPECS`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .errors import UnsupportedArchitectureError


@dataclass(frozen=True)
class ArchSpec:
    """Where the attention pieces of one architecture family live.

    Paths are dotted attribute paths. ``layers`` is relative to the base model
    (``model.base_model``); every other path is relative to one layer.

    Attributes:
        family: ``"bert"``, ``"distilbert"``, ``"gpt2"`` or ``"llama"``.
        layers: path of the ``nn.ModuleList`` of transformer blocks.
        attention: path of the attention module whose forward returns
            ``(attn_output, attn_probs)`` with ``attn_probs`` shaped [batch, heads, query, key].
        q, k, v: paths of separate query/key/value ``nn.Linear`` projections, or ``None`` when fused.
        qkv: path of a fused GPT-2 ``Conv1D`` (weight [in, 3 * hidden]) holding q, k, v in that order.
        o: path of the output projection (input [batch, seq, heads * d_head]).
        o_in_attention: whether the output projection is applied inside ``attention``
            (GPT-2, LLaMA, DistilBERT) or after it, in a sibling module (BERT's ``attention.output.dense``).
        causal: decoder-only (causal self-attention).
        rotary: rotary position embedding applied to q and k (Su et al. 2021, RoFormer).
        conv1d: projections are GPT-2 ``Conv1D`` modules (``y = x @ W + b``, W is [in, out]).
    """

    family: str
    layers: str
    attention: str
    o: str
    q: str | None = None
    k: str | None = None
    v: str | None = None
    qkv: str | None = None
    o_in_attention: bool = True
    causal: bool = False
    rotary: bool = False
    conv1d: bool = False


_BERT = ArchSpec(
    family="bert", layers="encoder.layer", attention="attention.self",
    q="attention.self.query", k="attention.self.key", v="attention.self.value",
    o="attention.output.dense", o_in_attention=False,
)
_DISTILBERT = ArchSpec(
    family="distilbert", layers="transformer.layer", attention="attention",
    q="attention.q_lin", k="attention.k_lin", v="attention.v_lin", o="attention.out_lin",
)
_GPT2 = ArchSpec(
    family="gpt2", layers="h", attention="attn", qkv="attn.c_attn", o="attn.c_proj",
    causal=True, conv1d=True,
)
_LLAMA = ArchSpec(
    family="llama", layers="layers", attention="self_attn",
    q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj", o="self_attn.o_proj",
    causal=True, rotary=True,
)

#: model_type (``config.model_type``) -> spec. The supported architectures.
SPECS: dict[str, ArchSpec] = {
    "bert": _BERT,
    "roberta": _BERT,
    "electra": _BERT,
    "distilbert": _DISTILBERT,
    "gpt2": _GPT2,
    "llama": _LLAMA,
    "qwen2": _LLAMA,
    "mistral": _LLAMA,
}


def get_spec(config) -> ArchSpec:
    """Return the :class:`ArchSpec` for a Hugging Face config.

    Raises:
        UnsupportedArchitectureError: ``config.model_type`` is not in :data:`SPECS`; the message
            names the supported types.
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in SPECS:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type!r}; supported model types: {', '.join(sorted(SPECS))}"
        )
    if model_type in ("bert", "roberta", "electra") and getattr(config, "is_decoder", False):
        raise UnsupportedArchitectureError(
            f"{model_type} configured as a decoder (is_decoder=True) is not supported; use it as an encoder"
        )
    return SPECS[model_type]


@dataclass(frozen=True)
class HeadGeometry:
    """Head counts and sizes of one model.

    Attributes:
        n_layers: transformer blocks.
        n_heads: query heads per layer.
        n_kv_heads: key/value heads per layer (``n_heads`` unless grouped-query attention).
        d_head: size of one head (features).
        d_model: hidden size (features).
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int


def head_geometry(config) -> HeadGeometry:
    """Read layer/head counts and sizes from a Hugging Face config (any supported family)."""
    n_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", None) or config.n_layer
    n_heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", None) or config.n_head
    d_model = getattr(config, "hidden_size", None) or getattr(config, "dim", None) or config.n_embd
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    d_head = getattr(config, "head_dim", None) or d_model // n_heads
    return HeadGeometry(int(n_layers), int(n_heads), int(n_kv), int(d_head), int(d_model))


def base_model(model: nn.Module) -> nn.Module:
    """The bare transformer inside a model with a task head (``GPT2LMHeadModel.transformer`` ...)."""
    return getattr(model, "base_model", model)


def layer_modules(model: nn.Module, spec: ArchSpec) -> list[nn.Module]:
    """The transformer blocks of ``model``, in order."""
    return list(base_model(model).get_submodule(spec.layers))


def attention_modules(model: nn.Module, spec: ArchSpec) -> list[nn.Module]:
    """The attention module of every layer; each returns ``(attn_output, attn_probs)``."""
    return [layer.get_submodule(spec.attention) for layer in layer_modules(model, spec)]


def attention_path(spec: ArchSpec, layer: int) -> tuple[str, str]:
    """(parent path relative to the layer, attribute name) of layer ``layer``'s attention module."""
    parent, _, name = spec.attention.rpartition(".")
    return parent, name


def output_projections(model: nn.Module, spec: ArchSpec) -> list[nn.Module]:
    """The output projection of every layer (its input is [batch, seq, heads * d_head])."""
    return [layer.get_submodule(spec.o) for layer in layer_modules(model, spec)]


def linear_weight(module: nn.Module, conv1d: bool) -> torch.Tensor:
    """Weight of a projection as ``[out, in]`` (transposing GPT-2's ``Conv1D`` [in, out])."""
    return module.weight.t() if conv1d else module.weight
