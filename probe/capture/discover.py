"""Discovery: the structure of a model without a hand-written spec, from one short forward pass.

With probe's attention function installed (:mod:`probe.capture.interface`), every call of it names its
module; :func:`discover` runs one tiny forward pass (a dozen tokens; an encoder-decoder model's
source and target of different lengths, so that self- and cross-attention tell apart) and reads
from each call:

* the site: the module's path (the nearest ``nn.ModuleList`` ancestor is the layer list, the rest
  the attention path), its stack and kind (keys from another sequence: cross-attention), its order;
* causal or not, from the mask the call received (or the module's ``is_causal`` when it has none),
  and the sliding window from the ``sliding_window`` keyword argument or the mask's band;
* heads, key/value heads and a value head's width, from the shapes of query, key and value;
* the output projection: the ``nn.Linear`` (or GPT-2 ``Conv1D``) near the attention module whose
  input equals the function's output as [batch, T, heads * d_head] (temporary hooks record every
  projection's input and output);
* the query, key and value projections, checked: recomputing what the function received from a
  found module's output must give it exactly (values everywhere; queries and keys at position 0,
  where rotary embeddings are the identity). Modules whose outputs are equal (a query and a key
  projection holding the same weights) are told apart by what they feed: each one's output nudged in
  one more pass, the input of the call that changes is its role. What is not found is listed in
  :attr:`~probe.architectures.ArchSpec.missing`, and the analyses that need those weights refuse.

The findings become an :class:`~probe.architectures.ArchSpec`
(:func:`probe.architectures.discovered.build_spec`), filed under the model's type.
"""

from __future__ import annotations

import torch
from torch import nn

from ..architectures import base_model
from ..architectures.discovered import Found, build_spec, model_kind, register
from ..architectures.spec import ArchSpec
from ..errors import InterfaceError, UnsupportedArchitectureError
from ..util import quiet_transformers
from .failures import forward_failures
from .hooks import Hooks, measuring
from .interface import NAME, Call, install, listen


class NoInterfaceCalls(UnsupportedArchitectureError):
    """The model's attention never called transformers' ``AttentionInterface`` in the discovery pass (its modules
    compute attention themselves): :func:`probe.capture.eager_maps.discover_maps` may still read its maps."""


#: The discovery pass's text (any text works; a dozen tokens).
TEXT = "The quick brown fox jumps over the lazy dog near the river bank today."
#: The step an exception inside the model's own forward pass is reported in (:mod:`probe.capture.failures`).
STEP = "discovery (one short forward pass to find the attention modules)"


