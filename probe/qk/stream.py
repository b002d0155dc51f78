"""The residual stream a head reads, split by the writer of each part, with every norm frozen at the run.

One pass of the model records, for every block up to the chosen head's layer: its input and output,
the input and output of every norm it calls (outside the attention module), what its attention
module reads, each head's output z before the output projection, and the embedding lookups and norms
that run before the first block. From these the stream is rebuilt as a sum over *sources*:

- ``token embedding``, ``position embedding`` (learned absolute positions: GPT-2, BERT, OPT) and
  ``segment embedding`` (BERT's token types), each as its table wrote it;
- each earlier head ``L3H5``: z_h W_O^h, its slice of the output projection;
- each earlier MLP ``MLP3``: what the block added besides its attention (the MLP's output with its
  own bias, after a norm of its own where the family has one: Gemma 2's post-feed-forward norm);
- ``bias``: the output projections' biases and every norm's beta (and, in :mod:`probe.qk.score`,
  b_Q and b_K).

A norm is frozen at the run: its per-token statistics (LayerNorm's mean and sigma, RMSNorm's root
mean square) are those of its actual input, so it is an affine map, N(sum_a c_a) = sum_a n(c_a) + beta
with n linear (:func:`probe.architectures.weights.frozen_norm`, whether the module is a LayerNorm or an RMSNorm
is the form that reproduces its output at the run). Where each norm sits is read from the values,
not from names: a norm whose input is the attention's output is a post-attention norm (Gemma 2: the
heads' writes go through it), a norm whose input is the block's input plus the attention's output is
a post-LN norm (BERT: the whole stream goes through it), a norm whose output is the block's output
ends a post-LN block; the attention reads the block's input itself or a norm of it. After every
block the sum of the sources is checked against the block's output (relative 1e-4); a structure this
walk does not reproduce is refused in one line.

With ``frozen=False`` each source is normalised by its own statistics instead (what a norm applied to
one writer alone would do): the parts no longer add up to the stream, and :func:`probe.why`
reports by how much the score misses.
"""

from __future__ import annotations

import dataclasses
import weakref
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch
from torch import nn

from ..architectures import base_model, site_block, site_modules
from ..architectures.weights import frozen_norm, output_weights
from ..capture.hooks import calls_function, measuring
from ..capture.interface import Call, edit, install, listen, served_sites
from ..capture.maps import forward
from ..capture.swapped import swap_if_agrees
from ..causal.parts import is_norm
from ..errors import UnsupportedAnalysisError
from ..sites import head_name

#: Largest relative difference accepted where the walk matches a recorded tensor (float32 arithmetic in
#: another order), as the circuit graph's check (:data:`probe.circuits.checked.TOLERANCE`).
TOLERANCE = 1e-4

