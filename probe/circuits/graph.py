"""The computational graph of a decoder as circuits see it: nodes that write into the residual stream,
inputs that read from it, and one edge from every writer to every input that comes after it.

Upstream nodes (writers), in forward order: the embeddings (``input``: token and position embeddings,
the stream before the first block), every head (``L3H5``) (what it writes: z_h W_O^h, its output
before the output projection's bias times its rows of the output projection) and every MLP ``MLP{l}``
(its output). A layer's nodes are its heads, then its MLP.

Downstream inputs (readers): each head's query input (one per query head), its key and value inputs
(one per key/value head: with grouped-query attention a key/value head reads one stream for the whole
group), each MLP's input and the logits' input (the final norm's input). Each input reads the sum of
the outputs of the nodes before it (plus biases, the same in every run).

Edges join a writer to every input it precedes: a head of layer l reads the embeddings and all heads
and MLPs of layers before l; an MLP of layer l also reads layer l's heads in a sequential block
(GPT-2, LLaMA: attention, then MLP) but not in a parallel one (GPT-NeoX, GPT-J, Falcon: attention and
MLP read the same stream); the logits read every node. Counts, with L layers, H heads, K key/value
heads and S = L + (H + 1) L (L - 1) / 2 (the writers before each layer, summed over layers):
(H + 2K) S for the heads' inputs, S + L H for the MLPs (S when parallel), 1 + L (H + 1) for the logits
(:func:`edge_count`). GPT-2 with 2 layers of 4 heads: 110 edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..sites import head_name

#: The kinds of downstream input.
INPUTS = ("q", "k", "v", "mlp", "logits")


@dataclass(frozen=True)
class Graph:
    """The node and edge layout of one decoder (see the module docstring).

    Attributes:
        layers: L, blocks.
        heads: H, query heads per layer.
        kv_heads: K, key/value heads per layer (H without grouping).
        parallel: True where a block's MLP reads the same stream as its attention (so not its heads).
    """

    layers: int
    heads: int
    kv_heads: int
    parallel: bool = False

    # -- upstream nodes ---------------------------------------------------------------------------

    @property
    def n_upstream(self) -> int:
        """Writers: 1 + L (H + 1)."""
        return 1 + self.layers * (self.heads + 1)

    def head_node(self, layer: int, head: int) -> int:
        """The writer index of head (layer, head)."""
        return 1 + layer * (self.heads + 1) + head

    def mlp_node(self, layer: int) -> int:
        """The writer index of the MLP of ``layer``."""
        return 1 + layer * (self.heads + 1) + self.heads

    def reads(self, kind: str, layer: int | None = None) -> int:
        """How many writers an input reads: the writers are numbered in forward order, so an input
        reads writers ``0 .. reads - 1``.

        Args:
            kind: one of :data:`INPUTS`.
            layer: the input's layer (not for ``"logits"``).
        """
        if kind == "logits":
            return self.n_upstream
        before = 1 + layer * (self.heads + 1)
        return before + (self.heads if kind == "mlp" and not self.parallel else 0)

    @cached_property
    def upstream_names(self) -> list[str]:
        """Display names of the writers, by index: ``input``, ``L0H0`` ... ``MLP0``, ..."""
        names = ["input"]
        for layer in range(self.layers):
            names += [head_name(layer, h) for h in range(self.heads)] + [f"MLP{layer}"]
        return names

    # -- downstream inputs ------------------------------------------------------------------------

    @cached_property
    def downstream(self) -> list[tuple[str, int, int]]:
        """The inputs in forward order, as (kind, layer, index): index the query head (``q``), the
        key/value head (``k``, ``v``), 0 for ``mlp``; ``("logits", L, 0)`` last."""
        out = []
        for layer in range(self.layers):
            out += [("q", layer, h) for h in range(self.heads)]
            out += [("k", layer, g) for g in range(self.kv_heads)] + [("v", layer, g) for g in range(self.kv_heads)]
            out.append(("mlp", layer, 0))
        return out + [("logits", self.layers, 0)]

    def downstream_name(self, kind: str, layer: int, index: int) -> str:
        """The node an input belongs to: ``L3H5`` (a query head; a key/value head when not grouped),
        ``L3KV1`` (key/value head 1 of a grouped layer), ``MLP3``, ``logits``."""
        if kind == "logits":
            return "logits"
        if kind == "mlp":
            return f"MLP{layer}"
        grouped = kind in ("k", "v") and self.kv_heads != self.heads
        return f"L{layer}KV{index}" if grouped else head_name(layer, index)

    @cached_property
    def edge_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(upstream [E], downstream [E]) writer and input indices of every edge, inputs in forward
        order and writers in order within each input."""
        ups, downs = [], []
        for d, (kind, layer, _) in enumerate(self.downstream):
            n = self.reads(kind, None if kind == "logits" else layer)
            ups.append(np.arange(n))
            downs.append(np.full(n, d))
        return np.concatenate(ups), np.concatenate(downs)

    @property
    def n_edges(self) -> int:
        """Edges enumerated (equal to :func:`edge_count`)."""
        return len(self.edge_index[0])