def _is_projection(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def _inputs(model: nn.Module, tokenizer, kind: str, n: int | None = None) -> dict:
    """One short sequence (an encoder-decoder model: a source and a shorter target; an image
    model: its processor's grey image, :meth:`probe.loading.pixels.PixelProcessor.discovery_inputs`; a speech
    model: a silent window, :meth:`probe.loading.sound.SpeechProcessor.discovery_inputs`); ``n``: a text of
    ``n`` tokens instead (the text repeated)."""
    if hasattr(tokenizer, "discovery_inputs"):
        return tokenizer.discovery_inputs(next(model.parameters()).device)
    ids = [i for i in tokenizer(TEXT, add_special_tokens=True)["input_ids"]][:12]
    if len(ids) < 6:
        ids = (ids * 6)[:6]
    if n is not None:
        ids = (ids * (n // len(ids) + 1))[:n]
    table = model.get_input_embeddings()
    device = getattr(table, "weight", table).device  # Perceiver's input embeddings are a bare Parameter
    source = torch.tensor([ids], device=device if device.type != "meta" else "cpu")
    inputs = {"input_ids": source, "attention_mask": torch.ones_like(source)}
    if kind == "encoder-decoder":
        inputs["decoder_input_ids"] = source[:, : len(ids) // 2]
    if kind != "encoder":
        inputs["use_cache"] = False
    return inputs


def _layer_lists(model: nn.Module, path: str) -> list[int]:
    """Indexes into ``path``'s parts of its ``nn.ModuleList`` ancestors' item numbers, innermost first."""
    parts = path.split(".")
    return [i for i in range(len(parts) - 2, 0, -1)
            if parts[i].isdigit() and isinstance(model.get_submodule(".".join(parts[:i])), nn.ModuleList)]


def _layer_split(model: nn.Module, paths: list[str]) -> tuple[str, str]:
    """(layer path pattern position) for the calls of one kind of site: the innermost
    ``nn.ModuleList`` ancestor whose item number differs between the calls (T5's blocks, not each
    block's own list of sub-layers); the innermost when all calls share one module (ALBERT).

    Returns:
        The position i of the layer number in the paths' parts (the layer path is parts[:i + 1],
        the attention path parts[i + 1:]).

    Raises:
        InterfaceError: an attention module outside any layer list.
    """
    levels = _layer_lists(model, paths[0])
    if not levels:
        raise InterfaceError(f"attention module {paths[0]!r} is not inside a layer list (nn.ModuleList); "
                             "probe cannot number its layers")
    split = [p.split(".") for p in paths]
    for i in levels:
        same_list = all(len(q) > i and q[:i] == split[0][:i] for q in split)
        if same_list and len({q[i] for q in split}) > 1:
            return i
    return levels[0]


def _causal(call: Call) -> tuple[bool, int | None, int]:
    """(causal, window, ahead) of a self-attention call, from its mask (row 0, head 0) and keyword
    arguments (:class:`probe.sites.Site`'s ``window`` and ``ahead``). A bidirectional window is read from the
    mask alone (its ``sliding_window`` argument means different things in different models); one that does not
    bind at this call's length gives window None (:func:`discover` runs a longer pass for it)."""
    window = call.kwargs.get("sliding_window")
    Tq, Tk = call.query.shape[-2], call.key.shape[-2]
    if call.keep is None:
        causal = bool(call.kwargs.get("is_causal", getattr(call.module, "is_causal", False)))
        return causal, window if causal else None, 0
    keep = call.keep[0, 0].expand(Tq, Tk)
    if bool(keep.all()):
        return False, None, 0
    tri = torch.ones(Tq, Tk, dtype=torch.bool, device=keep.device).tril(Tk - Tq)
    band = _bidirectional_band(keep)
    if band is not None:  # a bidirectional sliding window (ModernBERT's local layers, T5Gemma's encoder)
        before, after = band
        return False, before + 1 + after, after
    if bool((keep & ~tri).any()):
        raise InterfaceError(f"{type(call.module).__name__}: a mask that is neither causal nor full "
                             "nor a band around each query; probe cannot measure it")
    if not torch.equal(keep, tri) and window is None:
        window = int(keep[-1].sum())
    return True, window, 0


def _bidirectional_band(keep: torch.Tensor) -> tuple[int, int] | None:
    """(keys before, keys after) each query of a bidirectional sliding window [query, key] sees, or None
    for another mask. The window is a band, -before <= j - i <= after (queries and keys one sequence;
    ModernBERT's local layers: |j - i| <= local_attention / 2), that binds at this length (some query
    misses a key)."""
    Tq, Tk = keep.shape
    if Tq != Tk:
        return None
    after, before = int(keep[0].sum()) - 1, int(keep[-1].sum()) - 1  # first query: keys 0..after; last: T-1-before..
    i = torch.arange(Tq, device=keep.device)
    offset = i[None, :] - i[:, None]  # j - i
    band = (offset >= -before) & (offset <= after)
    binds = 0 < before < Tq - 1 and 0 < after < Tq - 1  # 0: causal (or its mirror); Tq - 1: not seen at this length
    return (before, after) if binds and torch.equal(keep, band) else None


def _pair_norms(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Norms of the rotary pairs of the last dimension: (i, i + d/2), or (2i, 2i + 1) interleaved."""
    d = x.shape[-1] // 2 * 2
    x = x[..., :d].float()
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., : d // 2], x[..., d // 2:])
    return torch.sqrt(a * a + b * b)


def _rotated(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether ``want`` [batch, heads, T, d] is ``got`` rotated pair by pair at every position and
    multiplied by one constant (YaRN's attention factor): equal per-pair norms up to that constant,
    rotate-half or interleaved pairs."""
    if got.shape != want.shape or want.shape[-1] < 2:
        return False
    for interleaved in (False, True):
        a, b = _pair_norms(got, interleaved), _pair_norms(want, interleaved)
        if not bool((a > 1e-6).all()):
            return False
        ratio = b / a
        c = ratio.flatten().median()
        if bool(torch.allclose(ratio, c.expand_as(ratio), rtol=1e-4, atol=0)) and float(c) > 0:
            return True
    return False


def _matches(record: list, want: torch.Tensor, pick) -> bool:
    for _, out in record:
        try:
            got = pick(out)
        except RuntimeError:
            continue
        if got is not None and got.shape == want.shape and torch.equal(got, want):
            return True
    return False


def _split(x: torch.Tensor, n: int, d: int) -> torch.Tensor:
    """[batch, T, n * d] -> [batch, n, T, d]."""
    return x.reshape(x.shape[0], x.shape[1], n, d).transpose(1, 2)


def _fused(layout: str, o: torch.Tensor, H: int, KV: int, d: int) -> tuple:
    """(q, k, v) [batch, heads, T, d] in the output of a fused projection of ``layout``."""
    if layout == "per_head":
        x = o.reshape(o.shape[0], o.shape[1], H, 3, d).transpose(1, 2)
        return x[..., 0, :], x[..., 1, :], x[..., 2, :]
    sizes = [H * d, KV * d, KV * d]
    if o.shape[-1] != sum(sizes):
        raise RuntimeError("width")
    q, k, v = o.split(sizes, dim=-1)
    return _split(q, H, d), _split(k, KV, d), _split(v, KV, d)


def _projections(call: Call, io: dict, near: list[tuple[str, nn.Module]], fed=None) -> dict:
    """The q/k/v paths (or one fused ``qkv`` and its layout) among ``near`` ((path, module) in the
    layer), each checked against what the call received: values everywhere, queries and keys at
    position 0 (rotary embeddings are the identity there).

    Modules whose outputs are equal (a query and a key projection holding the same weights) all pass
    that check: ``fed(path, module)`` then says which of ``"q"``, ``"k"``, ``"v"`` the module feeds
    (:class:`_Fed`: its output nudged in one more pass, what the call received that changed), and a
    role is given to the modules that feed it only. Without ``fed`` the first module in ``near`` is taken.
    """
    H, d_qk = call.query.shape[1], call.query.shape[-1]
    KV, d_v = call.key.shape[1], call.value.shape[-1]
    q0, k0 = call.query[:, :, :1], call.key[:, :, :1]
    found: dict = {}
    candidates: dict[str, list] = {"q": [], "k": [], "v": []}
    for path, module in near:
        rec = io.get(module, [])
        for name, want, n, d, first in (("q", q0, H, d_qk, True), ("k", k0, KV, d_qk, True),
                                        ("v", call.value, KV, d_v, False)):
            if _matches(rec, want, lambda o, n=n, d=d, f=first: _split(o, n, d)[:, :, :1] if f else _split(o, n, d)):
                candidates[name].append((path, module))
        for name, want, n in (("q", call.query, H), ("k", call.key, KV)):
            if (path, module) not in candidates[name] and any(
                    _rotated(_split(o, n, d_qk), want) for _, o in rec
                    if o.shape[-1] == n * d_qk and o.shape[1] == want.shape[2]):
                candidates[name].append((path, module))
        if d_qk != d_v or all(candidates.values()) or "qkv" in found:
            continue
        for layout, conv in (("stacked", False), ("conv1d", True), ("per_head", False)):
            if conv != (type(module).__name__ == "Conv1D") or (layout != "stacked" and KV != H):
                continue
            if all(_matches(rec, want, lambda o, i=i, n=n, lay=layout: _fused(lay, o, H, KV, d_v)[i][:, :, :n])
                   for i, (want, n) in enumerate(((q0, 1), (k0, 1), (call.value, call.value.shape[2])))):
                found.update(qkv=path, layout=layout)
                break
    for name, found_here in candidates.items():
        if len(found_here) > 1 and fed is not None:
            found_here = [(path, module) for path, module in found_here if name in fed(path, module)]
        if found_here:
            found[name] = found_here[0][0]
    return found


class _Fed:
    """Which of a call's query, key and value a projection feeds, found by nudging its output (one more
    forward pass per module asked about; only where modules' outputs are equal). Within its own layer, a
    projection's output reaches only the inputs it feeds: the other two are computed from the layer's
    input, which the nudge has not reached."""

    def __init__(self, model: nn.Module, inputs: dict, calls: list[Call]) -> None:
        self.model, self.inputs, self.calls = model, inputs, calls
        self.call: Call | None = None
        self._seen: dict = {}

    def __call__(self, path: str, module: nn.Module) -> set[str]:
        index = next(i for i, c in enumerate(self.calls) if c is self.call)
        key = (index, path)
        if key not in self._seen:
            again: list[Call] = []
            with Hooks() as hooks:
                hooks.own(listen(None, again.append))
                hooks.forward(module, lambda m, args, out: out + 1.0)
                self.model(**self.inputs)
            was, now = self.call, again[index]
            self._seen[key] = {name for name, a, b in (("q", was.query, now.query), ("k", was.key, now.key),
                                                       ("v", was.value, now.value))
                               if a.shape != b.shape or not torch.equal(a, b)}
        return self._seen[key]


def _output_projection(call: Call, io: dict, near: list[tuple[str, nn.Module]]) -> str | None:
    """The path of the projection whose input equals the call's output as [batch, T, heads * d_head]."""
    want = call.output.reshape(call.output.shape[0], call.output.shape[1], -1)
    for path, module in near:
        for inp, _ in io.get(module, []):
            if inp.shape == want.shape and torch.equal(inp, want):
                return path
    return None
def _near(layer_path: str, attention_path: str, projections: list) -> list[tuple[str, nn.Module]]:
    """(path relative to the layer, module) of the projections in the attention module, then the
    rest of the layer."""
    inside = [(p[len(layer_path) + 1:], m) for p, m in projections if p.startswith(f"{layer_path}.{attention_path}.")]
    rest = [(p[len(layer_path) + 1:], m) for p, m in projections
            if p.startswith(layer_path + ".") and not p.startswith(f"{layer_path}.{attention_path}.")]
    return inside + rest


def _site_of(call: Call, kind: str, lengths: tuple[int, int]) -> tuple[str, str]:
    """(stack, kind of site) of a call: one-stack models by their kind; an encoder-decoder model by
    the query and key lengths (source and target differ)."""
    Tq, Tk = call.query.shape[-2], call.key.shape[-2]
    if kind != "encoder-decoder":
        if Tq != Tk:
            raise InterfaceError(f"{type(call.module).__name__}: queries and keys of different lengths in a "
                                 "one-stack model; probe cannot place the site")
        return ("encoder" if kind == "encoder" else "decoder"), "self"
    source, target = lengths
    if Tq == Tk == source:
        return "encoder", "self"
    return ("decoder", "self") if Tk == target else ("decoder", "cross")


def _found(call: Call, where: tuple[str, str, str, str], base: str, io, projections, count,
           fed: _Fed | None = None, masks: Call | None = None) -> Found:
    """One call's :class:`Found`: ``where`` is (stack, kind of site, layer path, attention path); ``fed``
    tells apart projections with equal outputs; ``masks``: the same call of the longer pass
    (:func:`_longer_pass`), whose mask gives causality and window."""
    stack, site_kind, layer_path, attention = where
    causal, window, ahead = _causal(masks or call) if site_kind == "self" else (False, None, 0)
    near = _near(layer_path, attention, projections)
    if fed is not None:
        fed.call = call
    proj = _projections(call, io, near, fed)
    H, KV, d_v = call.query.shape[1], call.key.shape[1], call.value.shape[-1]
    layers = layer_path.rpartition(".")[0]
    if base and not layers.startswith(base + "."):
        raise InterfaceError(f"attention layers {layers!r} lie outside the base model {base!r}")
    key = (stack, site_kind)
    count[key] = count.get(key, 0) + 1
    return Found(stack, site_kind, count[key] - 1, layers[len(base) + 1:] if base else layers, attention,
                 causal, window, H, KV, d_v, o=_output_projection(call, io, near), q=proj.get("q"),
                 k=proj.get("k"), v=proj.get("v"), qkv=proj.get("qkv"), layout=proj.get("layout", "separate"),
                 conv1d=any(type(m).__name__ == "Conv1D" for _, m in near), path=layer_path[len(base) + 1:]
                 if base else layer_path, ahead=ahead)


def _places(model: nn.Module, calls: list[Call], names: dict, kind: str, lengths) -> list[tuple]:
    """(stack, kind of site, layer path, attention path) of every call (:func:`_layer_split` per kind of site)."""
    sites = [_site_of(c, kind, lengths) for c in calls]
    split = {}
    for key in dict.fromkeys(sites):
        split[key] = _layer_split(model, [names[c.module] for c, s in zip(calls, sites) if s == key])
    out = []
    for call, key in zip(calls, sites):
        parts = names[call.module].split(".")
        i = split[key]
        out.append((*key, ".".join(parts[: i + 1]), ".".join(parts[i + 1:])))
    return out


def _unresolved_window(call: Call) -> int:
    """The ``sliding_window`` argument of a self-attention call whose bidirectional window this pass's length
    does not show (its mask full, or a band seen on one side only), else 0."""
    window = call.kwargs.get("sliding_window")
    if not isinstance(window, int) or call.query.shape[-2] != call.key.shape[-2]:
        return 0
    if call.keep is None:
        causal = bool(call.kwargs.get("is_causal", getattr(call.module, "is_causal", False)))
        return 0 if causal else window
    keep = call.keep[0, 0].expand(call.query.shape[-2], call.key.shape[-2])
    if not bool(keep.triu(1).any()):  # causal
        return 0
    return window if _bidirectional_band(keep) is None else 0


@torch.no_grad()
def _longer_pass(model: nn.Module, tokenizer, kind: str, calls: list[Call]) -> list[Call] | None:
    """The calls of a pass long enough to show every bidirectional sliding window (ModernBERT's local
    layers: 2 x the largest ``sliding_window`` argument + 4 tokens, at most the position table's length), or
    None where the discovery pass showed them all. A window wider than the model's positions never binds."""
    need = max((_unresolved_window(c) for c in calls), default=0)
    if not need:
        return None
    config = model.config
    limits = [getattr(config, a) for a in ("max_position_embeddings", "n_positions")
              if isinstance(getattr(config, a, None), int)]
    n = min([2 * need + 4] + [limit - _position_offset(model) for limit in limits])
    longer: list[Call] = []
    with measuring(model, eager=False) as m:
        _use_function(model)
        m.hooks.own(listen(None, longer.append))
        model(**_inputs(model, tokenizer, kind, n))
    if len(longer) != len(calls):
        raise InterfaceError(f"a pass of {n} tokens called the attention {len(longer)} times, one of 12 tokens "
                             f"{len(calls)} times; probe cannot read the sliding windows")
    return longer


def _use_function(model: nn.Module) -> None:
    """Ask the model to run probe's attention function (restored by ``measuring``), transformers' warnings quiet: on a
    model whose attention is its own code (RoFormer, MPT ...) transformers logs that it cannot switch, and on MPT that
    it set a sub-config it could not check; discovery then finds no call and the model is read capture-only, which
    probe's own note says, so the user saw two lines about a switch probe tried, not one they asked for."""
    with quiet_transformers(progress_bars=True):
        model.set_attn_implementation(NAME)


def _position_offset(model: nn.Module) -> int:
    """RoBERTa's numbering (positions from ``padding_idx + 1``): a position table with a padding row."""
    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and getattr(module, "padding_idx", None) is not None:
            return int(module.padding_idx) + 1
    return 0


def _d_model(model: nn.Module) -> int:
    config = model.config
    for attr in ("hidden_size", "d_model", "n_embd", "dim"):
        if isinstance(getattr(config, attr, None), int):
            return int(getattr(config, attr))
    return int(model.get_input_embeddings().weight.shape[-1])


@torch.no_grad()
def discover(model: nn.Module, tokenizer) -> ArchSpec:
    """Discover a model's attention structure from one short forward pass and register its spec.

    Args:
        model: a ``transformers`` model whose attention modules call ``AttentionInterface``.
        tokenizer: its tokenizer (the pass's text).

    Returns:
        The :class:`~probe.architectures.ArchSpec` filed under ``model.config.model_type``
        (:data:`probe.architectures.discovered.DISCOVERED`).

    Raises:
        NoInterfaceCalls: the attention never calls the interface (the model keeps its own attention code), or an
            encoder-decoder model's encoder never does.
        UnsupportedArchitectureError: a structure probe cannot measure (one line each).
        ModelForwardError: the model's own forward pass raised an exception (its reason, one line).
    """
    install()
    kind = model_kind(model.config)
    inputs = _inputs(model, tokenizer, kind)
    first = inputs.get("input_ids", inputs.get("pixel_values"))
    # a speech model's features are longer than its encoder: its processor says the encoder's length
    source = first.shape[1] if first is not None else int(tokenizer.positions)
    lengths = (source, inputs["decoder_input_ids"].shape[1] if "decoder_input_ids" in inputs else source)
    names = {m: n for n, m in model.named_modules()}
    base = names[base_model(model)]
    projections = [(n, m) for n, m in model.named_modules() if _is_projection(m)]
    calls: list[Call] = []
    io: dict = {}

    def record(module, args, output):
        if args and isinstance(args[0], torch.Tensor) and isinstance(output, torch.Tensor):
            io.setdefault(module, []).append((args[0].detach(), output.detach()))

    with measuring(model, eager=False) as m, forward_failures(STEP, model):
        _use_function(model)
        m.hooks.own(listen(None, calls.append))
        for _, module in projections:
            m.hooks.forward(module, record)
        model(**inputs)
    if not calls:
        raise NoInterfaceCalls(f"{model.config.model_type}: its attention never called transformers' "
                               "AttentionInterface in a forward pass, and probe has no hand-written spec for it")
    with forward_failures(STEP, model):
        longer = _longer_pass(model, tokenizer, kind, calls) or [None] * len(calls)
    count: dict = {}
    with measuring(model, eager=False), forward_failures(STEP, model):
        _use_function(model)
        fed = _Fed(model, inputs, calls)  # modules with equal outputs: told apart by what they feed
        found = [_found(c, w, base, io, projections, count, fed, masks) for c, w, masks
                 in zip(calls, _places(model, calls, names, kind, lengths), longer)]
    if kind == "encoder-decoder" and not any((f.stack, f.kind) == ("encoder", "self") for f in found):
        # its encoder computes attention itself (BigBird-Pegasus): the model is read from its maps, as a whole
        raise NoInterfaceCalls(f"{model.config.model_type}: its encoder's attention never called transformers' "
                               "AttentionInterface in a forward pass (only its decoder's did), and probe has no "
                               "hand-written spec for it")
    spec = build_spec(model.config.model_type, kind, found, _d_model(model), _position_offset(model))
    return register(model.config.model_type, spec)
