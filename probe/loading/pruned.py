"""A pruned model's saved format, read by loading: heads in the original numbering, the physical layout of
each layer after heads are removed, and the folder built back into a model (:func:`load_pruned_folder`).

A pruned model's folder holds the ORIGINAL config (``config.json``: its layers x heads), the smaller
weights (``model.safetensors``, under the model's own parameter names, tied tensors stored once),
the tokenizer, and :data:`PRUNED_FILE`: the removed heads in the original numbering and the layout of
every layer. :func:`load_pruned_folder` builds the model from the config, removes the same heads the
same way (:func:`apply_layout`), then loads the weights, so outputs are identical after the round trip
(:mod:`probe.pruning.saving` writes such a folder; :mod:`probe.pruning.removal` removes heads from a
loaded model with the same :func:`apply_layout`).

A pruned model keeps its original config (layers x heads); every head keeps its original number
(layer, head) for its whole life, however many heads were removed before it. What changes is the
*layout* of each layer: which original query head sits in each slot of the attention module's
query projection, and which original key/value head in each key/value slot
(:class:`LayerLayout`). :class:`PrunedHeads` holds the layouts of every layer and converts between
the two numberings.

Grouped key/value heads (Ainslie et al. 2023, "GQA", sec. 2): query head h of a layer with H query
heads and K key/value heads reads key/value head h // (H / K). Hugging Face's attention repeats
every key/value head the same number of times (``num_key_value_groups``), so a layer must keep
equal groups. :func:`plan_layer` keeps a key/value head while any query head that reads it is kept
(it goes only when its whole group is pruned) and chooses, per layer, the group size g that needs
the fewest parameters: a group of s kept query heads becomes ceil(s / g) key/value copies, each
read by g query slots, padded with zero placeholders (query slots whose output-projection columns
are 0, so they add exactly nothing). A layer with every head pruned keeps one zero placeholder
head, because Hugging Face's attention modules cannot reshape zero heads; it adds nothing, so the
residual passes through unchanged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from ..architectures import ArchSpec, SiteSpec, get_spec, head_geometry, site_block, site_spec, sites
from ..errors import InputError, ModelLoadError
from .checkpoints import declared_dtype

#: The file naming a pruned model's removed heads, beside its config.json.
PRUNED_FILE = "probe_pruned_heads.json"
FORMAT = "probe-pruned-heads"


@dataclass(frozen=True)
class LayerLayout:
    """The heads of one layer as they sit in its projections.

    Attributes:
        q: original query head of each query slot (None: a zero placeholder slot).
        kv: original key/value head of each key/value slot (None: a zero placeholder slot).
            Query slot s reads key/value slot s // (len(q) // len(kv)).
    """

    q: tuple[int | None, ...]
    kv: tuple[int | None, ...]

    @property
    def group(self) -> int:
        """Query slots per key/value slot (``num_key_value_groups`` of the module)."""
        return len(self.q) // len(self.kv)

    @property
    def heads(self) -> tuple[int, ...]:
        """The original query heads present, in slot order."""
        return tuple(h for h in self.q if h is not None)

    @property
    def placeholders(self) -> int:
        """Zero placeholder query slots."""
        return sum(h is None for h in self.q)

    def to_json(self) -> dict:
        return {"q": list(self.q), "kv": list(self.kv)}

    @classmethod
    def from_json(cls, data: dict) -> LayerLayout:
        return cls(tuple(data["q"]), tuple(data["kv"]))


def full_layout(n_heads: int, n_kv_heads: int) -> LayerLayout:
    """The layout of an unpruned layer: slot i holds head i."""
    return LayerLayout(tuple(range(n_heads)), tuple(range(n_kv_heads)))


def plan_layer(kept: Iterable[int], n_heads: int, n_kv_heads: int, q_cost: int = 1,
               kv_cost: int = 1) -> LayerLayout:
    """The layout of a layer keeping the query heads ``kept`` (original numbers).

    Args:
        kept: query heads to keep.
        n_heads, n_kv_heads: the original query and key/value head counts.
        q_cost: parameters of one query slot (its query rows and output-projection columns).
        kv_cost: parameters of one key/value slot (its key and value rows).

    Returns:
        A :class:`LayerLayout`: key/value heads whose whole group is pruned are gone; the group
        size g (1..H/K) minimizes sum over kept groups of ceil(s / g) * (g * q_cost + kv_cost),
        ties going to the larger g (fewer key/value heads, a smaller key/value cache). Query heads
        keep their original order. No head kept: one placeholder slot (see the module docstring).
    """
    kept = sorted(set(int(h) for h in kept))
    if not kept:
        return LayerLayout((None,), (None,))
    per_kv = n_heads // n_kv_heads
    groups: dict[int, list[int]] = {}
    for h in kept:
        groups.setdefault(h // per_kv, []).append(h)
    best_g, best_cost = per_kv, None
    for g in range(per_kv, 0, -1):
        cost = sum(math.ceil(len(s) / g) * (g * q_cost + kv_cost) for s in groups.values())
        if best_cost is None or cost < best_cost:
            best_g, best_cost = g, cost
    q: list[int | None] = []
    kv: list[int | None] = []
    for j, members in groups.items():
        for start in range(0, len(members), best_g):
            chunk = members[start:start + best_g]
            kv.append(j)
            q.extend(chunk + [None] * (best_g - len(chunk)))
    return LayerLayout(tuple(q), tuple(kv))


@dataclass
class PrunedHeads:
    """Which heads of a model are physically gone, in the original numbering, and each layer's layout.

    Attributes:
        n_heads, n_kv_heads: original query and key/value heads per layer (from the config).
        layouts: one :class:`LayerLayout` per layer.
    """

    n_heads: int
    n_kv_heads: int
    layouts: list[LayerLayout]

    @classmethod
    def unpruned(cls, n_layers: int, n_heads: int, n_kv_heads: int) -> PrunedHeads:
        """Every head present."""
        return cls(n_heads, n_kv_heads, [full_layout(n_heads, n_kv_heads) for _ in range(n_layers)])

    @property
    def n_layers(self) -> int:
        return len(self.layouts)

    def present(self, layer: int) -> tuple[int, ...]:
        """Original query heads of ``layer`` still in the weights."""
        return self.layouts[layer].heads

    def removed(self) -> dict[int, tuple[int, ...]]:
        """``{layer: (head, ...)}`` of removed heads (original numbering; layers with none left out)."""
        out = {}
        for layer, lay in enumerate(self.layouts):
            gone = tuple(h for h in range(self.n_heads) if h not in lay.heads)
            if gone:
                out[layer] = gone
        return out

    def mask(self) -> torch.Tensor:
        """[layers, heads] float: 1 where the head is present, 0 where removed."""
        m = torch.zeros(self.n_layers, self.n_heads)
        for layer, lay in enumerate(self.layouts):
            m[layer, list(lay.heads)] = 1.0
        return m

    def heads_per_layer(self) -> list[int]:
        """Query heads present in each layer (placeholders not counted)."""
        return [len(lay.heads) for lay in self.layouts]

    def expand(self, layer: int, probs: torch.Tensor) -> torch.Tensor:
        """Put one site's probabilities [batch, slots, query, key] into the original numbering:
        [batch, heads, query, key], NaN for removed heads (so no statistic is made up for them)."""
        lay = self.layouts[layer]
        if lay.q == tuple(range(self.n_heads)):
            return probs
        out = probs.new_full((probs.shape[0], self.n_heads, *probs.shape[2:]), float("nan"))
        slots = [s for s, h in enumerate(lay.q) if h is not None]
        if slots:
            out[:, [lay.q[s] for s in slots]] = probs[:, slots]
        return out

    def to_json(self) -> dict:
        """The JSON record (see :data:`PRUNED_FILE`): removed heads in the original numbering, the
        layout of each layer and the heads left per layer."""
        return {
            "format": FORMAT, "version": 1, "heads": self.n_heads, "kv_heads": self.n_kv_heads,
            "pruned_heads": {str(layer): list(hs) for layer, hs in self.removed().items()},
            "heads_per_layer": self.heads_per_layer(),
            "layouts": [lay.to_json() for lay in self.layouts],
        }

    @classmethod
    def from_json(cls, data: dict) -> PrunedHeads:
        """Read :meth:`to_json`'s record.

        Raises:
            InputError: not a probe pruned-heads record.
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InputError(f"not a probe pruned-heads file (format {FORMAT!r} expected)")
        try:
            return cls(int(data["heads"]), int(data["kv_heads"]), [LayerLayout.from_json(x) for x in data["layouts"]])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"malformed pruned-heads file: {exc}") from None


