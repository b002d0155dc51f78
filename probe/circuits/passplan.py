"""A circuit's pass planned before it runs: which writes it needs and, for each input, the cheaper of
two equal ways to build the stream it reads.

An input d of a circuit C reads the pass's own stream minus, for each edge into it outside C, its
writer's write in this pass minus its write in the corrupted run (:mod:`probe.circuits.evaluate`).
Since the own stream minus every writer's (write - corrupted write) is the corrupted run's stream at
the same place, the same input is also the corrupted stream plus the (write - corrupted write) of the
edges into it inside C. The plan takes whichever sum has fewer terms, input by input:

- ``own`` stream minus the excluded edges' differences (a circuit close to the complete graph);
- ``corrupted`` stream plus the included edges' differences (a circuit close to the empty graph).

Before that, the circuit is pruned to the edges on paths from the embeddings to the logits
(:func:`~probe.circuits.graph.paths`): the rest change nothing the logits read, so M is the same. A
writer that no edge of the pruned circuit reaches reads what it read in the corrupted run and writes
what it wrote there: its difference is 0 and it enters neither sum. So a circuit's pass costs its
forward pass plus one product per layer over the writers on its paths, with as many terms per input
as the smaller of its included and excluded edges on those paths. Two circuits need no pass at all:
the pruned circuit without an edge is the corrupted run, and one whose every input reads its own
stream is the clean run.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from .graph import Graph, _layout, paths
from .rowsums import csr, weighted_rows

#: A product over the writers is done sparse (one term per edge) below this many terms per writer
#: column of the dense product (measured on 2 CPU cores: a sparse product of 16 inputs over 150
#: writers costs the dense one at about 2-3 terms per column).
SPARSE_BELOW = 2.0


@dataclass
class Product:
    """Signed weights of a product over writers ``lo .. hi - 1``: ``terms`` the nonzero ones
    (:func:`~probe.circuits.rowsums.csr`: +1, the corrupted stream plus the edge's difference; -1, the
    own stream minus it), summed by the compiled pass of :mod:`probe.circuits.rowsums`, else by torch
    (``weights`` [rows, hi - lo], sparse where :data:`SPARSE_BELOW` says so)."""

    terms: tuple
    weights: torch.Tensor
    lo: int
    hi: int

    def __call__(self, diff: torch.Tensor) -> torch.Tensor:
        """[rows, batch * T * d_model]: the weighted sum of ``diff`` [writers, batch, T, d_model]."""
        flat = diff[self.lo:self.hi].reshape(self.hi - self.lo, -1)
        out = weighted_rows(self.terms, flat)
        if out is not None:
            return out
        if self.weights.layout == torch.sparse_csr:
            return torch.sparse.mm(self.weights, flat)
        return self.weights @ flat


@dataclass
class Group:
    """The inputs of one (kind, layer) group as the pass asks for them: ``rows`` (graph input
    indices), ``corrupted`` [rows] boolean (the row starts from the corrupted run's stream, else from
    the pass's own), ``product`` (the weighted differences over the writers read when the group is
    asked, or None), ``tail`` (an MLP's product over its own layer's heads, added when it asks, or
    None), ``terms`` [rows] boolean (the row has a product term); ``own``: every row reads the pass's own
    stream unchanged."""

    rows: list[int]
    corrupted: np.ndarray
    product: Product | None = None
    tail: Product | None = None
    terms: np.ndarray | None = None

    @property
    def own(self) -> bool:
        return not self.corrupted.any() and self.product is None and self.tail is None


@dataclass
class PassPlan:
    """A circuit's pass (module docstring).

    Attributes:
        run: ``"clean"`` (the pass is the clean run: every input reads its own stream), ``"corrupted"``
            (the pruned circuit has no edge: the corrupted run) or ``"pass"``.
        groups: (kind, layer) -> :class:`Group`; a q group's product holds the rows of its layer's q, k,
            v and MLP inputs in that order (one product a layer, done when q asks).
        writers: [writers] boolean, the writers whose differences the pass needs.
        terms: the number of (write - corrupted write) terms summed over all inputs.
        key: a digest of the pruned circuit's edges (:func:`pass_key`): two circuits with the same key
            have the same plan and the same pass (b"" for a clean or corrupted run).
        weights: [inputs, writers] int8, each input's signed terms (+1: the corrupted stream plus the
            edge's difference; -1: the own stream minus it), None for a clean or corrupted run.
        from_corrupted: [inputs] boolean, the inputs that start from the corrupted stream (None likewise).
    """

    run: str
    groups: dict = field(default_factory=dict)
    writers: np.ndarray | None = None
    terms: int = 0
    key: bytes = b""
    weights: np.ndarray | None = None
    from_corrupted: np.ndarray | None = None


def _product(weights: np.ndarray, lo: int, hi: int, dtype, device) -> Product | None:
    w = weights[:, lo:hi]
    nnz = int(np.count_nonzero(w))
    if nnz == 0:
        return None
    t = torch.as_tensor(w, dtype=dtype, device=device)
    if nnz < SPARSE_BELOW * (hi - lo) and device.type == "cpu":
        with warnings.catch_warnings():  # torch calls its sparse CSR support beta: said once a process, on stderr
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)
            t = t.to_sparse_csr()
    return Product(csr(w), t, lo, hi)


def _terms(graph: Graph, included: np.ndarray, coupled=None):
    """(run, writers, from_corrupted [inputs], weights [inputs, writers] int8, kept [inputs, writers]
    the pruned circuit) of a circuit's pass (:func:`plan_pass`); run ``"corrupted"`` or ``"clean"`` with
    the other four None."""
    kept = paths(graph, included, coupled)
    if not kept.any():
        return "corrupted", None, None, None, None
    readers, _ = _layout(graph)
    writers = readers[kept.any(1)].any(0)  # the writers whose inputs read a difference
    writers[0] = True
    for layer in np.flatnonzero(np.zeros(graph.layers, dtype=bool) if coupled is None else coupled):
        heads = slice(graph.head_node(layer, 0), graph.head_node(layer, 0) + graph.heads)
        writers[heads] = writers[heads].any()
    reads = np.array([graph.reads(kind, None if kind == "logits" else layer) for kind, layer, _ in graph.downstream])
    span = np.arange(graph.n_upstream)[None, :] < reads[:, None]
    inc = kept.sum(1)
    exc_edges = span & writers[None, :] & ~kept
    exc = exc_edges.sum(1)
    from_corrupted = (inc <= exc) & (exc > 0)  # ties: the corrupted stream (a row without any term needs no sum)
    weights = np.where(from_corrupted[:, None], kept.astype(np.int8), -exc_edges.astype(np.int8))
    weights[exc == 0] = 0  # every edge on the paths is in: the row reads its own stream
    if not from_corrupted.any() and not weights.any():
        return "clean", None, None, None, None
    return "pass", writers, from_corrupted, weights, kept


def pass_key(graph: Graph, included: np.ndarray, coupled=None) -> bytes | None:
    """The :attr:`PassPlan.key` of a circuit ([inputs, writers] boolean) that needs a pass, or None where
    its pruned form is the clean or the corrupted run (:func:`plan_pass`)."""
    run, *_, kept = _terms(graph, included, coupled)
    return _key(kept) if run == "pass" else None


def _key(kept: np.ndarray) -> bytes:
    """A 32-byte BLAKE2b digest of the pruned circuit's [inputs, writers] bits (a few KB to a few hundred
    KB packed, so remembering thousands of circuits keeps their digests, not their edges)."""
    return hashlib.blake2b(np.packbits(kept).tobytes(), digest_size=32).digest()


def plan_pass(graph: Graph, included: np.ndarray, dtype=torch.float32, device=None, coupled=None) -> PassPlan:
    """The plan of the pass of a circuit (module docstring).

    Args:
        graph: the graph.
        included: [inputs, writers] boolean, the circuit's edges (:func:`~probe.circuits.graph.edge_matrix`).
        dtype, device: of the products' weights (the writes').
        coupled: [layers] boolean, layers whose heads' writes share a norm's scale (Gemma 2's norm after
            the attention), or None (:func:`~probe.circuits.graph.paths`): a head of such a layer
            writes what it wrote in the corrupted run only when none of the layer's heads reads a
            difference.

    Returns:
        A :class:`PassPlan`.
    """
    device = torch.device("cpu") if device is None else torch.device(device)
    run, writers, from_corrupted, weights, kept = _terms(graph, included, coupled)
    if run != "pass":
        return PassPlan(run, writers=np.zeros(graph.n_upstream, dtype=bool))
    groups: dict = {}
    rows_of: dict = {}
    has = weights.any(1)
    for d, (kind, layer, _) in enumerate(graph.downstream):
        rows_of.setdefault((kind, layer), []).append(d)
    for layer in range(graph.layers):
        n, m = graph.reads("q", layer), graph.reads("mlp", layer)
        rows = [d for kind in ("q", "k", "v", "mlp") for d in rows_of[(kind, layer)]]
        w = weights[rows].astype(np.float32)
        mlp_row = rows_of[("mlp", layer)]
        q = rows_of[("q", layer)]
        groups[("q", layer)] = Group(q, from_corrupted[q], _product(w, 0, n, dtype, device), terms=has[q])
        for kind in ("k", "v"):
            k_rows = rows_of[(kind, layer)]
            groups[(kind, layer)] = Group(k_rows, from_corrupted[k_rows], terms=has[k_rows])
        groups[("mlp", layer)] = Group(mlp_row, from_corrupted[mlp_row],
                                       tail=_product(weights[mlp_row].astype(np.float32), n, m, dtype, device))
    last = len(graph.downstream) - 1
    groups[("logits", graph.layers)] = Group([last], from_corrupted[[last]],
                                             _product(weights[[last]].astype(np.float32), 0, graph.n_upstream,
                                                      dtype, device))
    return PassPlan("pass", groups, writers, int(np.count_nonzero(weights)), _key(kept), weights, from_corrupted)


def first_change(graph: Graph, before: PassPlan, plan: PassPlan) -> int:
    """The lowest layer whose part of ``plan``'s pass may differ from ``before``'s (both ``run == "pass"``):
    below it every input is fed the same stream by the same terms, so, the layers below being the same
    by induction, each block returns what it returned in ``before``'s pass and each writer that ``plan``
    needs wrote the same difference there (``before`` needed it too). ``graph.layers``: only the final
    norm's input (the logits') differs, or nothing does.

    A layer counts as changed from the first input whose terms or starting stream differ, and from the
    layer of the first writer ``plan`` needs whose difference ``before``'s pass did not record.
    """
    layer_of = _input_layers(graph)
    changed = (plan.weights != before.weights).any(1) | (plan.from_corrupted != before.from_corrupted)
    first = int(layer_of[changed].min()) if changed.any() else graph.layers
    unrecorded = np.flatnonzero(plan.writers & ~before.writers)
    if len(unrecorded):  # writer 0 (the embeddings) is always recorded; writer u > 0 writes in layer (u - 1) // (H + 1)
        first = min(first, int((unrecorded.min() - 1) // (graph.heads + 1)))
    return first


def _input_layers(graph: Graph) -> np.ndarray:
    """[inputs] the layer of each input (``graph.layers`` for the logits')."""
    return np.array([layer for _, layer, _ in graph.downstream])
