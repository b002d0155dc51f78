"""Cross-attention of an encoder-decoder model (BART, Marian, T5): a decoder head's query split by the
decoder's writers, its key by the encoder's.

A cross-attention head of decoder layer l reads its query from the decoder's stream at that point and
its keys from the encoder's output. Each is a sum over its own writers, with every norm frozen at the
run as in :mod:`probe.qk.stream`:

- the key side: ``enc token embedding`` (``enc position embedding`` where the encoder has learned
  positions), each encoder head ``enc L3H5``, each encoder MLP ``enc MLP3`` and ``enc bias``, through
  the encoder's final norm (T5) frozen at its input;
- the query side: ``dec token embedding`` (``dec position embedding``), the decoder's self-attention
  heads ``dec L3H5`` and the cross-attention heads of earlier layers ``cross L3H5`` (what they wrote
  into the decoder's stream), each decoder MLP ``dec MLP3`` and ``dec bias``; in layer l, its
  self-attention heads and the norm the cross-attention reads through.

A decoder layer has two attention sub-layers and an MLP. Its sub-layers are post-LN (BART, Marian:
each sub-layer's sum goes through a norm, the layer's output is a norm's output) or pre-LN (T5: the
attention and the MLP read a norm of the stream and add to it); which, is read from the values of the
run as for one-stack models. The sources of the two sides are distinct: the result lists both, the
decoder's first (their key-side parts are zero, and the encoder's query-side parts).

Cross-attention ("encoder-decoder attention") is that of Vaswani et al. 2017, sec. 3.2.3; the split of
its scores is the QK circuit of Elhage et al. 2021 ("A Mathematical Framework for Transformer
Circuits"), read on one run with the two sides' writers of their own stacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..architectures import base_model, site_block, site_modules
from ..architectures.modules import site_spec
from ..architectures.weights import attention_weights, output_weights
from ..capture.hooks import calls_function, measuring
from ..capture.interface import edit, install, listen
from ..capture.maps import forward
from ..causal.parts import is_norm
from ..errors import UnsupportedAnalysisError
from ..sites import Site, head_name
from .stream import (
    BIAS,
    Block,
    Recorded,
    Stream,
    _block,
    _check,
    _embedding_name,
    _embeddings,
    _lookup,
    _row,
    _through_norm,
    close,
    gap,
)


@dataclass
class DecoderLayer:
    """One decoder layer in the pass (float64, batch row 0): ``x_in``/``x_out`` [T, d_model], ``norms``
    (module, input, output) in call order outside its attention modules, and per attention site
    ``reads`` [T, d_model] (its query-side input) and ``z`` [T, heads, d_head]."""

    x_in: torch.Tensor | None = None
    x_out: torch.Tensor | None = None
    norms: list = field(default_factory=list)
    reads: dict = field(default_factory=dict)
    z: dict = field(default_factory=dict)


@dataclass
class CrossRecord:
    """One pass up to the cross-attention call: the encoder's part as a :class:`~probe.qk.stream.Recorded`
    (``call`` unset), ``encoded`` [S, d_model] the encoder's output, ``between`` (module, input, output)
    the norms run after the encoder's first block and before the decoder's (the encoder's final norm,
    the decoder's embedding norm), ``dec_embeds`` the decoder's embedding lookups, ``layers`` the decoder
    layers 0 .. l, ``call`` the cross-attention's call."""

    encoder: Recorded
    encoded: torch.Tensor | None = None
    between: list = field(default_factory=list)
    dec_embeds: list = field(default_factory=list)
    layers: list = field(default_factory=list)
    call: object = None


class _Heard(Exception):
    """Raised once the cross-attention's call is heard: the pass stops there."""


def _hidden(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def record_cross(lm, batch, site: Site) -> CrossRecord:
    """Run ``lm`` once on ``batch`` (one source and its target) up to the call of cross-attention
    ``site``, recording what :class:`CrossRecord` lists (tensors float64, [tokens, d_model]; z
    [tokens, heads, d_head]; the call's query [1, heads, T, d_head] and key [1, kv_heads, S, d_head]).

    Raises:
        UnsupportedAnalysisError: attention modules that do not call probe's attention function.
    """
    model, spec = lm.model, lm.spec
    if not calls_function(lm):
        raise UnsupportedAnalysisError(f"why: {lm.name}'s attention modules do not call probe's attention function "
                                       "(transformers' AttentionInterface), where the scores are read")
    pairs = site_modules(model, spec)
    enc = [(s, m) for s, m in pairs if s.stack == "encoder"]
    dec = [(s, m) for s, m in pairs if s.stack == "decoder" and s.layer <= site.layer]
    enc_blocks = [site_block(model, spec, s) for s, _ in enc]
    dec_blocks = {s.layer: site_block(model, spec, s) for s, _ in dec}
    inside = {id(x) for s, _ in pairs for x in site_block(model, spec, s).modules()}
    rec = CrossRecord(Recorded(blocks=[Block() for _ in enc]), layers=[DecoderLayer() for _ in dec_blocks])
    phase = {"now": "before"}  # before the encoder's blocks, between the stacks, in the decoder
    encoder = model.get_encoder()

    def embedded(mod_, args, out, source):
        if phase["now"] == "before":
            rec.encoder.embeds.append((source, _lookup(out)))
        elif phase["now"] == "between":
            rec.dec_embeds.append((source, _lookup(out)))

    def normed(mod_, args, out):
        if phase["now"] == "before":
            rec.encoder.pre_norms.append((mod_, _row(args[0]), _row(out)))
        elif phase["now"] == "between":
            rec.between.append((mod_, _row(args[0]), _row(out)))

    def encoded(mod_, args, out):
        x = getattr(out, "last_hidden_state", None)
        rec.encoded = _row(out[0] if x is None else x)

    install()
    with measuring(model, implementation="probe") as measured:
        hooks = measured.hooks
        for name, mod in base_model(model).named_modules():
            if id(mod) in inside:
                continue
            last = name.rsplit(".", 1)[-1]
            if isinstance(mod, nn.Embedding) and "rel" not in last.lower():
                source = _embedding_name(lm, name, mod)
                hooks.forward(mod, lambda m, a, o, s=source: embedded(m, a, o, s))
            elif name and is_norm(last, mod):
                hooks.forward(mod, normed)
        hooks.forward(encoder, encoded)
        for i, block in enumerate(enc_blocks):
            got = rec.encoder.blocks[i]
            attention = enc[i][1]

            def block_in(mod_, args, kwargs, got=got):
                phase["now"] = "between"
                got.x_in = _row(_hidden(args, kwargs))

            def reads(mod_, args, kwargs, got=got):
                got.reads = _row(_hidden(args, kwargs))

            def z_reader(tensor, call, got=got):
                got.z = tensor[0].detach().double().cpu()
                return tensor

            hooks.forward_pre(block, block_in, with_kwargs=True)
            hooks.forward(block, lambda m, a, o, got=got: setattr(got, "x_out", _row(o)))
            hooks.forward_pre(attention, reads, with_kwargs=True)
            hooks.own(edit(attention, "output", z_reader))
            own = {id(x) for x in attention.modules()}
            for name, mod in block.named_modules():
                if name and id(mod) not in own and is_norm(name.rsplit(".", 1)[-1], mod):
                    hooks.forward(mod, lambda m, a, o, got=got: got.norms.append((m, _row(a[0]), _row(o))))
        for layer, block in dec_blocks.items():
            got = rec.layers[layer]
            attentions = [(s, m) for s, m in dec if s.layer == layer]

            def dec_in(mod_, args, kwargs, got=got):
                phase["now"] = "decoder"
                got.x_in = _row(_hidden(args, kwargs))

            hooks.forward_pre(block, dec_in, with_kwargs=True)
            hooks.forward(block, lambda m, a, o, got=got: setattr(got, "x_out", _row(o)))
            own = {id(x) for _, att in attentions for x in att.modules()}
            for name, mod in block.named_modules():
                if name and id(mod) not in own and is_norm(name.rsplit(".", 1)[-1], mod):
                    hooks.forward(mod, lambda m, a, o, got=got: got.norms.append((m, _row(a[0]), _row(o))))
            for s, att in attentions:
                hooks.forward_pre(att, lambda m, a, kw, got=got, s=s: got.reads.__setitem__(s, _row(_hidden(a, kw))),
                                  with_kwargs=True)
                if s != site:
                    hooks.own(edit(att, "output", lambda t, c, got=got, s=s: (got.z.__setitem__(
                        s, t[0].detach().double().cpu()), t)[1]))

        def heard(call):
            rec.call = call
            raise _Heard  # the rest of the decoder is not needed

        hooks.own(listen(dict(dec)[site], heard))
        try:
            forward(lm, batch)
        except _Heard:
            pass
    if rec.call is None:
        raise UnsupportedAnalysisError(f"why: probe did not hear {lm.name}'s {site.name} call its attention function")
    return rec


def _write(lm, stream: Stream, site: Site, z: torch.Tensor) -> tuple[Stream, torch.Tensor]:
    """(``stream`` plus what the heads of ``site`` wrote (z [T, heads, d_head] through their slices of the
    output projection, its bias to ``bias``), that write [T, d_model])."""
    W_O, b_O = output_weights(lm.model, lm.spec, site)
    W_O = W_O.detach().double().cpu()
    heads = torch.einsum("the,hed->htd", z, W_O)
    out = Stream(stream.names, stream.parts, stream.frozen, lm.spec, stream.total())
    for h in range(heads.shape[0]):
        out.add(head_name(site, h), heads[h])
    written = heads.sum(0)
    if b_O is not None:
        out.add(BIAS, b_O.detach().double().cpu().expand_as(heads[0]))
        written = written + b_O.detach().double().cpu()
    return out, written


def _decoder_layer(lm, stream: Stream, got: DecoderLayer, sites: list[Site], layer: int) -> Stream:
    """The decoder's stream after a whole decoder layer (module docstring)."""
    post = any(close(out, got.x_out) for _, _, out in got.norms)
    used: set[int] = set()
    value = got.x_in  # the stream's value at the run (with unfrozen norms the parts do not add up to it)
    for s in sites:
        stream, written = _write(lm, stream, s, got.z[s])
        value = value + written
        if post:
            k = next((k for k, (_, inp, _o) in enumerate(got.norms) if k not in used and close(inp, value)), None)
            if k is None:
                raise UnsupportedAnalysisError(f"why: decoder layer {layer} of {lm.name} ends with a norm but its "
                                               f"{s.kind}-attention sum goes through none probe finds")
            used.add(k)
            stream = stream.normed(*got.norms[k], f"after decoder layer {layer}'s {s.kind}-attention")
            value = got.norms[k][2]
    mlp = f"MLP{layer}"
    if post:
        end = next(k for k, (_, _i, out) in enumerate(got.norms) if k not in used and close(out, got.x_out))
        norm, inp, out = got.norms[end]
        stream.add(mlp, inp - value)
        stream = stream.normed(norm, inp, out, f"at the end of decoder layer {layer}")
    else:
        stream.add(mlp, got.x_out - value)
    _check(stream, got.x_out, lm, f"decoder's stream after layer {layer}")
    return stream


def _named(stream: Stream, prefix: str) -> list[str]:
    return [n if n.startswith(("enc ", "dec ", "cross ")) else f"{prefix} {n}" for n in stream.names]


@dataclass
class CrossParts:
    """The two sides of a cross-attention head (:func:`cross_sides`): ``names`` decoder sources then
    encoder sources; ``q`` [sources, rows, d_head] (zero for the encoder's), ``k`` [sources, S, d_head]
    (zero for the decoder's); ``scale``; ``call``; ``S`` source tokens; ``T`` target tokens."""

    names: list[str]
    q: torch.Tensor
    k: torch.Tensor
    scale: float
    call: object
    S: int
    T: int


def cross_sides(lm, batch, site: Site, h: int, rows: slice, frozen: bool = True) -> CrossParts:
    """The query (target rows ``rows``) and key (every source token) of cross-attention head ``h`` of
    ``site`` split by source on the first pair of ``batch`` (module docstring; Elhage et al. 2021's QK
    circuit with the two stacks' writers): q [sources, rows, d_head] and k [sources, S, d_head] in the
    model's query/key units, float64, so that scale * q.sum(0) . k.sum(0) is the model's score.

    Raises:
        UnsupportedAnalysisError: a structure the walk does not reproduce (said in one line: which
            stream, and by how much), per-head q/k norms or rotary positions on the cross-attention.
    """
    paths = site_spec(lm.spec, site)
    if paths.q_norm or paths.k_norm:
        raise UnsupportedAnalysisError(f"why: {lm.name}'s cross-attention normalises its queries or keys per head: "
                                       "not split by probe")
    rec = record_cross(lm, batch, site)
    S, T = int(batch.attention_mask[0].sum()), int(batch.target.attention_mask[0].sum())
    if rec.encoded is None:
        raise UnsupportedAnalysisError(f"why: probe did not see {lm.name}'s encoder return its output")
    # the key side: the encoder, as a one-stack model, then its final norm
    enc = _embeddings(lm, rec.encoder, frozen)
    blocks = rec.encoder.blocks
    for i, got in enumerate(blocks):
        if got.x_in is None or got.x_out is None or got.z is None:
            raise UnsupportedAnalysisError(f"why: probe did not see encoder layer {i} of {lm.name} run as one block")
        _check(enc, got.x_in, lm, f"encoder's input of layer {i}")
        enc = _block(lm, enc, got, i)
    last = blocks[-1].x_out
    enc_out = _through_norm(enc, last, rec.encoded, rec.between, "at the end of the encoder")
    if enc_out is None:
        raise UnsupportedAnalysisError(f"why: {lm.name}'s encoder output is neither its last layer's output nor a norm "
                                       f"of it (relative difference {gap(last, rec.encoded):.2g})")
    # the query side: the decoder up to the cross-attention
    layers = rec.layers
    dec_rec = Recorded(embeds=rec.dec_embeds, pre_norms=[b for b in rec.between if not close(b[1], last)],
                       blocks=[Block(x_in=layers[0].x_in)])
    dec = _embeddings(lm, dec_rec, frozen)
    dec_sites = [s for s in lm.sites if s.stack == "decoder" and s.layer <= site.layer]
    for layer, got in enumerate(layers):
        _check(dec, got.x_in, lm, f"decoder's input of layer {layer}")
        mine = [s for s in dec_sites if s.layer == layer]
        if layer < site.layer:
            dec = _decoder_layer(lm, dec, got, mine, layer)
            continue
        value = got.x_in
        for s in mine:
            if s == site:
                break
            dec, written = _write(lm, dec, s, got.z[s])
            value = value + written
        reads = got.reads[site]
        dec = _through_norm(dec, value, reads, got.norms, f"before decoder layer {layer}'s cross-attention")
        if dec is None:
            raise UnsupportedAnalysisError(f"why: {lm.name}'s cross-attention of decoder layer {layer} reads neither "
                                           "the decoder's stream nor a norm of it")
    w = attention_weights(lm.model, lm.spec, site)
    g = lm.geometry
    kv = h // (g.n_heads // g.n_kv_heads)
    call = rec.call
    q_recv, k_recv = call.query[0, h, rows].double().cpu(), call.key[0, kv, :S].double().cpu()

    def side(stream: Stream, W, b, positions: slice) -> torch.Tensor:
        x = torch.einsum("std,de->ste", stream.stacked()[:, positions], W.detach().double().cpu())
        if b is not None:
            x[stream.names.index(BIAS)] += b.detach().double().cpu()
        return x

    q = side(dec, w.W_Q[h], None if w.b_Q is None else w.b_Q[h], rows)
    k = side(enc_out, w.W_K[kv], None if w.b_K is None else w.b_K[kv], slice(0, S))
    if frozen:
        for what, got, recv in (("queries", q, q_recv), ("keys", k, k_recv)):
            if not close(got.sum(0), recv):
                raise UnsupportedAnalysisError(
                    f"why: {lm.name}'s {what} of {site.name} recomputed from the streams differ from what its "
                    f"attention function receives (relative {gap(got.sum(0), recv):.2g}): they change inside the "
                    "attention module after the projection in a way probe does not reproduce")
    names = _named(dec, "dec") + _named(enc_out, "enc")
    nq, nk = q.shape[0], k.shape[0]
    q = torch.cat([q, q.new_zeros((nk, *q.shape[1:]))])
    k = torch.cat([k.new_zeros((nq, *k.shape[1:])), k])
    scaling = call.kwargs.get("scaling")
    scale = q_recv.shape[-1] ** -0.5 if scaling is None else float(scaling)
    return CrossParts(names, q, k, scale, call, S, T)