#: The weights file of a pruned model's folder.
WEIGHTS = "model.safetensors"


class ConfigView:
    """A module's own view of the model config: ``overrides`` (its head count), everything else
    read from, and written to, the shared config (so ``set_attn_implementation`` still reaches it)."""

    def __init__(self, base, **overrides) -> None:
        base = base._base if isinstance(base, ConfigView) else base
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_overrides", dict(overrides))

    def __getattr__(self, name):
        overrides = object.__getattribute__(self, "_overrides")
        if name in overrides:
            return overrides[name]
        return getattr(object.__getattribute__(self, "_base"), name)

    def __setattr__(self, name, value) -> None:
        setattr(self._base, name, value)


@dataclass
class _Slots:
    """Indices into the current projections of the new layout's slots (None: zero placeholder)."""

    q: list[int | None]
    kv: list[int | None]
    old_q: int
    old_kv: int


def _source(current: LayerLayout, new: LayerLayout) -> _Slots:
    q = [None if h is None else current.q.index(h) for h in new.q]
    kv = [None if j is None else current.kv.index(j) for j in new.kv]
    return _Slots(q, kv, len(current.q), len(current.kv))


def _slice(attn_layer: nn.Module, spec: ArchSpec, paths: SiteSpec, s: _Slots, d: int) -> None:
    """Cut the query/key/value projections and the output projection's input of one layer to the new
    slots (the layout's own rules: :meth:`probe.architectures.layout.ProjectionLayout.cut_qkv`)."""
    spec.layout.cut_qkv(lambda role: attn_layer.get_submodule(getattr(paths, role)), s.q, s.kv, s.old_q, s.old_kv, d)
    spec.layout.cut_output(attn_layer.get_submodule(paths.o), s.q, d)


