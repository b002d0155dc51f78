"""A model's circuit graph, checked by one short pass before any score is computed: the head inputs
recomputed from the stream equal what probe's attention function receives, the stream before the
final norm is the sum of the writes (and the output projections' biases), and the MLP reads the
block's input (parallel attention and MLP) or the stream after the heads (sequential).

A layer whose inputs recomputed from its weights do not match what its attention received (queries
scaled inside the module as OPT's, a rotation computed inside it as GPT-J's) is recomputed by
rerunning its attention module instead (:func:`probe.circuits.wiring.rerun`), and checked again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch

from ..capture.hooks import calls_function
from ..capture.swapped import swap_if_agrees
from ..errors import UnsupportedAnalysisError
from .feeds import Check
from .forward import split_pass
from .graph import Graph
from .wiring import TURNS, Wiring, wire

#: Largest relative difference accepted between a recomputed and a received head input, and between
#: the final stream and the sum of the writes (float32 arithmetic in another order).
TOLERANCE = 1e-4


def tolerance(lm) -> float:
    """:data:`TOLERANCE`, or 8 units of rounding of a half-precision model's dtype (bfloat16: 0.0625;
    float16: 0.0078): the residual stream is added up in that dtype, layer after layer. A structure the
    graph does not fit differs by far more (0.7 to 8 relative, measured on Falcon with a shared norm
    read as its own and on GLM-4)."""
    dtype = next(lm.model.parameters()).dtype
    return max(TOLERANCE, 8 * torch.finfo(dtype).eps) if dtype.is_floating_point else TOLERANCE


def _fit_turns(lm, wiring: Wiring, graph: Graph, ids: torch.Tensor, mask: torch.Tensor, tol: float) -> Check:
    """The check's pass; for a model whose spec was discovered, each layer's way of turning q and k
    (:data:`~probe.circuits.wiring.TURNS`) is the one whose recomputed q and k come closest to what its
    attention received, trying them in order until every layer is within ``tol``. Returns
    the last pass's :class:`~probe.circuits.feeds.Check` (run again with the layers' final choice)."""
    check = Check(graph)
    split_pass(lm, wiring, ids, mask, check)
    turning = [i for i, layer in enumerate(wiring.layers) if layer.turn is not None]
    if not turning:
        return check
    best: dict[int, tuple[float, str]] = {}
    for how in TURNS:
        if how != TURNS[0]:
            for i in turning:
                wiring.layers[i].turn = how
            check = Check(graph)
            try:
                split_pass(lm, wiring, ids, mask, check)
            except (RuntimeError, ValueError):  # cos and sin of a width this way cannot use
                continue
        for i in turning:
            err = max(check.layer_errors.get((k, i), 0.0) for k in ("q", "k"))
            if i not in best or err < best[i][0]:
                best[i] = (err, how)
        if all(best[i][0] <= tol for i in turning):
            break
    for i in turning:
        wiring.layers[i].turn = best[i][1]
    check = Check(graph)
    split_pass(lm, wiring, ids, mask, check)
    return check


def _fit(lm, wiring: Wiring, graph: Graph, ids: torch.Tensor, mask: torch.Tensor, tol: float) -> Check:
    """:func:`_fit_turns`, then every layer whose recomputed q, k or v still differ by more than
    ``tol`` rerun by its attention module, and the check's pass again."""
    check = _fit_turns(lm, wiring, graph, ids, mask, tol)
    off = [i for i, layer in enumerate(wiring.layers)
           if not layer.rerun and max(check.layer_errors.get((k, i), 0.0) for k in ("q", "k", "v")) > tol]
    if not off:
        return check
    for i in off:
        wiring.layers[i].rerun = True
    check = Check(graph)
    split_pass(lm, wiring, ids, mask, check)
    return check

def _cause(kinds: set[str]) -> str:
    """The likely cause of a recomputation that does not reproduce the inputs of ``kinds`` (q, k and v
    are rerun by the attention module where the weights did not reproduce them: what is left is the
    stream the module reads)."""
    if "mlp" in kinds:
        return "its MLP does not read the attention's norm (it reads a norm of its own that probe did not find)"
    return ("not even its attention module rerun on the stream reproduces them: its norm before the attention is not "
            "the one probe found, or the module reads more than the block's input")


@torch.no_grad()
def checked_graph(lm, ids: torch.Tensor | None = None, mask: torch.Tensor | None = None
                  ) -> tuple[Wiring, Graph, Check]:
    """Wire ``lm``, run it once on ``ids`` (default: tokens 1 .. 6) and build its :class:`Graph`.

    Returns:
        (wiring, graph, the :class:`~probe.circuits.feeds.Check` of the pass: its ``errors``).

    Raises:
        UnsupportedAnalysisError: as :func:`~probe.circuits.wiring.wire`; a head input that the
            recomputation does not reproduce, or a stream that is not the sum of the writes.
    """
    wiring = wire(lm)
    g = lm.geometry
    if ids is None:
        ids = torch.arange(1, 7)[None]
        mask = torch.ones_like(ids)
    graph = Graph(g.n_layers, g.n_heads, g.n_kv_heads)
    tol = tolerance(lm)
    check = _fit(lm, wiring, graph, ids, mask, tol)
    if not {"q", "k", "v"} <= set(check.errors) or len(check.reads) != 2 * g.n_layers or check.final is None:
        raise UnsupportedAnalysisError(f"circuits: {lm.name}'s attention modules do not call probe's attention "
                                       "function (transformers' AttentionInterface), where circuits feed each head")
    bad = {k: e for k, e in check.errors.items() if e > tol}
    if bad:
        differ = ", ".join(f"{k} by {e:.2g}" for k, e in bad.items())
        raise UnsupportedAnalysisError(f"circuits: {lm.name}'s inputs recomputed from the residual stream differ from "
                                       f"what its modules receive (relative: {differ}): {_cause(set(bad))}")
    parallel = all(torch.equal(check.reads[("stream", i)], check.reads[("mlp_in", i)]) for i in range(g.n_layers))
    graph = Graph(g.n_layers, g.n_heads, g.n_kv_heads, parallel)
    total = check.outputs().sum(0).double()
    for layer in wiring.layers:
        if layer.weights.b_O is not None:
            total = total + layer.weights.b_O.double()
    gap = float((total - check.final.double()).abs().max() / check.final.double().abs().max())
    if gap > tol:
        raise UnsupportedAnalysisError(f"circuits: {lm.name}'s stream before the final norm is not the sum of what its "
                                       f"embeddings, heads and MLPs write (relative difference {gap:.2g}): a norm "
                                       "after a sub-layer or a residual inside a module")
    check.decomposition = gap
    return wiring, graph, check


@contextmanager
def graph_of(lm, ids: torch.Tensor | None = None, mask: torch.Tensor | None = None
             ) -> Iterator[tuple[Wiring, Graph, Check]]:
    """:func:`checked_graph` of ``lm``, for the life of the context: a hand-spec family whose attention
    modules compute attention themselves (Falcon, BLOOM, GPT-Neo in transformers 5) runs probe's
    reference module in their place where it reproduces the model bit for bit
    (:func:`probe.capture.swapped.swap_if_agrees`), so that every head's inputs pass through probe's
    attention function; the model is as it was afterwards.

    Raises:
        UnsupportedAnalysisError: as :func:`checked_graph`.
    """
    with ExitStack() as stack:
        if not calls_function(lm):
            swap_if_agrees(lm, stack)
        yield checked_graph(lm, ids, mask)