TOKEN, POSITION, SEGMENT, BIAS = "token embedding", "position embedding", "segment embedding", "bias"


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (inf where the shapes differ)."""
    if a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)


def close(a: torch.Tensor, b: torch.Tensor, tol: float = TOLERANCE) -> bool:
    """Whether ``a`` equals ``b`` within ``tol`` times the largest |b| (same shape)."""
    return gap(a, b) <= tol


def _through_norm(stream: Stream, x: torch.Tensor, y: torch.Tensor, norms, where: str) -> Stream | None:
    """``stream`` (value ``x``) as what reads ``y``: itself, or through the recorded norm (module, input,
    output) whose input is ``x`` and output ``y``, whichever reproduces ``y`` more closely (a norm applied
    to an input that is already normalised, as BLOOM's first block's after the embedding LayerNorm, is
    the identity within the tolerance but not within float32: the norm is taken then); None: neither."""
    best = (gap(x, y), None)
    for norm, inp, out in norms:
        if close(inp, x) and close(out, y):
            best = min(best, (gap(inp, x) + gap(out, y), (norm, inp, out)), key=lambda b: b[0])
    if best[0] > TOLERANCE:
        return None
    return stream if best[1] is None else stream.normed(*best[1], where)


@dataclass
class Block:
    """What one block did in the pass (float64, batch row 0): ``x_in``/``x_out`` [T, d_model], ``reads``
    the attention module's input [T, d_model], ``norms`` (module, input, output) in call order, ``z``
    [T, heads, d_head] the heads' outputs before the output projection, ``turns`` the (cos, sin) the
    attention module received as ``position_embeddings`` (or None)."""

    x_in: torch.Tensor | None = None
    x_out: torch.Tensor | None = None
    reads: torch.Tensor | None = None
    norms: list = field(default_factory=list)
    z: torch.Tensor | None = None
    turns: tuple | None = None


@dataclass
class Recorded:
    """One pass: ``embeds`` (source name, [T, d_model]) and ``pre_norms`` (module, input, output) run
    before the first block, ``blocks`` up to the head's layer, ``call`` the head's layer's
    :class:`~probe.capture.interface.Call` (its query, key, mask, probabilities), ``ids`` [T]."""

    embeds: list = field(default_factory=list)
    pre_norms: list = field(default_factory=list)
    blocks: list = field(default_factory=list)
    call: Call | None = None
    ids: torch.Tensor | None = None


class _Heard(Exception):
    """Raised by the listener of the head's layer once it has the call: the pass stops there."""


def _rows(x) -> torch.Tensor:
    """Every batch row of a recorded tensor, float64 on the CPU."""
    x = x[0] if isinstance(x, tuple) else x
    return x.detach().double().cpu()


def _row(x) -> torch.Tensor:
    x = x[0] if isinstance(x, tuple) else x
    return x[0].detach().double().cpu()


def _lookup(out) -> torch.Tensor:
    """An embedding lookup's output as [T, d_model] float64: batch row 0, or the whole output where the
    table was looked up without a batch ([T, d_model]: Marian's sinusoidal positions)."""
    out = out[0] if isinstance(out, tuple) else out
    return (out[0] if out.dim() == 3 else out).detach().double().cpu()


def _embedding_name(lm, name: str, module: nn.Module) -> str:
    if module is lm.model.get_input_embeddings():
        return TOKEN
    low = name.lower()
    if "type" in low:
        return SEGMENT
    if "pos" in low or low.endswith("wpe"):
        return POSITION
    last = low.rsplit(".", 1)[-1]
    if "tok" in last or "word" in last or last == "wte" or last == "shared":  # an encoder-decoder's own tables
        return TOKEN
    raise UnsupportedAnalysisError(f"why: {lm.name} looks up an embedding {name!r} before its first block that probe "
                                   "cannot name (token, position or segment)")


def record_rows(lm, batch, layer: int) -> list[Recorded]:
    """:func:`record` for every sequence of ``batch`` in one pass: one :class:`Recorded` per row, cut to
    the row's real tokens (right padding; its ``call`` holds that row's query, key and probabilities).
    What a padded batch computes for a row's real tokens is what the row alone computes, up to float32
    rounding in another order (the corpus average reads rows this way: one pass per batch, not per text).

    Raises:
        UnsupportedAnalysisError: as :func:`record`.
    """
    with ExitStack() as stack:
        if not calls_function(lm):
            swap_if_agrees(lm, stack)
        whole = _record(lm, batch, layer, whole=True)
    return [_cut(whole, b, int(n)) for b, n in enumerate(batch.attention_mask.sum(1).tolist())]


