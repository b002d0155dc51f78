"""The feeds of a split pass (:mod:`probe.circuits.forward`): recording every write, asking for the
gradient at every input, checking the recomputed head inputs, patching the edges outside a circuit."""

from __future__ import annotations

import torch

from .forward import Feed
from .graph import Graph


class Capture(Feed):
    """Record what every writer wrote: :meth:`outputs` [writers, batch, T, d_model] (detached), in
    the graph's writer order; :attr:`final` the stream before the final norm; :attr:`reads`
    (``"stream"`` or ``"mlp_in"``, layer) -> what a block and an MLP's norm read."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._out: dict[int, torch.Tensor] = {}
        self.final: torch.Tensor | None = None
        self.reads: dict[tuple[str, int], torch.Tensor] = {}

    def wrote(self, kind: str, layer: int, out: torch.Tensor) -> None:
        if kind == "final":
            self.final = out.detach()
        elif kind in ("stream", "mlp_in"):
            self.reads[(kind, layer)] = out.detach()
        elif kind == "input":
            self._out[0] = out.detach()
        elif kind == "mlp":
            self._out[self.graph.mlp_node(layer)] = out.detach()
        elif kind == "heads":
            for h in range(out.shape[0]):
                self._out[self.graph.head_node(layer, h)] = out[h].detach()

    def outputs(self) -> torch.Tensor:
        """[writers, batch, T, d_model]."""
        return torch.stack([self._out[u] for u in range(self.graph.n_upstream)])


class Check(Capture):
    """Capture, and compare every head input recomputed from the model's own stream with what the
    attention function received (and the input of an MLP that reads the attention's norm with that
    norm recomputed: kind ``"mlp"``); the received one goes on. :attr:`errors`: kind -> the largest
    absolute difference over layers divided by the largest absolute value received; :attr:`layer_errors`:
    (kind, layer) -> that layer's."""

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph)
        self.errors: dict[str, float] = {}
        self.layer_errors: dict[tuple[str, int], float] = {}

    def delta(self, kind: str, layer: int) -> torch.Tensor | None:
        if kind == "mlp":
            return torch.zeros(1, 1, 1)  # asks an MLP that reads the attention's norm for its recomputation
        if kind not in ("q", "k", "v"):
            return None
        n = self.graph.heads if kind == "q" else self.graph.kv_heads
        return torch.zeros(n, 1, 1, 1)

    def recomputed(self, kind, layer, received, new):
        err = float((new.double() - received.double()).abs().max() / received.double().abs().max().clamp_min(1e-30))
        self.errors[kind] = max(self.errors.get(kind, 0.0), err)
        self.layer_errors[(kind, layer)] = err
        return received


class Gradients(Feed):
    """A zero tensor that requires its gradient at every input (:attr:`leaves`: (kind, layer) -> the
    tensor), so that the gradient of the metric there is the gradient at that input alone (a head's
    query input along that head's path only)."""

    def __init__(self, graph: Graph, batch: int, T: int, d_model: int, dtype: torch.dtype, device) -> None:
        self.graph, self.leaves = graph, {}
        self._shape, self._kw = (batch, T, d_model), {"dtype": dtype, "device": device}

    def delta(self, kind: str, layer: int) -> torch.Tensor:
        n = {"q": self.graph.heads, "k": self.graph.kv_heads, "v": self.graph.kv_heads}.get(kind)
        shape = self._shape if n is None else (n, *self._shape)
        leaf = torch.zeros(shape, requires_grad=True, **self._kw)
        self.leaves[(kind, layer)] = leaf
        return leaf


class Patch(Feed):
    """Feed each input the stream of the current pass minus, for every edge into it that is outside
    the circuit, its writer's current write minus its write in the corrupted run: an included edge
    carries what its writer writes in this pass, an excluded one what it wrote in the corrupted run.

    Args:
        graph: the graph.
        corrupted: [writers, batch, T, d_model] the corrupted run's writes (:class:`Capture`).
        excluded: [inputs, writers] boolean, True for an edge outside the circuit (False where there is
            no edge).
    """

    def __init__(self, graph: Graph, corrupted: torch.Tensor, excluded: torch.Tensor) -> None:
        self.graph, self.corrupted = graph, corrupted
        self.excluded = excluded.to(corrupted.dtype)
        self.diff = torch.zeros_like(corrupted)
        self.rows: dict[tuple[str, int], list[int]] = {}
        for d, (kind, layer, _) in enumerate(graph.downstream):
            self.rows.setdefault((kind, layer), []).append(d)
        self._ready: dict[tuple[str, int], torch.Tensor | None] = {}

    def wrote(self, kind: str, layer: int, out: torch.Tensor) -> None:
        g = self.graph
        if kind not in ("input", "mlp", "heads"):
            return
        if kind == "input":
            self.diff[0] = out.detach() - self.corrupted[0]
        elif kind == "mlp":
            u = g.mlp_node(layer)
            self.diff[u] = out.detach() - self.corrupted[u]
        else:
            u = g.head_node(layer, 0)
            self.diff[u:u + g.heads] = out.detach() - self.corrupted[u:u + g.heads]

    def delta(self, kind: str, layer: int) -> torch.Tensor | None:
        """Minus the excluded edges' differences summed into each input of (kind, layer).

        A layer's q, k, v and MLP inputs all read writers 0 .. n - 1 (the MLP also the layer's heads),
        so when q asks, one product over those writers serves the four; k and v take theirs as made,
        the MLP adds the layer's heads when it asks. Reading the writes once a layer rather than four
        times is most of what a circuit's pass costs beyond the model's own forward pass."""
        if kind in ("k", "v", "mlp") and (kind, layer) in self._ready:
            part = self._ready.pop((kind, layer))
            if kind == "mlp":
                n, m = self.graph.reads("q", layer), self.graph.reads("mlp", layer)
                tail = self.excluded[self.rows[("mlp", layer)], n:m]
                if bool(tail.any()):
                    part = part - (tail @ self.diff[n:m].reshape(m - n, -1)).reshape(1, *self.diff.shape[1:])
                return part[0] if bool(self.excluded[self.rows[("mlp", layer)], :m].any()) else None
            return part if bool(self.excluded[self.rows[(kind, layer)]].any()) else None
        kinds = ("q", "k", "v", "mlp") if kind == "q" else (kind,)
        rows = [d for k in kinds for d in self.rows[(k, layer)]]
        n = self.graph.reads(kind, None if kind == "logits" else layer)
        weights = self.excluded[rows, :n]
        shape = self.diff.shape[1:]
        if kind != "q":
            if not bool(weights.any()):
                return None
            out = -(weights @ self.diff[:n].reshape(n, -1)).reshape(len(rows), *shape)
            return out if kind in ("k", "v") else out[0]
        if bool(weights.any()):
            out = -(weights @ self.diff[:n].reshape(n, -1)).reshape(len(rows), *shape)
        else:
            out = torch.zeros(len(rows), *shape, dtype=self.diff.dtype, device=self.diff.device)
        parts = out.split([len(self.rows[(k, layer)]) for k in kinds])
        self._ready.update({(k, layer): part for k, part in zip(kinds[1:], parts[1:])})
        return parts[0] if bool(self.excluded[self.rows[("q", layer)]].any()) else None
