"""The feeds of a split pass (:mod:`probe.circuits.forward`): recording every write, asking for the
gradient at every input, checking the recomputed head inputs, patching the edges outside a circuit."""

from __future__ import annotations

import numpy as np
import torch

from .forward import Feed, Heads
from .graph import Graph


class Capture(Feed):
    """Record what every writer wrote: :meth:`outputs` [writers, batch, T, d_model] (detached), in
    the graph's writer order; :attr:`final` the stream before the final norm; :attr:`reads`
    (``"stream"`` or ``"mlp_in"``, layer) -> what a block and an MLP's norm read; with ``inputs``,
    :attr:`inputs` (q, k or v, layer) -> what the attention function received there [batch, n, T,
    d_head]."""

    def __init__(self, graph: Graph, inputs: bool = False) -> None:
        self.graph = graph
        self._out: dict[int, torch.Tensor] = {}
        self.final: torch.Tensor | None = None
        self.reads: dict[tuple[str, int], torch.Tensor] = {}
        self.inputs: dict[tuple[str, int], torch.Tensor] | None = {} if inputs else None

    def received(self, kind: str, layer: int, tensor: torch.Tensor) -> None:
        if self.inputs is not None:
            self.inputs[(kind, layer)] = tensor.detach()

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

    def listens(self, kind: str, layer: int) -> bool:
        return False  # the gradients need no writes


class Patch(Feed):
    """Feed each input of a circuit's pass the stream its :class:`~probe.circuits.passplan.PassPlan`
    says: the pass's own stream minus the excluded edges' (write - corrupted write), or the corrupted
    run's stream plus the included edges' (the same stream, :mod:`probe.circuits.passplan`): an edge
    in the circuit carries what its writer writes in this pass, one outside it what it wrote in the
    corrupted run.

    Args:
        graph: the graph.
        plan: the circuit's plan (``run == "pass"``).
        corrupted: [writers, batch, T, d_model] the corrupted run's writes (:class:`Capture`).
        reads: the corrupted run's streams that the inputs read (:attr:`Capture.reads`); final: its
            stream before the final norm [batch, T, d_model].
        diff: [writers, batch, T, d_model] a buffer of finite values for the differences (the writers
            the plan needs are written; the others' weights are 0), or None: a new one.
    """

    def __init__(self, graph: Graph, plan, corrupted: torch.Tensor, reads: dict, final: torch.Tensor,
                 diff: torch.Tensor | None = None, inputs: dict | None = None) -> None:
        self.graph, self.plan, self.corrupted, self.reads, self.final = graph, plan, corrupted, reads, final
        self.inputs = inputs
        self.diff = torch.zeros_like(corrupted) if diff is None else diff
        self._parts: dict[tuple[str, int], torch.Tensor] = {}

    def _heads(self, layer: int) -> list[int]:
        first = self.graph.head_node(layer, 0)
        return [int(h) for h in np.flatnonzero(self.plan.writers[first:first + self.graph.heads])]

    def listens(self, kind: str, layer: int) -> bool | list[int]:
        if kind == "heads":
            heads = self._heads(layer)
            return heads if len(heads) < self.graph.heads else bool(heads)
        return kind != "mlp" or bool(self.plan.writers[self.graph.mlp_node(layer)])

    def wrote(self, kind: str, layer: int, out: torch.Tensor) -> None:
        g = self.graph
        if kind == "input":
            torch.sub(out.detach(), self.corrupted[0], out=self.diff[0])
        elif kind == "mlp" and self.plan.writers[g.mlp_node(layer)]:
            u = g.mlp_node(layer)
            torch.sub(out.detach(), self.corrupted[u], out=self.diff[u])
        elif kind == "heads":
            first = g.head_node(layer, 0)
            if len(out) == g.heads and self.plan.writers[first:first + g.heads].all():  # one subtraction
                torch.sub(out.detach(), self.corrupted[first:first + g.heads], out=self.diff[first:first + g.heads])
                return
            heads = range(g.heads) if len(out) == g.heads else self._heads(layer)
            for row, h in enumerate(heads):
                u = first + h
                if self.plan.writers[u]:
                    torch.sub(out[row].detach(), self.corrupted[u], out=self.diff[u])

    def _streams(self, group, own: torch.Tensor, base: torch.Tensor, part: torch.Tensor | None) -> torch.Tensor:
        """[rows, batch, T, d_model]: each row's own or corrupted stream plus its part of the product."""
        out = torch.stack([base if c else own for c in group.corrupted])
        return out if part is None else out + part.reshape(out.shape).to(out.dtype)

    def fed(self, kind: str, layer: int, own: torch.Tensor) -> torch.Tensor | None:
        """The streams of (kind, layer) (:meth:`Feed.fed`). A layer's q, k, v and MLP rows share one
        product over the writers before the layer, done when q asks; the MLP adds its layer's heads
        (``tail``) when it asks."""
        group = self.plan.groups[(kind, layer)]
        if kind == "q":
            part = None if group.product is None else group.product(self.diff)
            sizes = {k: len(self.plan.groups[(k, layer)].rows) for k in ("q", "k", "v", "mlp")}
            if part is not None:
                for k, chunk in zip(("q", "k", "v", "mlp"), part.split(list(sizes.values()))):
                    self._parts[(k, layer)] = chunk
        if kind == "logits":
            part = None if group.product is None else group.product(self.diff)
            base = self.final
        elif kind == "mlp":
            part = self._parts.pop((kind, layer), None)
            if group.tail is not None:
                tail = group.tail(self.diff)
                part = tail if part is None else part + tail
            base = self.reads[("mlp_in", layer)]
        else:
            part = self._parts.pop((kind, layer), None)
            base = self.reads[("stream", layer)]
        if part is None and not group.corrupted.any():
            return None
        if kind in ("q", "k", "v") and self.inputs is not None:
            return self._some(group, kind, layer, own, base, part)
        out = self._streams(group, own, base, part)
        return out if kind in ("q", "k", "v") else out[0]

    def _some(self, group, kind: str, layer: int, own: torch.Tensor, base: torch.Tensor, part) -> Heads:
        """The heads of a q, k or v group as :class:`~probe.circuits.forward.Heads`: a head whose input
        has terms is recomputed from its stream; one that reads the corrupted stream alone takes what the
        attention received in the corrupted run; one that reads its own stream alone keeps the pass's."""
        terms = np.zeros(len(group.rows), dtype=bool) if part is None else group.terms
        recompute = [int(j) for j in np.flatnonzero(terms)]
        fixed = [int(j) for j in np.flatnonzero(group.corrupted & ~terms)]
        streams = None
        if recompute:  # each row's terms plus its own or corrupted stream, one pass a row (a + b = b + a)
            rows = part.reshape(len(group.rows), *own.shape)
            streams = torch.empty((len(recompute), *own.shape), dtype=own.dtype, device=own.device)
            for k, j in enumerate(recompute):
                torch.add(rows[j].to(own.dtype), base if group.corrupted[j] else own, out=streams[k])
        given = self.inputs[(kind, layer)][:, fixed] if fixed else None
        return Heads(streams, recompute, given, fixed)