def _cut(rec: Recorded, b: int, n: int) -> Recorded:
    """Row ``b`` of a batch's :class:`Recorded` (tensors [batch, T, ...]), its first ``n`` tokens."""
    def row(x):
        if x.dim() < 3:  # a lookup without a batch: [T, d_model]
            return x[:n]
        return x[b if x.shape[0] > 1 else 0, :n]

    def first(t):
        return t[b:b + 1] if t.shape[0] > 1 else t

    blocks = [Block(None if g.x_in is None else row(g.x_in), None if g.x_out is None else row(g.x_out),
                    None if g.reads is None else row(g.reads), [(m, row(i), row(o)) for m, i, o in g.norms],
                    None if g.z is None else row(g.z),
                    None if g.turns is None else tuple(first(t)[:, :n] for t in g.turns)) for g in rec.blocks]
    call = rec.call
    if call is not None:
        keep = call.keep
        if keep is not None:
            keep = first(keep)
            keep = keep[..., :n, :n] if keep.shape[-2] > 1 else keep[..., :n]
        call = dataclasses.replace(call, query=call.query[b:b + 1, :, :n], key=call.key[b:b + 1, :, :n],
                                   value=call.value[b:b + 1, :, :n], probs=call.probs[b:b + 1, :, :n, :n],
                                   keep=keep, output=None, mask_bias=None if call.mask_bias is None else
                                   first(call.mask_bias)[..., :n] if call.mask_bias.shape[-2] == 1 else
                                   first(call.mask_bias)[..., :n, :n])
    return Recorded([(s, row(e)) for s, e in rec.embeds], [(m, row(i), row(o)) for m, i, o in rec.pre_norms],
                    blocks, call, None if rec.ids is None else rec.ids[b, :n])


def record(lm, batch, layer: int) -> Recorded:
    """Run ``lm`` once on ``batch`` (one sequence) recording what :class:`Recorded` lists, blocks 0 .. ``layer``.

    Raises:
        UnsupportedAnalysisError: a model whose attention modules do not call probe's attention
            function, or that shares one attention module between layers.
    """
    with ExitStack() as stack:
        if not calls_function(lm):  # Falcon, BLOOM, GPT-Neo: probe's reference module, where it reproduces the model
            swap_if_agrees(lm, stack)
        return _record(lm, batch, layer)


#: Per model: what :func:`_record` hooks (the walk over its modules, the same on every call).
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class _Plan:
    blocks: list
    attentions: list
    embeddings: list  # (module, source name) looked up outside the blocks
    norms: list  # norm modules outside the blocks
    block_norms: list  # per block: its norm modules outside its attention module


def _plan(lm) -> _Plan:
    """The modules :func:`_record` hooks on ``lm``, found once per model (a walk over every module; not
    kept where probe's reference modules are swapped in for the pass).

    Raises:
        UnsupportedAnalysisError: one attention module shared between layers, an embedding probe cannot name.
    """
    cached = calls_function(lm)  # else probe's reference modules are swapped in for this pass only
    plan = _PLANS.get(lm.model) if cached else None
    if plan is not None:
        return plan
    model, spec = lm.model, lm.spec
    pairs = site_modules(model, spec)
    if any(len(sites) > 1 for sites in served_sites(model, spec).values()):
        raise UnsupportedAnalysisError(f"why: {lm.name} shares one attention module between layers")
    blocks = [site_block(model, spec, site) for site, _ in pairs]
    inside = {id(x) for b in blocks for x in b.modules()}
    plan = _Plan(blocks, [m for _, m in pairs], [], [], [])
    for name, mod in base_model(model).named_modules():
        if id(mod) in inside:
            continue
        if isinstance(mod, nn.Embedding) and "rel" in name.rsplit(".", 1)[-1].lower():
            continue  # a relative-position table (MPNet, DeBERTa): a bias on the scores, not a write
        if isinstance(mod, nn.Embedding):
            plan.embeddings.append((mod, _embedding_name(lm, name, mod)))
        elif name and is_norm(name.rsplit(".", 1)[-1], mod):
            plan.norms.append(mod)
    for block, attention in zip(blocks, plan.attentions):
        own = {id(x) for x in attention.modules()}
        plan.block_norms.append([mod for name, mod in block.named_modules()
                                 if name and id(mod) not in own and is_norm(name.rsplit(".", 1)[-1], mod)])
    if cached:
        _PLANS[lm.model] = plan
    return plan


