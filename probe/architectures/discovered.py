"""Specs built from what a forward pass showed, for model types without a hand-written entry.

:func:`probe.capture.discover.discover` runs one short forward pass with probe's attention function
installed (:mod:`probe.capture.interface`) and hands each call's findings here as :class:`Found`: the
attention module's path (the nearest ``nn.ModuleList`` ancestor is the layer list, the rest the
attention path), the stack and kind of the site, its causal flag and window, its head counts and the
projections that were found and checked. :func:`build_spec` turns them into an
:class:`~probe.architectures.spec.ArchSpec` with ``implementation="probe"`` and its sites fixed, and
:func:`register` files it under its ``model_type`` in :data:`DISCOVERED`, where
:func:`probe.architectures.get_spec` finds it. A later load of the same type discovers again and
replaces the entry (a type's structure comes from its config: two models of one type with different
configs are measured with the spec of the one loaded last, so load them one at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedArchitectureError
from ..sites import Site
from .spec import QKV_LAYOUTS, ArchSpec, SiteSpec

#: model_type -> the spec discovered for the model of that type loaded last.
DISCOVERED: dict[str, ArchSpec] = {}

#: The interface implementation name (:data:`probe.capture.interface.NAME`, repeated here so that this package
#: stays below :mod:`probe.capture.interface` in the import graph).
IMPLEMENTATION = "probe"


@dataclass(frozen=True)
class Found:
    """One attention call of the discovery pass.

    Attributes:
        stack, kind: ``"encoder"``/``"decoder"`` and ``"self"``/``"cross"``.
        layer: index in the layer list.
        layers: path of the layer list (``nn.ModuleList``) relative to the base model.
        attention: path of the attention module relative to one layer.
        causal: the mask is causal. window: sliding window (keys, itself included) or None; ahead: of a
            bidirectional window's keys, those after the query (:attr:`probe.sites.Site.ahead`).
        n_heads, n_kv_heads: query and key/value heads. d_head: a value head's width.
        o: path of the output projection relative to one layer, or None.
        q, k, v, qkv: projection paths relative to one layer (None where not found).
        layout: the projection layout (:data:`~probe.architectures.spec.QKV_LAYOUTS`).
        conv1d: the projections are GPT-2 ``Conv1D`` modules.
        path: path of this call's layer relative to the base model (a layer shared by several
            sites, ALBERT's, serves each of them).
    """

    stack: str
    kind: str
    layer: int
    layers: str
    attention: str
    causal: bool
    window: int | None
    n_heads: int
    n_kv_heads: int
    d_head: int
    o: str | None = None
    q: str | None = None
    k: str | None = None
    v: str | None = None
    qkv: str | None = None
    layout: str = "separate"
    conv1d: bool = False
    path: str = ""
    ahead: int = 0


def model_kind(config) -> str:
    """The kind of model of a config without a hand spec: ``"encoder-decoder"`` if
    ``is_encoder_decoder``, ``"encoder"`` if transformers has a masked-LM class for the type (or no
    causal-LM class), else ``"decoder"``."""
    from transformers.models.auto import modeling_auto as auto  # deferred: transformers takes ~1.5 s to import

    model_type = getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if (model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
            or model_type not in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        return "encoder"
    return "decoder"


def _same(found: list[Found], what: str):
    values = {getattr(f, what) for f in found}
    if len(values) != 1:
        f = found[0]
        raise UnsupportedArchitectureError(
            f"{f.stack} {f.kind}-attention differs from layer to layer ({what}: {sorted(map(str, values))}); "
            "probe needs one structure per kind of site")
    return values.pop()


def _projection(found: list[Found], what: str) -> str | None:
    """The path of one projection across the layers of one kind of site: the same path in every layer, or
    None where some layers have none that probe found and checked (a layer that reads the keys and values
    of another, Kolibri's shared ones; a layer whose queries pass a norm, Llama 4's): not found for all, so
    that what needs it refuses in one line while capture and statistics run.

    Raises:
        UnsupportedArchitectureError: two different paths.
    """
    paths = {getattr(f, what) for f in found}
    if None in paths and len(paths) > 1:
        return None
    return _same(found, what)


def _site_spec(found: list[Found]) -> SiteSpec:
    """One :class:`SiteSpec` from the calls of one (stack, kind); paths must agree across layers (a
    projection found in some layers only counts as not found, :func:`_projection`)."""
    first = found[0]
    paths = {w: _same(found, w) for w in ("layers", "attention")}
    paths.update({w: _projection(found, w) for w in ("o", "q", "k", "v", "qkv")})
    return SiteSpec(first.stack, first.kind, paths["layers"], paths["attention"], paths["o"] or "",
                    q=paths["q"], k=paths["k"], v=paths["v"], qkv=paths["qkv"], causal=first.causal)


def build_spec(model_type: str, kind: str, found: list[Found], d_model: int, position_offset: int = 0) -> ArchSpec:
    """An :class:`ArchSpec` from the calls of a discovery pass, in forward order.

    Raises:
        UnsupportedArchitectureError: no call, site kinds that do not fit the model's kind (a
            decoder whose attention is not causal ...), or paths and head counts that differ between
            the layers of one kind of site.
    """
    if not found:
        raise UnsupportedArchitectureError(
            f"{model_type}: its attention never called transformers' AttentionInterface in a forward pass, and probe "
            "has no hand-written spec for it")
    groups: dict[tuple[str, str], list[Found]] = {}
    for f in found:
        groups.setdefault((f.stack, f.kind), []).append(f)
    if kind == "encoder-decoder" and ("encoder", "self") not in groups:
        raise UnsupportedArchitectureError(
            f"{model_type}: its encoder's attention never called transformers' AttentionInterface in a forward pass "
            "(only its decoder's did), and probe has no hand-written spec for it")
    if kind == "encoder-decoder" and ("decoder", "self") not in groups:
        raise UnsupportedArchitectureError(
            f"{model_type}: no attention call of its decoder read the target's keys alone (its self-attention is "
            "merged with the cross-attention in one call); probe measures them as separate sites")
    for group in groups.values():
        for what in ("n_heads", "n_kv_heads", "d_head", "layout", "conv1d", "causal"):
            _same(group, what)
    if kind == "decoder" and not all(f.causal for f in groups.get(("decoder", "self"), found)):
        raise UnsupportedArchitectureError(f"{model_type}: a decoder whose self-attention is not causal")
    heads = {(f.n_heads, f.d_head) for f in found}
    if len(heads) != 1:
        raise UnsupportedArchitectureError(f"{model_type}: sites with different head counts or sizes {sorted(heads)}; "
                                           "probe needs one")
    first = found[0]
    missing = tuple(p for p in ("q", "k", "v", "o")
                    if any(getattr(f, p) is None and not (p != "o" and f.qkv) for f in found))
    layout = first.layout if first.layout in QKV_LAYOUTS else "separate"
    n_layers = max(f.layer for f in found if (f.stack, f.kind) == (first.stack, first.kind)) + 1
    return ArchSpec(
        family=model_type, kind=kind, site_specs=tuple(_site_spec(g) for g in groups.values()),
        qkv_layout=layout, conv1d=first.conv1d, implementation=IMPLEMENTATION,
        fixed_sites=tuple(Site(f.stack, f.layer, f.kind, causal=f.causal, window=f.window, ahead=f.ahead)
                          for f in found),
        site_paths=tuple(f.path for f in found),
        dims=(n_layers, first.n_heads, first.n_kv_heads, first.d_head, d_model), missing=missing,
        position_offset=lambda config, n=position_offset: n,
    )


def register(model_type: str, spec: ArchSpec) -> ArchSpec:
    """File ``spec`` under ``model_type`` in :data:`DISCOVERED` (replacing an earlier one); returns it."""
    DISCOVERED[model_type] = spec
    return spec


def refuse_capture_only(spec: ArchSpec, what: str) -> None:
    """Refuse ``what`` (an analysis, by name) on a capture-only model (:attr:`ArchSpec.capture_only`).

    Raises:
        UnsupportedArchitectureError: one line naming the analysis, the type and what does run.
    """
    if spec.capture_only:
        raise UnsupportedArchitectureError(
            f"{what} does not run on {spec.family}: its attention is its own code, outside transformers' "
            "AttentionInterface, and probe only captures the maps its eager path returns "
            "(statistics, views, labels, attention steps)")


def build_maps_spec(model_type: str, kind: str, found: list[tuple[str, int, int]], layer_split: int, base: str,
                    n_heads: int, d_model: int, d_head: int, probs_argument: str | None) -> ArchSpec:
    """A capture-only :class:`ArchSpec` (:attr:`ArchSpec.capture_only`) from the attention modules whose output
    tuples held the maps of an ``output_attentions`` pass (:func:`probe.capture.eager_maps.discover_maps`).

    Args:
        found: per layer, in order: (module path from the model's root, index of the maps in its output tuple,
            the layer's number).
        layer_split: the position of the layer number in the paths' parts.
        base: the base model's path from the root ("" where the model is its own base).
        n_heads: heads per layer (of its maps). d_model: hidden width. d_head: a head's width (the config's).
        probs_argument: the modules' forward argument that asks for the maps (``output_attentions``), or None.

    Raises:
        UnsupportedArchitectureError: maps at different tuple positions, or modules at different paths.
    """
    indexes = {i for _, i, _ in found}
    if len(indexes) != 1:
        raise UnsupportedArchitectureError(f"{model_type}: its attention modules return their maps at different "
                                           f"positions {sorted(indexes)}; probe needs one")
    index = indexes.pop()
    stack = "encoder" if kind == "encoder" else "decoder"
    parts = [path.split(".") for path, _, _ in found]
    strip = len(base.split(".")) if base else 0
    layers = {".".join(q[strip:layer_split]) for q in parts}
    attention = {".".join(q[layer_split + 1:]) for q in parts}
    if len(layers) != 1 or len(attention) != 1:
        raise UnsupportedArchitectureError(f"{model_type}: its attention modules sit at different paths; probe needs "
                                           "one per layer")
    layer_path, attention_path = layers.pop(), attention.pop()
    causal = kind == "decoder"
    site = SiteSpec(stack, "self", layer_path, attention_path, "", causal=causal)
    return ArchSpec(
        family=model_type, kind=kind, site_specs=(site,), implementation="eager", capture_only=True,
        fixed_sites=tuple(Site(stack, n, "self", causal=causal) for n in range(len(found))),
        site_paths=tuple(".".join(q[strip:layer_split + 1]) for q in parts),
        dims=(len(found), n_heads, n_heads, d_head, d_model), missing=("q", "k", "v", "o"),
        probs=lambda output, i=index: output[i] if isinstance(output, (tuple, list)) and len(output) > i else None,
        probs_argument=probs_argument,
    )


def build_seq2seq_maps_spec(model_type: str, groups: dict, splits: dict, base: str, n_heads: int, d_model: int,
                            d_head: int, probs_argument: str | None) -> ArchSpec:
    """:func:`build_maps_spec` of an encoder-decoder model: its encoder's self-attention, its decoder's self- and
    cross-attention, each kind of site with its own layer list and attention path, the sites in forward order
    (the encoder's layers, then each decoder layer's self- and cross-attention).

    Args:
        groups: ``(stack, kind)`` -> per layer, in order: (module path from the model's root, index of the maps
            in its output tuple, the layer's number). splits: ``(stack, kind)`` -> the position of the layer
            number in its paths' parts. The other arguments: as :func:`build_maps_spec`.

    Raises:
        UnsupportedArchitectureError: maps at different tuple positions, modules at different paths within one
            kind of site, or decoder self- and cross-attention of different layer counts.
    """
    indexes = {i for found in groups.values() for _, i, _ in found}
    if len(indexes) != 1:
        raise UnsupportedArchitectureError(f"{model_type}: its attention modules return their maps at different "
                                           f"positions {sorted(indexes)}; probe needs one")
    index = indexes.pop()
    strip = len(base.split(".")) if base else 0
    specs, layer_of = [], {}
    for (stack, kind), found in groups.items():
        parts = [path.split(".") for path, _, _ in found]
        split = splits[stack, kind]
        layers = {".".join(q[strip:split]) for q in parts}
        attention = {".".join(q[split + 1:]) for q in parts}
        if len(layers) != 1 or len(attention) != 1:
            raise UnsupportedArchitectureError(f"{model_type}: its {stack} {kind}-attention modules sit at different "
                                               "paths; probe needs one per layer")
        specs.append(SiteSpec(stack, kind, layers.pop(), attention.pop(), "", causal=(stack, kind) == ("decoder",
                                                                                                      "self")))
        layer_of[stack, kind] = [".".join(q[strip:split + 1]) for q in parts]
    n_dec = len(layer_of["decoder", "self"])
    if len(layer_of["decoder", "cross"]) != n_dec:
        raise UnsupportedArchitectureError(f"{model_type}: its decoder has {n_dec} self-attention and "
                                           f"{len(layer_of['decoder', 'cross'])} cross-attention maps; probe needs one "
                                           "of each per layer")
    sites = [(Site("encoder", n, "self"), path) for n, path in enumerate(layer_of["encoder", "self"])]
    for n in range(n_dec):
        sites += [(Site("decoder", n, "self", causal=True), layer_of["decoder", "self"][n]),
                  (Site("decoder", n, "cross"), layer_of["decoder", "cross"][n])]
    return ArchSpec(
        family=model_type, kind="encoder-decoder", site_specs=tuple(specs), implementation="eager",
        capture_only=True, fixed_sites=tuple(s for s, _ in sites), site_paths=tuple(p for _, p in sites),
        dims=(len(layer_of["encoder", "self"]), n_heads, n_heads, d_head, d_model), missing=("q", "k", "v", "o"),
        probs=lambda output, i=index: output[i] if isinstance(output, (tuple, list)) and len(output) > i else None,
        probs_argument=probs_argument,
    )


def needs_weights(spec: ArchSpec, what: str, parts: tuple[str, ...] = ("q", "k", "v", "o")) -> None:
    """Refuse an analysis that needs projection weights a discovered spec did not find (or any, on a
    capture-only model: :func:`refuse_capture_only`).

    Raises:
        UnsupportedArchitectureError: one line naming the analysis and the missing projections.
    """
    refuse_capture_only(spec, what)
    gone = [p for p in parts if p in spec.missing]
    if gone:
        raise UnsupportedArchitectureError(
            f"{what} needs the {', '.join(gone)} projection weights of {spec.family}, which probe did not find "
            "(and check) in its attention modules; capture and statistics still work")
