"""Where a decoder's circuit graph meets its modules: per layer the block, the attention module (where
probe's attention function takes edits), the norm before the attention, the head weights, the rotary
embedding, the MLP and its norm; the final norm. And each head's query, key and value recomputed from
a residual stream of its own: the norm before the block, the head's projection (and q/k norm), the
rotation, batched over heads, so that every head can read a different stream.

Only pre-norm models whose residual stream is the sum of what the embeddings, heads and MLPs write
fit the graph; :func:`wire` refuses the others in one line. A parallel block whose MLP reads the
attention's own norm (Falcon's and GPT-J's one norm per block) fits: the MLP's input is that norm
recomputed from a stream of the MLP's own (:mod:`probe.circuits.forward`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..architectures import site_block, site_modules
from ..architectures.discovered import needs_weights
from ..architectures.modules import head_geometry, site_spec
from ..architectures.weights import AttentionWeights, attention_weights, block_mlp, final_norm, input_norm, mlp_norm
from ..errors import UnsupportedAnalysisError
from ..reference.rotary import Rope, apply_rope, apply_rope_pairs
from .parts import find_parts


@dataclass
class Layer:
    """One block's modules and weights.

    Attributes:
        block: the block (its input is the residual stream the heads read).
        attention: the attention module (the one that calls probe's attention function).
        norm: the norm before the attention.
        weights: the heads' weights (:class:`~probe.architectures.weights.AttentionWeights`).
        q_norm, k_norm: per-head norms on q and k (Qwen3, Gemma 3), or None.
        rope: the rotary embedding, or None without one.
        mlp: the MLP; mlp_norm: the norm whose output the MLP reads, or None where the MLP reads the
            attention's norm (``norm``: one norm for a parallel block, as Falcon's and GPT-J's).
        turn: a model whose spec was discovered: how q and k turn by the cos and sin the attention
            module receives (``position_embeddings``), one of :data:`TURNS` (chosen by the graph's check
            pass, :func:`probe.circuits.checked.checked_graph`); None: by the rotation the spec names.
    """

    block: nn.Module
    attention: nn.Module
    norm: nn.Module
    weights: AttentionWeights
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    rope: Rope | None
    mlp: nn.Module
    mlp_norm: nn.Module | None
    turn: str | None = None


@dataclass
class Wiring:
    """A decoder's layers and final norm, as the circuit graph reads them.

    Attributes:
        layers: one :class:`Layer` per block, in order.
        final_norm: the norm before the unembedding (its input is the logits' input).
    """

    layers: list[Layer]
    final_norm: nn.Module


def _refuse(lm, why: str) -> UnsupportedAnalysisError:
    return UnsupportedAnalysisError(f"circuits need a pre-norm model whose heads and MLPs add to the residual "
                                    f"stream; {lm.name}: {why}")


def _rope(lm, layer: int) -> Rope | None:
    params = lm.spec.rope(lm.model.config, layer) if lm.spec.rotary and not lm.spec.discovered else None
    if params is None:
        return None
    g = head_geometry(lm.model.config)
    return Rope.from_config(params, g.d_head, getattr(lm.model.config, "max_position_embeddings", None))


def check_kind(lm) -> None:
    """Refuse, before any pass, a model the head graph does not fit by its kind: an encoder-decoder
    model, or an encoder with a hand-written spec (BERT-style: its stream is normed after each
    residual add). A pre-norm encoder whose spec was discovered (ModernBERT) goes on to the graph's
    check.

    Raises:
        UnsupportedAnalysisError: not a decoder or a discovered encoder.
    """
    if lm.kind == "encoder" and not lm.spec.discovered:
        raise _refuse(lm, "it is a post-norm encoder (BERT-style: the stream is normed after each residual add, so "
                          "it is not the sum of what the heads and MLPs write); pre-norm encoders such as ModernBERT "
                          "fit")
    if lm.kind not in ("decoder", "encoder"):
        raise _refuse(lm, f"it is an {lm.kind} model")


def wire(lm) -> Wiring:
    """The modules and weights of every layer of ``lm`` (a :class:`~probe.core.LoadedModel`).

    Raises:
        UnsupportedAnalysisError: not a decoder, or a block without a norm before its attention, an
            MLP or a norm of the MLP's own named by its spec, or a model without a final norm.
    """
    check_kind(lm)
    lm.require_all_heads("circuits")
    model, spec, layers = lm.model, lm.spec, []
    if spec.discovered:
        needs_weights(spec, "circuits")
    found = find_parts(lm) if spec.discovered else None
    for i, (site, module) in enumerate(site_modules(model, spec)):
        block, paths = site_block(model, spec, site), site_spec(spec, site)
        if found is None:
            parts = {"norm": input_norm(model, spec, site), "mlp": block_mlp(model, spec, site),
                     "mlp_norm": mlp_norm(model, spec, site)}
        else:
            parts = {"norm": found.norm[i], "mlp": found.mlp[i], "mlp_norm": found.mlp_norm[i]}
        missing = [name for name, part in parts.items() if part is None]
        if missing == ["mlp_norm"]:
            missing = []  # the MLP reads the attention's norm (one norm per parallel block; the check's pass asks)
        if "norm" in missing and found is not None:
            raise _refuse(lm, f"probe found no norm before the attention in layer {site.layer} (a post-norm model: its "
                              "stream is normed after each residual add, so it is not the sum of what the heads and "
                              "MLPs write)")
        if missing:
            where = "its spec names" if found is None else "probe found"
            raise _refuse(lm, f"{where} no {' and no '.join(missing)} in layer {site.layer}")
        norms = [None if p is None else block.get_submodule(p) for p in (paths.q_norm, paths.k_norm)]
        layers.append(Layer(block, module, parts["norm"], attention_weights(model, spec, site), *norms,
                            _rope(lm, site.layer), parts["mlp"], parts["mlp_norm"],
                            TURNS[0] if spec.discovered else None))
    last = final_norm(model, spec) if found is None else found.final
    if last is None:
        raise _refuse(lm, "its spec names no final norm" if found is None else "probe found no final norm")
    return Wiring(layers, last)


def _project(layer: Layer, streams: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """streams [n, batch, T, d_model] through the block's norm and n heads' projection W [n, d_model,
    d_head] -> [batch, n, T, d_head]."""
    normed = layer.norm(streams)
    out = torch.einsum("nbtd,nde->bnte", normed, W.to(normed.dtype))
    return out if b is None else out + b.to(out.dtype)[None, :, None, :]


#: The ways a model whose spec was discovered may turn q and k by the (cos, sin) its attention module
#: receives, [batch, T, w]: ``half`` the "rotate half" layout (dimensions i and i + w/2; LLaMA, partial
#: where w is narrower than a head), ``none`` (a layer without rotation: SmolLM3's NoPE layers),
#: ``half-repeat`` (cos and sin of half width, repeated: gpt-oss), ``pairs`` (dimensions 2i and 2i + 1:
#: Cohere), ``pairs-half`` (the first half of cos and sin, each value twice, on pairs: GLM-4).
TURNS = ("half", "none", "half-repeat", "pairs", "pairs-half")


def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, how: str) -> torch.Tensor:
    """q or k [batch, heads, T, d_head] turned by cos, sin [batch or 1, T, w] the way ``how``
    (:data:`TURNS`) says."""
    if how == "none":
        return x
    if how == "half":
        return apply_rope(x, cos, sin)
    if how == "half-repeat":
        return apply_rope(x, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    if how == "pairs":
        return apply_rope_pairs(x, cos, sin)
    if how == "pairs-half":
        half = cos.shape[-1] // 2
        return apply_rope_pairs(x, cos[..., :half].repeat_interleave(2, -1), sin[..., :half].repeat_interleave(2, -1))
    raise ValueError(f"no turn {how!r}; turns: {', '.join(TURNS)}")


def _rotate(layer: Layer, x: torch.Tensor, turns: tuple | None) -> torch.Tensor:
    if layer.turn is not None:
        return x if turns is None else turn(x, turns[0].to(x.dtype), turns[1].to(x.dtype), layer.turn)
    if layer.rope is None:
        return x
    positions = torch.arange(x.shape[2], device=x.device)[None]
    cos, sin = layer.rope.cos_sin(positions, x.dtype)
    return apply_rope(x, cos, sin)


def recompute(layer: Layer, point: str, streams: torch.Tensor, turns: tuple | None = None) -> torch.Tensor:
    """A layer's queries, keys or values, each head from a residual stream of its own.

    Args:
        layer: the layer.
        point: ``"query"`` (one stream per query head), ``"key"`` or ``"value"`` (one per key/value head).
        streams: [n, batch, T, d_model] the stream each head reads (before the block's norm), n the
            heads of ``point``.
        turns: (cos, sin) [batch or 1, T, d_rot] the attention module received as
            ``position_embeddings`` (used where ``layer.turn`` is set), or None.

    Returns:
        [batch, n, T, d_head], as probe's attention function receives it: after the norm, the
        projection (and bias), the per-head q/k norm and the rotation (positions 0 .. T - 1: right-padded
        prompts without a cache).
    """
    w = layer.weights
    if point == "value":
        return _project(layer, streams, w.W_V, w.b_V)
    if point == "query":
        x, extra = _project(layer, streams, w.W_Q, w.b_Q), layer.q_norm
    else:
        x, extra = _project(layer, streams, w.W_K, w.b_K), layer.k_norm
    if extra is not None:
        x = extra(x)
    return _rotate(layer, x, turns)


def head_writes(layer: Layer, z: torch.Tensor) -> torch.Tensor:
    """What each head writes into the residual stream: z_h W_O^h (no output bias).

    Args:
        z: [batch, T, heads, d_head] the heads' outputs before the output projection.

    Returns:
        [heads, batch, T, d_model].
    """
    return torch.einsum("bthe,hed->hbtd", z, layer.weights.W_O.to(z.dtype))