def _record(lm, batch, layer: int, whole: bool = False) -> Recorded:
    """:func:`record`'s pass; ``whole``: every batch row kept ([batch, T, ...], ``ids`` [batch, T])."""
    model = lm.model
    take, lookup, first = (_rows, _rows, (lambda t: t)) if whole else (_row, _lookup, (lambda t: t[0]))
    plan = _plan(lm)
    blocks, attentions = plan.blocks[:layer + 1], plan.attentions[:layer + 1]
    rec = Recorded(blocks=[Block() for _ in blocks])
    state = {"started": False}
    install()
    with measuring(model, implementation="probe" if calls_function(lm) else None) as measured:
        hooks = measured.hooks
        for mod, source in plan.embeddings:
            hooks.forward(mod, lambda mod_, a, out, s=source: None if state["started"]
                          else rec.embeds.append((s, lookup(out))))
        for mod in plan.norms:
            hooks.forward(mod, lambda mod_, a, out: None if state["started"]
                          else rec.pre_norms.append((mod_, take(a[0]), take(out))))
        for i, (block, attention) in enumerate(zip(blocks, attentions)):
            got = rec.blocks[i]

            def block_in(mod_, args, kwargs, got=got):
                state["started"] = True
                got.x_in = take(args[0] if args else kwargs["hidden_states"])

            def block_out(mod_, args, out, got=got):
                got.x_out = take(out)

            def reads(mod_, args, kwargs, got=got):
                got.reads = take(args[0] if args else kwargs["hidden_states"])
                pe = kwargs.get("position_embeddings")
                got.turns = None if pe is None else tuple(t.detach().double().cpu() for t in pe)

            hooks.forward_pre(block, block_in, with_kwargs=True)
            hooks.forward(block, block_out)
            hooks.forward_pre(attention, reads, with_kwargs=True)
            for mod in plan.block_norms[i]:
                hooks.forward(mod, lambda mod_, a, out, got=got: got.norms.append((mod_, take(a[0]), take(out))))
            if i < layer:
                def z_reader(tensor, call, got=got):
                    got.z = first(tensor).detach().double().cpu()
                    return tensor
                hooks.own(edit(attention, "output", z_reader))
        def heard(call):
            rec.call = call
            raise _Heard  # the layers after the head's are not needed

        hooks.own(listen(attentions[layer], heard))
        try:
            forward(lm, batch)
        except _Heard:
            pass
    if rec.call is None:
        raise UnsupportedAnalysisError(f"why: {lm.name}'s attention modules do not call probe's attention function "
                                       "(transformers' AttentionInterface), where the scores are read")
    rec.ids = batch.input_ids if whole else batch.input_ids[0]
    return rec


