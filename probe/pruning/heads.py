"""Heads in the original numbering, and the physical layout of each layer after heads are removed.

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

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..errors import InputError

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