def _set_counts(attn: nn.Module, spec: ArchSpec, lay: LayerLayout, d: int, config) -> None:
    for attr in spec.head_count_attrs:
        setattr(attn, attr, len(lay.q))
    for attr in spec.width_attrs:
        setattr(attn, attr, len(lay.q) * d)
    if spec.kv_group_attr:
        setattr(attn, spec.kv_group_attr, lay.group)
    for attr in spec.kv_head_count_attrs:
        setattr(attn, attr, len(lay.kv))
    if spec.config_head_attrs:
        attn.config = ConfigView(config, **{a: len(lay.q) for a in spec.config_head_attrs})


def apply_layout(model: nn.Module, spec: ArchSpec, layer: int, current: LayerLayout, new: LayerLayout,
                 d_head: int) -> None:
    """Rewrite one layer's projections from ``current`` to ``new`` (both in original numbering), in place.

    Zero placeholder slots get zero query/key/value rows and zero output-projection columns.
    """
    site = sites(model.config)[layer]  # one-stack models: one self-attention site per layer
    block, paths = site_block(model, spec, site), site_spec(spec, site)
    s = _source(current, new)
    with torch.no_grad():
        _slice(block, spec, paths, s, d_head)
    _set_counts(block.get_submodule(paths.attention), spec, new, d_head, model.config)