class Stream:
    """The stream as a sum of sources: ``names`` and ``parts`` (one [T, d_model] float64 tensor each);
    the ``bias`` source is always there."""

    def __init__(self, names: list[str], parts: list[torch.Tensor], frozen: bool, spec,
                 total: torch.Tensor | None = None) -> None:
        self.names, self.parts, self.frozen, self.spec = list(names), list(parts), frozen, spec
        if BIAS not in self.names:
            self.names.append(BIAS)
            self.parts.append(torch.zeros_like(parts[0]))
        self._total = torch.stack(self.parts).sum(0) if total is None else total  # kept up to date by add()
        self._stacked: torch.Tensor | None = None

    def add(self, name: str, part: torch.Tensor) -> None:
        if name == BIAS:
            self.parts[self.names.index(BIAS)] = self.parts[self.names.index(BIAS)] + part
        else:
            self.names.append(name)
            self.parts.append(part)
        self._total = self._total + part
        self._stacked = None

    def total(self) -> torch.Tensor:
        """[T, width] the sum of the sources."""
        return self._total

    def stacked(self) -> torch.Tensor:
        """[sources, T, width]."""
        if self._stacked is None:
            self._stacked = torch.stack(self.parts)
        return self._stacked

    def normed(self, norm: nn.Module, x: torch.Tensor, out: torch.Tensor, where: str) -> Stream:
        """A new stream: every source through ``norm`` frozen at its input ``x`` (its output ``out``
        at the run), its beta added to ``bias``; unfrozen (``frozen=False``): each source by its own
        statistics."""
        fn, beta = frozen_map(self.spec, norm, x, out, where)
        if self.frozen:
            stacked = fn(self.stacked())
            stacked[self.names.index(BIAS)] += beta
            new = Stream(self.names, list(stacked.unbind(0)), True, self.spec, fn(self.total()) + beta)
            new._stacked = stacked
            return new
        parts = [frozen_map(self.spec, norm, p, None, where, check=False)[0](p) for p in self.parts]
        new = Stream(self.names, parts, self.frozen, self.spec)
        new.add(BIAS, beta.expand_as(x))
        return new


def frozen_map(spec, norm: nn.Module, x: torch.Tensor, out: torch.Tensor | None, where: str, check: bool = True):
    """(fn, beta): ``norm`` linearised at input ``x`` [T, width] (:func:`probe.architectures.weights.frozen_norm`), as a
    LayerNorm or an RMSNorm, whichever reproduces ``out`` (its output at the run; None: ``norm(x)``).

    Raises:
        UnsupportedAnalysisError: neither form reproduces the norm's output (relative 1e-4).
    """
    if out is None and check:
        with torch.no_grad():
            out = norm(x.to(next(norm.parameters()).dtype)).double()
    kinds = [spec.norm] + [k for k in ("layernorm", "rmsnorm") if k != spec.norm]
    for kind in kinds:
        if kind == "layernorm" and not hasattr(norm, "eps") and not hasattr(norm, "variance_epsilon"):
            continue
        try:
            fn, beta = frozen_norm(dataclasses.replace(spec, norm=kind), norm, x)
        except (UnsupportedAnalysisError, AttributeError, TypeError):
            continue
        if not check or close(fn(x) + beta, out):
            return fn, beta
    raise UnsupportedAnalysisError(f"why: the norm {type(norm).__name__} {where} is neither a LayerNorm nor an RMSNorm "
                                   "probe can freeze (its output is not reproduced)")


def _embeddings(lm, rec: Recorded, frozen: bool) -> Stream:
    x0 = rec.blocks[0].x_in
    if not rec.embeds:
        raise UnsupportedAnalysisError(f"why: {lm.name} looks up no embedding table before its first block")
    merged: dict[str, torch.Tensor] = {}
    for name, part in rec.embeds:
        if part.dim() == 1:  # a table looked up without a batch (positions shared by the batch)
            part = part[None]
        merged[name] = merged.get(name, 0) + part.expand_as(x0)
    stream = Stream(list(merged), list(merged.values()), frozen, lm.spec)
    pre = stream.total()
    walked = _through_norm(stream, pre, x0, rec.pre_norms, "after the embeddings")
    if walked is not None:
        return walked
    alpha = float((x0 * pre).sum() / (pre * pre).sum())
    if close(alpha * pre, x0):  # Gemma multiplies the embeddings by sqrt(d_model)
        return Stream(stream.names, [alpha * p for p in stream.parts], frozen, lm.spec)
    # one factor per table (Marian scales its token embeddings by sqrt(d_model), not its positions)
    used = [k for k, p in enumerate(stream.parts) if float(p.abs().max()) > 0]
    A = torch.stack([stream.parts[k].flatten() for k in used], 1)
    factors = torch.linalg.lstsq(A, x0.flatten()[:, None]).solution[:, 0]
    parts = list(stream.parts)
    for k, f in zip(used, factors.tolist()):
        parts[k] = f * parts[k]
    scaled = Stream(stream.names, parts, frozen, lm.spec)
    if close(scaled.total(), x0):
        return scaled
    raise UnsupportedAnalysisError(f"why: {lm.name}'s first block does not read the sum of its embedding lookups "
                                   f"({', '.join(merged)}), with or without a norm")