def edge_count(layers: int, heads: int, kv_heads: int, parallel: bool = False) -> int:
    """The number of edges by formula (module docstring): (H + 2K) S + S + [L H if sequential]
    + 1 + L (H + 1), S = L + (H + 1) L (L - 1) / 2.

    Args:
        layers: L; heads: H; kv_heads: K; parallel: attention and MLP read the same stream.
    """
    S = layers + (heads + 1) * layers * (layers - 1) // 2
    return (heads + 2 * kv_heads) * S + S + (0 if parallel else layers * heads) + 1 + layers * (heads + 1)


def _reader_nodes(graph: Graph) -> list[list[int]]:
    """For each input, the writers it belongs to (a query input: its head; a key/value input: the heads
    of its group; an MLP input: the MLP); the logits' input: [] (the sink)."""
    rep = graph.heads // graph.kv_heads
    out = []
    for kind, layer, index in graph.downstream:
        if kind == "q":
            out.append([graph.head_node(layer, index)])
        elif kind in ("k", "v"):
            out.append([graph.head_node(layer, h) for h in range(index * rep, (index + 1) * rep)])
        elif kind == "mlp":
            out.append([graph.mlp_node(layer)])
        else:
            out.append([])
    return out


def edge_matrix(graph: Graph, included: np.ndarray) -> np.ndarray:
    """[inputs, writers] boolean: True for the edges of ``included`` ([edges] boolean, graph order)."""
    up, down = graph.edge_index
    out = np.zeros((len(graph.downstream), graph.n_upstream), dtype=bool)
    out[down, up] = np.asarray(included, dtype=bool)
    return out


def _layout(graph: Graph) -> tuple[np.ndarray, list[tuple[np.ndarray, int]]]:
    """([inputs, writers] boolean: the writers each input belongs to, :func:`_reader_nodes`; per layer,
    (its head inputs' rows, its MLP input's row))."""
    readers = np.zeros((len(graph.downstream), graph.n_upstream), dtype=bool)
    for d, nodes in enumerate(_reader_nodes(graph)):
        readers[d, nodes] = True
    layers: list[tuple[list[int], int]] = [([], -1) for _ in range(graph.layers)]
    for d, (kind, layer, _) in enumerate(graph.downstream):
        if kind in ("q", "k", "v"):
            layers[layer][0].append(d)
        elif kind == "mlp":
            layers[layer] = (layers[layer][0], d)
    return readers, [(np.array(rows), mlp) for rows, mlp in layers]


def paths(graph: Graph, included: np.ndarray, coupled=None) -> np.ndarray:
    """:func:`prune` on the [inputs, writers] matrix of a circuit (:func:`edge_matrix`), a layer at a
    time: the writers the embeddings reach inside the circuit, forward; those that reach the logits,
    backward; the edges between the two.

    Args:
        included: [inputs, writers] boolean.
        coupled: [layers] boolean, or None: layers whose heads' writes depend on every head of the
            layer (a norm after the attention whose scale the heads share, Gemma 2's: each head's write
            is scaled by the norm of their sum), so that the heads of such a layer are reached, and
            lead to the logits, together.

    Returns:
        [inputs, writers] boolean, a subset of ``included``.
    """
    inc = np.asarray(included, dtype=bool)
    readers, layers = _layout(graph)
    reached = np.zeros(graph.n_upstream, dtype=bool)
    reached[0] = True
    coupled = np.zeros(graph.layers, dtype=bool) if coupled is None else np.asarray(coupled, dtype=bool)

    def together(mark, layer):
        heads = slice(graph.head_node(layer, 0), graph.head_node(layer, 0) + graph.heads)
        if coupled[layer] and mark[heads].any():
            mark[heads] = True

    for layer, (rows, mlp) in enumerate(layers):  # a layer's head inputs read the layers before; its MLP also its heads
        fed = (inc[rows] & reached).any(1)
        reached |= readers[rows[fed]].any(0)
        together(reached, layer)
        if (inc[mlp] & reached).any():
            reached |= readers[mlp]
    useful = inc[-1].copy()  # what the logits read
    for layer in reversed(range(graph.layers)):
        rows, mlp = layers[layer]
        if (readers[mlp] & useful).any():
            useful |= inc[mlp]
        together(useful, layer)
        on = (readers[rows] & useful).any(1)
        useful |= inc[rows[on]].any(0)
    leads = (readers & useful).any(1)
    leads[-1] = True
    return inc & reached[None, :] & leads[:, None]


def prune(graph: Graph, included: np.ndarray) -> np.ndarray:
    """The edges of a circuit that lie on a path from the embeddings to the logits inside it; the others
    carry nothing when the circuit runs (:mod:`probe.circuits.evaluate`): a writer no circuit path
    reaches writes what it wrote in the corrupted run, and a reader with no circuit path on to the
    logits changes nothing they read.

    Args:
        included: [edges] boolean, the circuit.

    Returns:
        [edges] boolean, a subset of ``included``.
    """
    up, down = graph.edge_index
    return paths(graph, edge_matrix(graph, included))[down, up]
