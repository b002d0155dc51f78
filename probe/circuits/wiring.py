"""Where a decoder's circuit graph meets its modules: per layer the block, the attention module (where
probe's attention function takes edits), the norm before the attention, the head weights, the rotary
embedding, the MLP and its norm; the final norm. And each head's query, key and value recomputed from
a residual stream of its own: the norm before the block, the head's projection (and q/k norm), the
rotation, batched over heads, so that every head can read a different stream.

Only pre-LN models whose residual stream is the sum of what the embeddings, heads and MLPs write
fit the graph; :func:`wire` refuses the others in one line. A parallel block whose MLP reads the
attention's own norm (Falcon's and GPT-J's one norm per block) fits: the MLP's input is that norm
recomputed from a stream of the MLP's own (:mod:`probe.circuits.forward`). So does a norm after a
sub-layer, before its residual add (Gemma 2 and 3, GLM-4, OLMo2): the MLP's write is that norm's
output, and each head's write is its z_h W_O^h through the attention's post-norm with the per-token
scale of the pass (the norm is linear in its input once the scale is fixed, so the heads' writes add
up to the norm's output exactly; :func:`head_writes`).

Where the projections are not a spec's (a discovered spec whose projections probe did not find:
MLA's low-rank projections, a q/k norm over the whole projection; or a layer whose recomputed inputs
do not match: queries scaled inside the module as OPT's, a rotation computed inside it as GPT-J's),
each head's inputs are recomputed by *rerunning the attention module itself* on the streams, one copy
of the batch per head, and keeping head h's q, k or v of copy h (:func:`rerun`): the model's own
code, so every such family is fed as the others are, and the check pass proves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..architectures import site_block, site_modules
from ..architectures.discovered import needs_weights
from ..architectures.modules import head_geometry, site_spec
from ..architectures.weights import (
    AttentionWeights,
    attention_weights,
    block_mlp,
    final_norm,
    frozen_as,
    input_norm,
    mlp_norm,
    norm_rule,
    output_weights,
    present_module,
)
from ..capture.reference.rotary import Rope, apply_rope, apply_rope_pairs
from ..causal.parts import check_pre_ln, find_parts
from ..errors import UnsupportedAnalysisError


@dataclass
class Layer:
    """One block's modules and weights.

    Attributes:
        block: the block (its input is the residual stream the heads read).
        attention: the attention module (the one that calls probe's attention function).
        norm: the norm before the attention, or None where the heads read the stream itself (OLMo2).
        weights: the heads' weights (:class:`~probe.architectures.weights.AttentionWeights`).
        q_norm, k_norm: per-head norms on q and k (Qwen3, Gemma 3), or None.
        rope: the rotary embedding, or None without one.
        mlp: the MLP; mlp_norm: the norm whose output the MLP reads, or None where the MLP reads the
            attention's norm (``norm``: one norm for a parallel block, as Falcon's and GPT-J's) or, where
            ``norm`` is None too, the stream itself (OLMo2).
        turn: a model whose spec was discovered: how q and k turn by the cos and sin the attention
            module receives (``position_embeddings``), one of :data:`TURNS` (chosen by the graph's check
            pass, :func:`probe.circuits.checked.checked_graph`); None: by the rotation the spec names.
        mlp_out: the module whose output is the MLP's write where the MLP is several modules (OPT's
            ``fc2``), else None (``mlp``'s).
        attn_post, mlp_post: the norms after the attention and after the MLP, before their residual
            adds (Gemma 2 and 3, GLM-4, OLMo2), or None.
        rerun: q, k and v are recomputed by rerunning the attention module (:func:`rerun`), not
            from the weights (``weights`` then holds W_O and b_O only).
        post_norm: ``attn_post`` linearised (:func:`probe.architectures.weights.linear_norm`'s
            ``(norm, kind, offset)``), set by :func:`wire`.
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
    mlp_out: nn.Module | None = None
    attn_post: nn.Module | None = None
    mlp_post: nn.Module | None = None
    rerun: bool = False
    post_norm: object = None

    @property
    def writer(self) -> nn.Module:
        """The module whose output is the MLP's write: its post-norm, else its last module."""
        return self.mlp_post or self.mlp_out or self.mlp


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


def check_kind(lm, what: str = "circuits") -> None:
    """Refuse, before any pass, a model the head graph does not fit by its kind: an encoder-decoder
    model, or a post-LN model (:func:`probe.causal.parts.check_pre_ln`). A pre-norm encoder whose
    spec was discovered (ModernBERT) goes on to the graph's check.

    Raises:
        UnsupportedAnalysisError: not a decoder or a discovered encoder; a post-LN model.
    """
    if lm.kind not in ("decoder", "encoder"):
        raise _refuse(lm, f"it is an {lm.kind} model")
    check_pre_ln(lm, what)


def wire(lm) -> Wiring:
    """The modules and weights of every layer of ``lm`` (a :class:`~probe.core.LoadedModel`).

    Raises:
        UnsupportedAnalysisError: not a decoder, or a block without a norm before its attention, an
            MLP or a norm of the MLP's own named by its spec, or a model without a final norm.
    """
    check_kind(lm)
    lm.require_all_heads("circuits")
    model, spec, layers = lm.model, lm.spec, []
    rerun_all = spec.discovered and any(p in spec.missing for p in ("q", "k", "v"))
    needs_weights(spec, "circuits", ("o",) if rerun_all else ("q", "k", "v", "o"))
    found = find_parts(lm) if spec.discovered else None
    for i, (site, module) in enumerate(site_modules(model, spec)):
        block, paths = site_block(model, spec, site), site_spec(spec, site)
        if found is None:
            parts = {"norm": input_norm(model, spec, site), "mlp": block_mlp(model, spec, site),
                     "mlp_norm": mlp_norm(model, spec, site), "mlp_out": None,
                     "attn_post": present_module(block, paths.attn_post),
                     "mlp_post": present_module(block, paths.mlp_post)}
        else:
            parts = {"norm": found.norm[i], "mlp": found.mlp[i], "mlp_norm": found.mlp_norm[i],
                     "mlp_out": found.mlp_out[i], "attn_post": found.attn_post[i], "mlp_post": found.mlp_post[i]}
        missing = [name for name in ("norm", "mlp") if parts[name] is None]
        if missing == ["norm"] and parts["attn_post"] is not None:
            missing = []  # the heads read the stream itself, their sub-layer normed after (OLMo2)
        if missing:
            where = "its spec names" if found is None else "probe found"
            raise _refuse(lm, f"{where} no {' and no '.join(missing)} in layer {site.layer}")
        if rerun_all:
            W_O, b_O = output_weights(model, spec, site)
            w = AttentionWeights(None, None, None, None, None, None, W_O, b_O)
        else:
            w = attention_weights(model, spec, site)
        if parts["attn_post"] is not None and w.b_O is not None:
            raise _refuse(lm, f"its output projection has a bias before the norm after the attention in layer "
                              f"{site.layer}, which no head's write holds")
        norms = [None if p is None else block.get_submodule(p) for p in (paths.q_norm, paths.k_norm)]
        layer = Layer(block, module, parts["norm"], w, *norms, _rope(lm, site.layer), parts["mlp"],
                      parts["mlp_norm"], TURNS[0] if spec.discovered and not rerun_all else None, parts["mlp_out"],
                      parts["attn_post"], parts["mlp_post"], rerun_all)
        layers.append(layer)
    last = final_norm(model, spec) if found is None else found.final
    if last is None:
        raise _refuse(lm, "its spec names no final norm" if found is None else "probe found no final norm")
    return Wiring(layers, last)


def _project(layer: Layer, streams: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, heads=None) -> torch.Tensor:
    """streams [n, batch, T, d_model] through the block's norm and n heads' projection W [n, d_model,
    d_head] (the heads ``heads`` of W and b, when given) -> [batch, n, T, d_head]."""
    if heads is not None:
        W, b = W[heads], None if b is None else b[heads]
    normed = streams if layer.norm is None else layer.norm(streams)
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


class Taken(Exception):
    """Raised inside a rerun attention module's call of probe's attention function, carrying what it
    received (:func:`rerun`): ``tensors`` point -> [batch, heads, T, d]."""

    def __init__(self, tensors: dict) -> None:
        super().__init__("q, k and v taken")
        self.tensors = tensors


#: The attention module being rerun now (its editors raise :class:`Taken`), or None.
RERUNNING: list[nn.Module] = []


def _copies(x, n: int, batch: int):
    """A call argument with every tensor of two or more dimensions over the batch repeated ``n`` times
    along it (copy-major: copy c holds rows c * batch ... ); tuples, lists and dicts inside too."""
    if isinstance(x, torch.Tensor):
        return x.repeat(n, *[1] * (x.dim() - 1)) if x.dim() >= 2 and x.shape[0] == batch else x
    if isinstance(x, (tuple, list)):
        return type(x)(_copies(t, n, batch) for t in x)
    if isinstance(x, dict):
        return {k: _copies(v, n, batch) for k, v in x.items()}
    return x


def rerun(layer: Layer, point: str, streams: torch.Tensor, call: tuple) -> torch.Tensor:
    """A layer's queries, keys or values, each head from a stream of its own, by the attention module's
    own code: the module runs once on all the streams (normed by the block's norm, if any), one copy
    of the batch per stream, with the other arguments of its call in the pass repeated alike; its call
    of probe's attention function stops at once (:class:`Taken`), and head h is taken from copy h.

    Args:
        streams: [n, batch, T, d_model], n the heads of ``point``.
        call: (args, kwargs) of the module's call in the pass.

    Returns:
        [batch, n, T, d_head] as the attention function receives it.
    """
    args, kwargs = call
    n, batch = streams.shape[:2]
    x = streams if layer.norm is None else layer.norm(streams)
    x = x.reshape(n * batch, *x.shape[2:])
    kwargs = {k: _copies(v, n, batch) for k, v in kwargs.items()}
    if args:
        args = (x, *(_copies(a, n, batch) for a in args[1:]))
    else:
        kwargs["hidden_states"] = x
    RERUNNING.append(layer.attention)
    try:
        layer.attention(*args, **kwargs)
    except Taken as taken:
        got = taken.tensors[point]
    else:
        raise UnsupportedAnalysisError(f"circuits: {type(layer.attention).__name__} did not call probe's attention "
                                       "function when rerun")
    finally:
        RERUNNING.pop()
    got = got.reshape(n, batch, *got.shape[1:])  # [copies, batch, heads, T, d]
    own = torch.arange(n, device=got.device)
    return got[own, :, own].transpose(0, 1)  # head h of copy h: [batch, n, T, d]


def recompute(layer: Layer, point: str, streams: torch.Tensor, turns: tuple | None = None,
              heads: list[int] | None = None) -> torch.Tensor:
    """A layer's queries, keys or values, each head from a residual stream of its own.

    Args:
        layer: the layer.
        point: ``"query"`` (one stream per query head), ``"key"`` or ``"value"`` (one per key/value head).
        streams: [n, batch, T, d_model] the stream each head reads (before the block's norm), n the
            heads of ``point`` (or of ``heads``).
        turns: (cos, sin) [batch or 1, T, d_rot] the attention module received as
            ``position_embeddings`` (used where ``layer.turn`` is set), or None.
        heads: the heads (of ``point``) the streams are for, in order, or None: all of them.

    Returns:
        [batch, n, T, d_head], as probe's attention function receives it: after the norm, the
        projection (and bias), the per-head q/k norm and the rotation (positions 0 .. T - 1: right-padded
        prompts without a cache).
    """
    w = layer.weights
    if point == "value":
        return _project(layer, streams, w.W_V, w.b_V, heads)
    if point == "query":
        x, extra = _project(layer, streams, w.W_Q, w.b_Q, heads), layer.q_norm
    else:
        x, extra = _project(layer, streams, w.W_K, w.b_K, heads), layer.k_norm
    if extra is not None:
        x = extra(x)
    return _rotate(layer, x, turns)


def head_writes(layer: Layer, z: torch.Tensor, spec=None, heads: list[int] | None = None) -> torch.Tensor:
    """What each head writes into the residual stream: z_h W_O^h (no output bias); with a norm after
    the attention (``layer.attn_post``), that norm with each token's scale frozen at the sum of the
    heads' z_h W_O^h in this pass (:func:`probe.architectures.weights.frozen_norm`), so that the writes
    add up to the norm's output.

    Args:
        z: [batch, T, heads, d_head] the heads' outputs before the output projection.
        spec: the model's spec (its norm rule; needed with ``attn_post``).
        heads: the heads whose writes are wanted, or None: all (with ``attn_post``: always all, the
            norm's scale is their sum's).

    Returns:
        [heads, batch, T, d_model] (those of ``heads``, in order).
    """
    if heads is not None and layer.attn_post is None:
        return torch.einsum("bthe,hed->hbtd", z[:, :, heads], layer.weights.W_O[heads].to(z.dtype))
    x = torch.einsum("bthe,hed->hbtd", z, layer.weights.W_O.to(z.dtype))
    if layer.attn_post is None:
        return x
    total = x.detach().sum(0)
    if layer.post_norm is None:
        layer.post_norm = norm_rule(spec, layer.attn_post, total)
    fn, beta = frozen_as(*layer.post_norm, layer.attn_post, total)
    return fn(x.double()).to(x.dtype) + (beta / len(x)).to(x.dtype)