def _check(stream: Stream, x: torch.Tensor, lm, what: str) -> None:
    if stream.frozen and not close(stream.total(), x):  # unfrozen norms: the parts do not add up, by design
        gap = float((stream.total() - x).abs().max() / x.abs().max())
        raise UnsupportedAnalysisError(f"why: {lm.name}'s {what} is not the sum of what its embeddings, heads and MLPs "
                                       f"write with its norms frozen (relative difference {gap:.2g}): a structure "
                                       "probe does not walk")


def _block(lm, stream: Stream, got: Block, layer: int) -> Stream:
    """The stream after block ``layer`` (see the module docstring)."""
    W_O, b_O = output_weights(lm.model, lm.spec, lm.sites[layer])
    W_O = W_O.detach().double().cpu()
    heads = torch.einsum("the,hed->htd", got.z, W_O)
    bias = torch.zeros_like(got.x_in) if b_O is None else b_O.detach().double().cpu().expand_as(got.x_in)
    names = [head_name(layer, h) for h in range(W_O.shape[0])]
    written = Stream(names + [BIAS], list(heads.unbind(0)) + [bias], stream.frozen, lm.spec)
    o = heads.sum(0) + bias
    used = set()
    for k, (norm, inp, out) in enumerate(got.norms):
        if close(inp, o):
            written, o = written.normed(norm, inp, out, f"after layer {layer}'s attention"), out
            used.add(k)
            break
    after = Stream(stream.names, stream.parts, stream.frozen, lm.spec, stream.total())
    for name, part in zip(written.names, written.parts):
        after.add(name, part)
    s1, mlp = got.x_in + o, f"MLP{layer}"
    end = next((k for k, (norm, inp, out) in enumerate(got.norms) if k not in used and close(out, got.x_out)), None)
    if end is None:  # pre-norm (a norm whose input is s1 is the MLP's own)
        after.add(mlp, got.x_out - s1)
    else:  # post-LN: the stream after the attention is normed, and the block ends with a norm of it plus the MLP
        for k, (norm, inp, out) in enumerate(got.norms):
            if k not in used and k != end and close(inp, s1):
                after, s1 = after.normed(norm, inp, out, f"after layer {layer}'s attention (post-LN)"), out
                break
        norm, inp, out = got.norms[end]
        after.add(mlp, inp - s1)
        after = after.normed(norm, inp, out, f"at the end of layer {layer} (post-LN)")
    _check(after, got.x_out, lm, f"stream after layer {layer}")
    return after


def reads(lm, rec: Recorded, layer: int, frozen: bool = True) -> Stream:
    """What the attention of ``layer`` reads, split by source: the block's input, through its norm
    (frozen) where the attention reads a norm of it.

    Raises:
        UnsupportedAnalysisError: a structure the walk does not reproduce (module docstring).
    """
    stream = _embeddings(lm, rec, frozen)
    for i in range(layer + 1):
        got = rec.blocks[i]
        if got.x_in is None or got.reads is None or (i < layer and got.x_out is None):
            raise UnsupportedAnalysisError(f"why: probe did not see layer {i} of {lm.name} run as one block")
        _check(stream, got.x_in, lm, f"input of layer {i}")
        if i == layer:
            break
        stream = _block(lm, stream, got, i)
    got = rec.blocks[layer]
    walked = _through_norm(stream, got.x_in, got.reads, got.norms, f"before layer {layer}'s attention")
    if walked is not None:
        return walked
    raise UnsupportedAnalysisError(f"why: layer {layer} of {lm.name} reads neither its input nor a norm of it")

