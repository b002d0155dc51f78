"""Model structure read through a spec: head geometry, sites, the modules of each layer and site."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..errors import UnsupportedArchitectureError
from ..sites import Site
from .discovered import needs_weights
from .spec import ArchSpec, SiteSpec
from .table import SPECS, get_spec


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
    """Read layer/head counts and sizes from a Hugging Face config (any supported family).

    Encoder-decoder models: ``n_layers`` is the encoder's (:func:`sites` counts each stack's own).

    A discovered spec (:mod:`probe.architectures.discovered`) gives its own counts, as found.

    Raises:
        UnsupportedArchitectureError: an encoder-decoder model whose stacks have different head counts.
    """
    dims = _discovered_dims(config)
    if dims is not None:
        return HeadGeometry(*dims)
    n_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", None) or config.n_layer
    n_heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", None) or config.n_head
    d_model = getattr(config, "hidden_size", None) or getattr(config, "dim", None) or config.n_embd
    spec = SPECS.get(getattr(config, "model_type", None))
    n_kv = spec.kv_heads(config) if spec is not None else getattr(config, "num_key_value_heads", None) or n_heads
    d_head = getattr(config, "head_dim", None) or getattr(config, "d_kv", None) or d_model // n_heads
    decoder_heads = getattr(config, "decoder_attention_heads", None)
    if decoder_heads is not None and decoder_heads != n_heads:
        raise UnsupportedArchitectureError(
            f"encoder and decoder have different head counts ({n_heads} and {decoder_heads}); probe needs one")
    return HeadGeometry(int(n_layers), int(n_heads), int(n_kv), int(d_head), int(d_model))


def _discovered_dims(config) -> tuple | None:
    try:
        return get_spec(config).dims
    except UnsupportedArchitectureError:
        return None


def sites(config) -> list[Site]:
    """Every attention site of a model, in forward order (an encoder's layers, then each decoder
    layer's self- and cross-attention), with its causal flag and sliding window (a discovered
    spec's: as found in its forward pass)."""
    spec = get_spec(config)
    if spec.fixed_sites:
        return list(spec.fixed_sites)
    default = head_geometry(config).n_layers
    out = []
    for stack in ("encoder", "decoder"):
        kinds = [s for s in spec.site_specs if s.stack == stack]
        if not kinds:
            continue
        n = kinds[0].n_layers(config) if kinds[0].n_layers else default
        for layer in range(n):
            for s in kinds:
                window = spec.window(config, layer) if s.kind == "self" else None
                out.append(Site(stack, layer, s.kind, causal=s.causal, window=window))
    return out


def site_spec(spec: ArchSpec, site: Site) -> SiteSpec:
    """The :class:`SiteSpec` of a site."""
    for s in spec.site_specs:
        if s.stack == site.stack and s.kind == site.kind:
            return s
    raise KeyError(f"{spec.family} has no {site.stack} {site.kind}-attention")


def site_block(model: nn.Module, spec: ArchSpec, site: Site) -> nn.Module:
    """The block (transformer layer) of ``model`` that holds ``site``."""
    if spec.site_paths:
        return base_model(model).get_submodule(spec.site_paths[spec.fixed_sites.index(site)])
    return base_model(model).get_submodule(site_spec(spec, site).layers)[site.layer]


def site_modules(model: nn.Module, spec: ArchSpec | None = None) -> list[tuple[Site, nn.Module]]:
    """Every site of ``model`` with the attention module in place now, in forward order."""
    spec = spec or get_spec(model.config)
    return [(site, site_block(model, spec, site).get_submodule(site_spec(spec, site).attention))
            for site in sites(model.config)]


def site_outputs(model: nn.Module, spec: ArchSpec | None = None) -> list[tuple[Site, nn.Module]]:
    """Every site of ``model`` with its output projection (input [batch, seq, heads * d_head]),
    in forward order.

    Raises:
        UnsupportedArchitectureError: a discovered spec whose output projection was not found
            (the analyses that act on a head's output refuse in one line).
    """
    spec = spec or get_spec(model.config)
    needs_weights(spec, "acting on a head's output (ablation, patching, gates, direct logit attribution)", ("o",))
    return [(site, site_block(model, spec, site).get_submodule(site_spec(spec, site).o))
            for site in sites(model.config)]


#: Model settings under which a family computes its attention output projection without calling the
#: projection module (so no hook on it runs): model type -> (the setting, or None where it is off; why,
#: and the fix).
OUTPUT_PROJECTION_BYPASSES = {
    "bloom": (lambda c: f"pretraining_tp={c.pretraining_tp}, slow_but_exact=True"
              if getattr(c, "pretraining_tp", 1) > 1 and getattr(c, "slow_but_exact", False) else None,
              "applies it as F.linear on slices of its weight; load the model with slow_but_exact=False "
              "(config.json), which applies the same projection in one call"),
}


def output_projection_bypass(config) -> str | None:
    """Why a model's attention output projection module is never called, where a known setting of its
    family does that (:data:`OUTPUT_PROJECTION_BYPASSES`): "the setting ... of this <type> model ...",
    else None."""
    known = OUTPUT_PROJECTION_BYPASSES.get(getattr(config, "model_type", None))
    setting = known[0](config) if known else None
    return f"the setting {setting} of this {config.model_type} model {known[1]}" if setting else None


def stack_layers(model: nn.Module, spec: ArchSpec | None = None) -> dict[str, list[nn.Module]]:
    """The blocks of each stack (``{"encoder": [...], "decoder": [...]}``; one entry for
    single-stack models)."""
    spec = spec or get_spec(model.config)
    base = base_model(model)
    out: dict[str, list[nn.Module]] = {}
    for s in spec.site_specs:
        out.setdefault(s.stack, list(base.get_submodule(s.layers)))
    return out


def max_positions(config) -> int | None:
    """Longest sequence the position table allows (tokens), or None where nothing limits it
    (``max_target_positions``: the decoder's table of Whisper-style configs, read where the decoder runs
    alone, as WhisperForCausalLM)."""
    limits = [getattr(config, a) for a in ("max_position_embeddings", "n_positions", "max_target_positions")
              if isinstance(getattr(config, a, None), int)]
    spec = get_spec(config)
    limits = [n - spec.position_offset(config) for n in limits]
    return min(limits) if limits else None


def base_model(model: nn.Module) -> nn.Module:
    """The bare transformer inside a model with a task head (``GPT2LMHeadModel.transformer`` ...)."""
    return getattr(model, "base_model", model)


def has_type_table(config) -> bool:
    """Whether ``config`` gives token types (segments) a table of their own: ``type_vocab_size`` >= 1
    (BERT, ELECTRA, ALBERT: 2; RoBERTa: 1), or ``type_vocab_sizes`` (TAPAS's several). A model without
    one gets no ``token_type_ids``: GPT-2, GPT-Neo, GPT-J and CTRL accept them anyway and look them up
    in their token embedding table (adding token 0's embedding at every position for ids of 0, with a
    note that they were not passed); DeBERTa-v3 (``type_vocab_size=0``), DistilBERT, LLaMA ignore them."""
    if config is None:
        return True  # nothing to read: as before
    size = getattr(config, "type_vocab_size", None)
    return (isinstance(size, int) and size > 0) or bool(getattr(config, "type_vocab_sizes", None))
