"""One forward pass of a decoder with every downstream input of the circuit graph fed separately.

A *feed* decides, input by input, what stream that input reads (:meth:`Feed.fed`; most feeds say
what is added to the pass's own stream, :meth:`Feed.delta`): the model's own (its own pass), plus a
zero tensor that asks for a gradient, or a stream that patches some edges. It is also told what
every writer wrote (:meth:`Feed.wrote`) where it listens (:meth:`Feed.listens`).
The pass itself (:func:`split_pass`) hooks, through :func:`probe.capture.hooks.measuring` and the editors of
probe's attention function:

- each block's input (the stream its heads read; block 0's input is the embeddings' write, and may
  be replaced, for integrated gradients);
- each head's query, key and value: recomputed from the stream the feed gives that head
  (:func:`probe.circuits.wiring.recompute`) where it gives one (a model whose spec was discovered:
  turned by the cos and sin its attention module received);
- each head's output z (read, and replaced where the feed says: z_h W_O^h is the head's write, computed
  only for a feed that listens);
- the MLP's norm (the stream the feed gives, else its own input) and the MLP's output (read; its
  post-norm's output where it has one); where the MLP reads the attention's norm (one norm per
  parallel block: Falcon, GPT-J), the MLP's input is that norm of the stream the feed gives, so the MLP
  and the heads read streams of their own; where it reads the stream itself (OLMo2), the fed stream;
- the final norm's input (the logits' input): the stream the feed gives.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from ..capture.hooks import calls_function, input_device, measuring
from ..capture.interface import edit, install
from ..errors import UnsupportedAnalysisError
from .wiring import RERUNNING, Taken, Wiring, head_writes, recompute, rerun

#: The attention function's points that carry a head's inputs, by graph input kind.
POINT_OF = {"q": "query", "k": "key", "v": "value"}


@dataclass
class Heads:
    """What some heads of one (kind, layer) read, as a feed may give it instead of every head's stream
    (:meth:`Feed.fed`): ``streams`` [r, batch, T, d_model] for the heads ``recompute`` (recomputed from
    them), ``given`` [batch, g, T, d_head] taken as they are for the heads ``fixed``; every other head
    keeps what the attention received (the model's own)."""

    streams: torch.Tensor | None = None
    recompute: list[int] = field(default_factory=list)
    given: torch.Tensor | None = None
    fixed: list[int] = field(default_factory=list)


class Feed:
    """What a split pass adds at each input and what it is told of each write (the base class adds
    nothing and listens to nothing: the model's own pass)."""

    def delta(self, kind: str, layer: int) -> torch.Tensor | None:
        """The addition to the stream read by the inputs of ``kind`` in ``layer``: [n, batch, T,
        d_model] for ``q``/``k``/``v`` (n query or key/value heads), [batch, T, d_model] for ``mlp`` and
        ``logits``; None: the model's own stream."""
        return None

    def fed(self, kind: str, layer: int, own: torch.Tensor) -> torch.Tensor | None:
        """The stream the inputs of ``kind`` in ``layer`` read, given the pass's own stream there ``own``
        [batch, T, d_model]: [n, batch, T, d_model] for ``q``/``k``/``v``, [batch, T, d_model] for
        ``mlp`` and ``logits``; None: ``own`` itself. The base class adds :meth:`delta` to ``own``."""
        delta = self.delta(kind, layer)
        if delta is None:
            return None
        return (own[None] if kind in POINT_OF else own) + delta.to(own.dtype)  # a delta in the model's dtype

    def listens(self, kind: str, layer: int) -> bool | list[int]:
        """Whether :meth:`wrote` wants the writes ``kind`` (``"heads"``, ``"mlp"``) of ``layer``: a pass
        computes the heads' writes (z_h W_O^h, one product a layer) only for a feed that does; for
        ``"heads"`` a list: those heads' writes only (all of them where a norm after the attention
        scales them by their sum)."""
        return True

    def received(self, kind: str, layer: int, tensor: torch.Tensor) -> None:
        """What the attention function received at the q, k or v of ``layer`` before any feeding,
        [batch, n, T, d_head] (the base class ignores it)."""

    def wrote(self, kind: str, layer: int, out: torch.Tensor) -> None:
        """``kind`` ``"input"`` (out [batch, T, d_model], the embeddings' write), ``"heads"`` ([heads,
        batch, T, d_model], each head's write), ``"mlp"`` ([batch, T, d_model]) or ``"final"`` (the
        model's own stream before the final norm, [batch, T, d_model], before the logits' delta); also
        what the inputs read before their deltas: ``"stream"`` (a block's input) and ``"mlp_in"`` (the
        MLP's norm's input). A feed ignores the kinds it does not use."""

    def z(self, layer: int, received: torch.Tensor) -> torch.Tensor:
        """The heads' outputs of ``layer`` that go on ([batch, T, heads, d_head]; the base class keeps
        what the attention computed)."""
        return received

    def recomputed(self, kind: str, layer: int, received: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """Choose between what the attention function received at a head input ([batch, n, T, d]), or
        an MLP that reads the attention's norm at its input ([batch, T, d_model]), and its recomputation
        from the fed streams; the base class takes the recomputation."""
        return new


def _hidden(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args, kwargs, value):
    if args:
        return (value, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": value}


def _hook_layers(hooks, wiring: Wiring, feed: Feed, streams: dict, embed: torch.Tensor | None, spec) -> None:
    for i, layer in enumerate(wiring.layers):
        def block_pre(module, args, kwargs, i=i):
            hidden = _hidden(args, kwargs)
            if i == 0 and embed is not None:
                hidden = embed.to(hidden.dtype)
                args, kwargs = _with_hidden(args, kwargs, hidden)
            if i == 0:
                feed.wrote("input", 0, hidden)
            feed.wrote("stream", i, hidden)
            streams[i] = hidden
            return args, kwargs

        def head_input(kind, i=i, layer=layer):
            def editor(tensor, call):
                if RERUNNING and RERUNNING[-1] is layer.attention:
                    raise Taken({"query": call.query, "key": call.key, "value": call.value})
                feed.received(kind, i, tensor)
                stream = feed.fed(kind, i, streams[i])
                if stream is None:
                    return tensor
                if isinstance(stream, Heads):
                    return feed.recomputed(kind, i, tensor, _some_heads(layer, kind, i, stream, tensor, streams))
                if layer.rerun:
                    new = rerun(layer, POINT_OF[kind], stream, streams[("call", i)])
                else:
                    new = recompute(layer, POINT_OF[kind], stream, streams.get(("turns", i)))
                new = new.to(tensor.dtype)
                return feed.recomputed(kind, i, tensor, new)
            return editor

        def output(tensor, call, i=i, layer=layer):
            z = feed.z(i, tensor)
            wanted = feed.listens("heads", i)
            if wanted is True or (wanted and layer.attn_post is not None):
                feed.wrote("heads", i, head_writes(layer, z, spec))
            elif wanted:
                feed.wrote("heads", i, head_writes(layer, z, spec, wanted))
            return z

        def mlp_pre(module, args, i=i):  # OPT's MLP reads [batch * T, d_model]
            x = args[0].reshape(streams[i].shape)
            feed.wrote("mlp_in", i, x)
            stream = feed.fed("mlp", i, x)
            return None if stream is None else (stream.reshape(args[0].shape), *args[1:])

        def shared_norm_pre(module, args, i=i, layer=layer):
            feed.wrote("mlp_in", i, streams[i])
            stream = feed.fed("mlp", i, streams[i])
            if stream is None:
                return None
            new = layer.norm(stream).to(args[0].dtype)
            return (feed.recomputed("mlp", i, args[0], new), *args[1:])

        def mlp_out(module, args, out, i=i):
            out = out[0] if isinstance(out, tuple) else out
            if feed.listens("mlp", i):
                out = out.reshape(streams[i].shape)  # OPT's MLP writes [batch * T, d_model]
                feed.wrote("mlp", i, out.clone())  # a copy: Falcon adds the attention's output to it in place

        def attention_pre(module, args, kwargs, i=i):
            if not RERUNNING:
                streams[("turns", i)] = kwargs.get("position_embeddings")  # (cos, sin) the module turns q, k by
                streams[("call", i)] = (args, kwargs)  # for a rerun
            return None

        hooks.forward_pre(layer.block, block_pre, with_kwargs=True)
        hooks.forward_pre(layer.attention, attention_pre, with_kwargs=True)
        for kind, point in POINT_OF.items():
            hooks.own(edit(layer.attention, point, head_input(kind)))
        hooks.own(edit(layer.attention, "output", output))
        if layer.mlp_norm is not None:
            hooks.forward_pre(layer.mlp_norm, mlp_pre)
        elif layer.norm is None:
            hooks.forward_pre(layer.mlp, mlp_pre)  # the MLP reads the stream itself
        else:
            hooks.forward_pre(layer.mlp, shared_norm_pre)
        hooks.forward(layer.writer, mlp_out)


def _some_heads(layer, kind: str, i: int, fed: Heads, received: torch.Tensor, streams: dict) -> torch.Tensor:
    """[batch, n, T, d_head]: what the attention received, with the heads of ``fed`` replaced."""
    out = received.clone()
    if fed.fixed:
        out[:, fed.fixed] = fed.given.to(out.dtype)
    if fed.recompute:
        if layer.rerun:  # the module's own code runs one copy per head: the others read their own stream
            n = received.shape[1]
            full = streams[i][None].expand(n, *streams[i].shape).clone()
            full[fed.recompute] = fed.streams.to(full.dtype)
            new = rerun(layer, POINT_OF[kind], full, streams[("call", i)])[:, fed.recompute]
        else:
            new = recompute(layer, POINT_OF[kind], fed.streams.to(streams[i].dtype), streams.get(("turns", i)),
                            fed.recompute)
        out[:, fed.recompute] = new.to(out.dtype)
    return out


def split_pass(lm, wiring: Wiring, ids: torch.Tensor, mask: torch.Tensor, feed: Feed,
               embed: torch.Tensor | None = None, positions: torch.Tensor | None = None,
               after_block=None) -> torch.Tensor:
    """Run ``lm`` on ``ids`` with every graph input fed by ``feed`` (module docstring).

    Gradients flow where the caller enables them (``torch.enable_grad``) and the feed's deltas
    require them; parameters never do inside (:func:`probe.capture.hooks.measuring` restores their flags).

    Args:
        lm: the :class:`~probe.core.LoadedModel`; wiring: its :func:`~probe.circuits.wiring.wire`.
        ids, mask: [batch, T] token ids and attention mask (right-padded).
        feed: a :class:`Feed`.
        embed: [batch, T, d_model] to use as block 0's input in place of the embeddings, or None.
        positions: [P] increasing positions whose logits are wanted (the unembedding runs on these
            only where the model's forward takes ``logits_to_keep``), or None: every position.
        after_block: called as ``after_block(i, output)`` with what block i returned, after each block's
            forward (a block answered by :func:`probe.effects.patch_layers.entered` included), or None.

    Returns:
        logits [batch, T, vocab], or [batch, P, vocab] at ``positions``.
    """
    install()
    streams: dict = {}
    device = input_device(lm.model)
    own = calls_function(lm)  # else probe's reference module, swapped in, calls the function
    with measuring(lm.model, implementation="probe" if own else None) as m:
        for p in lm.model.parameters():
            p.requires_grad_(False)
        _hook_layers(m.hooks, wiring, feed, streams, embed, lm.spec)

        def final_pre(module, args):
            feed.wrote("final", len(wiring.layers), args[0])
            stream = feed.fed("logits", len(wiring.layers), args[0])
            return None if stream is None else (stream.to(args[0].dtype), *args[1:])

        m.hooks.forward_pre(wiring.final_norm, final_pre)
        if after_block is not None:
            for i, layer in enumerate(wiring.layers):
                m.hooks.forward(layer.block, lambda module, args, out, i=i: after_block(i, out))
        kw = {"input_ids": ids.to(device), "attention_mask": mask.to(device), "use_cache": False}
        keep = positions is not None and "logits_to_keep" in inspect.signature(lm.model.forward).parameters
        if keep:
            kw["logits_to_keep"] = positions.to(device)
        logits = getattr(lm.model(**kw), "logits", None)
        if logits is None:
            raise UnsupportedAnalysisError(f"circuits need a model with its language-model head: {lm.name} is a "
                                           f"{type(lm.model).__name__}, which gives no logits (load a checkpoint "
                                           "whose architectures name ...ForCausalLM or ...ForMaskedLM)")
    return logits if positions is None or keep else logits[:, positions.to(logits.device)]