def _state_dict(folder: Path) -> dict[str, torch.Tensor]:
    if not (folder / WEIGHTS).is_file():
        raise ModelLoadError(f"{folder}: no {WEIGHTS} beside {PRUNED_FILE}")
    return load_file(str(folder / WEIGHTS))


def _load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], folder: Path) -> None:
    """Load ``state`` into ``model``, matching keys saved with or without the base-model prefix
    (a masked-LM checkpoint loaded as the bare encoder); tied weights may be absent.

    Raises:
        ModelLoadError: a weight the model needs is missing, or a shape differs.
    """
    target = model.state_dict()
    prefix = getattr(model, "base_model_prefix", "") or ""
    mapped = {}
    for key, value in state.items():
        for cand in (key, key[len(prefix) + 1:] if key.startswith(prefix + ".") else None, f"{prefix}.{key}"):
            if cand in target:
                mapped[cand] = value
                break
    loaded_ptrs = {target[k].data_ptr() for k in mapped}
    missing = [k for k in target if k not in mapped and target[k].data_ptr() not in loaded_ptrs]
    if missing:
        raise ModelLoadError(f"{folder}: the saved weights lack {len(missing)} tensor(s) this model needs "
                             f"(first: {missing[0]}); was it saved from another model class?")
    bad = [k for k, v in mapped.items() if tuple(v.shape) != tuple(target[k].shape)]
    if bad:
        raise ModelLoadError(f"{folder}: weight {bad[0]} is {tuple(mapped[bad[0]].shape)} but the pruned layout "
                             f"gives {tuple(target[bad[0]].shape)}: {PRUNED_FILE} does not match the weights")
    model.load_state_dict(mapped, strict=False)


def load_pruned_folder(folder: str | Path, model_class, dtype: torch.dtype | None = None):
    """Build a pruned model from its folder (see the module docstring).

    Args:
        folder: a folder written by :func:`probe.pruning.saving.save_pruned`.
        model_class: the ``transformers`` auto class to build (``AutoModel``, ``AutoModelForCausalLM`` ...).
        dtype: parameter dtype (default: the one its config declares, else float32).

    Returns:
        ``(model, tokenizer, pruned)``: eval mode, eager attention; ``pruned`` a
        :class:`~probe.loading.pruned.PrunedHeads` in the original numbering.

    Raises:
        ModelLoadError: unreadable record, missing weights, or weights that do not fit the record.
    """
    from transformers import AutoConfig, AutoTokenizer  # deferred: transformers takes ~1.5 s to import
    from transformers.initialization import no_init_weights  # deferred: transformers takes ~1.5 s to import

    path = Path(folder)
    try:
        pruned = PrunedHeads.from_json(json.loads((path / PRUNED_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, InputError) as exc:
        raise ModelLoadError(f"cannot read {path / PRUNED_FILE}: {exc}") from None
    config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    spec = get_spec(config)
    geo = head_geometry(config)
    if (pruned.n_layers, pruned.n_heads, pruned.n_kv_heads) != (geo.n_layers, geo.n_heads, geo.n_kv_heads):
        raise ModelLoadError(f"{path / PRUNED_FILE} describes {pruned.n_layers} x {pruned.n_heads} heads but the "
                             f"config has {geo.n_layers} x {geo.n_heads}")
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    with no_init_weights():
        model = model_class.from_config(config, attn_implementation="eager", trust_remote_code=False)
    model.tie_weights()  # skipped by no_init_weights; tied tensors are saved once
    full = full_layout(geo.n_heads, geo.n_kv_heads)
    for layer, lay in enumerate(pruned.layouts):
        if lay != full:
            apply_layout(model, spec, layer, full, lay, geo.d_head)
    _load_weights(model, _state_dict(path), path)
    model = model.to(dtype or declared_dtype(config))
    model.eval()
    return model, tokenizer, pruned
