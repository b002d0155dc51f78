"""Edge attribution: a first-order estimate of each edge's effect on the metric, for every edge at once.

EAP (Syed et al. 2023, "Attribution Patching Outperforms Automated Circuit Discovery"): the score of
the edge from writer u to input d is (o_u^corr - o_u^clean) . dM/d(input_d), summed over the pairs'
positions and the model's width, the gradient taken in the clean run: one forward pass each on the
clean and the corrupted prompts (the writes) and one forward and one backward pass for the gradients,
per batch of pairs. The gradient at an input is the gradient along that input's path only (a head's
query input: through that head's projection, the block's norm and the rotation, recomputed from the
stream; :mod:`probe.circuits.forward`).

EAP-IG (Hanna et al. 2024, "Have Faith in Faithfulness"), the inputs variant: the same product with
the gradient averaged over m points on the straight line from the corrupted to the clean embeddings
(a Riemann sum of the path integral, divided by m). Two conventions (:data:`POINTS`): ``"right"``,
probe's default, alpha_k = k / m for k = 1 .. m (the clean run is a point; m = 1 is EAP, alpha = 1);
``"left"``, alpha_k = k / m for k = 0 .. m - 1 (the corrupted run is a point, the clean run is not),
as the reference implementation (hannamw/EAP-IG, ``EAP-IG-inputs``) integrates. The two differ by
the end points: m left = m right - g(1) + g(0), g the gradient at alpha.

M is the logit difference logit(answer) - logit(wrong) at each pair's last real position, averaged
over the pairs, so scores are in logits of that mean; a node's score is the sum of its outgoing
edges' scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..effects.pairs import EncodedPairs
from .feeds import Capture, Gradients
from .forward import split_pass
from .graph import Graph
from .wiring import Wiring

#: The attribution methods.
METHODS = ("eap-ig", "eap")
#: EAP-IG's integration points (module docstring): ``right`` alpha = k / m, k = 1 .. m (the default);
#: ``left`` k = 0 .. m - 1 (hannamw/EAP-IG's).
POINTS = ("right", "left")


def alphas(m: int, points: str = "right") -> list[float]:
    """The m points alpha (0: the corrupted embeddings, 1: the clean ones) EAP-IG averages the gradient
    over, by the convention ``points`` (:data:`POINTS`).

    Raises:
        ValueError: m < 1 or another convention.
    """
    if m < 1 or points not in POINTS:
        raise ValueError(f"m must be >= 1 and points one of {POINTS}, not {m!r}, {points!r}")
    return [k / m for k in (range(1, m + 1) if points == "right" else range(m))]


def metric_positions(enc: EncodedPairs, rows: slice) -> torch.Tensor:
    """[P] the distinct positions where the metric reads the pairs ``rows`` (increasing)."""
    return torch.unique(enc.last[rows])


def logit_diff(logits: torch.Tensor, enc: EncodedPairs, rows: slice, positions: torch.Tensor | None = None
               ) -> torch.Tensor:
    """[batch] logit(answer) - logit(wrong) at each pair's last real position.

    Args:
        logits: [batch, T, vocab] of the pairs ``rows`` of ``enc``, or [batch, P, vocab] at ``positions``
            (:func:`metric_positions`).
    """
    last = enc.last[rows]
    if positions is not None:
        last = torch.searchsorted(positions, last)
    at = logits[torch.arange(logits.shape[0]), last.to(logits.device)]
    idx = torch.arange(len(at))
    return at[idx, enc.answer[rows].to(at.device)] - at[idx, enc.wrong[rows].to(at.device)]


#: Memory the writes and gradients of one batch of pairs may take (bytes), for the default batch size.
BATCH_MEMORY = 3 * 2**30


def pairs_per_batch(graph: Graph, enc: EncodedPairs, d_model: int, memory: int = BATCH_MEMORY) -> int:
    """The most pairs a batch holds within ``memory`` bytes (at least 1, at most all of them): per pair,
    the clean and corrupted writes (2 x writers) and an EAP-IG pass's gradients, their sum and the
    autograd state (about 5 x inputs), each [T, d_model] float32. SmolLM2 on the 20 built-in pairs (16
    tokens): 111 MB a pair, so all 20 in one batch (2.2 GB; measured: the scores raised the process's
    peak resident memory by 2.3 GB, from 0.98 to 3.27 GB)."""
    per_pair = (2 * graph.n_upstream + 5 * len(graph.downstream)) * enc.clean.shape[1] * d_model * 4
    return max(1, min(len(enc), memory // per_pair))


def batches(n: int, size: int) -> list[slice]:
    """Consecutive slices of ``size`` pairs (the last may be shorter)."""
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


@dataclass
class Writes:
    """The writes of one batch in the clean and the corrupted runs, [writers, batch, T, d_model], the
    runs' logit differences [batch], and the streams the inputs read in the corrupted run (``reads``:
    :attr:`~probe.circuits.feeds.Capture.reads`; ``final``: before the final norm, [batch, T, d_model])."""

    clean: torch.Tensor
    corrupted: torch.Tensor
    ld_clean: torch.Tensor
    ld_corrupted: torch.Tensor
    reads: dict | None = None
    final: torch.Tensor | None = None
    inputs: dict | None = None


@torch.no_grad()
def capture_writes(lm, wiring: Wiring, graph: Graph, enc: EncodedPairs, rows: slice) -> Writes:
    """Two passes (clean, corrupted prompts of ``rows``), recording every write (and, of the corrupted
    run, the streams the inputs read and the heads' q, k and v)."""
    out = []
    for ids, inputs in ((enc.clean[rows], False), (enc.corrupted[rows], True)):
        feed, where = Capture(graph, inputs), metric_positions(enc, rows)
        logits = split_pass(lm, wiring, ids, enc.mask[rows], feed, positions=where)
        out += [feed.outputs(), logit_diff(logits, enc, rows, where).double().cpu()]
    return Writes(out[0], out[2], out[1], out[3], feed.reads, feed.final, feed.inputs)


def input_gradients(lm, wiring: Wiring, graph: Graph, enc: EncodedPairs, rows: slice, writes: Writes,
                    alpha: float) -> dict:
    """The gradient of M (the mean over all ``len(enc)`` pairs) at every input, with block 0 reading
    corrupted + alpha (clean - corrupted) embeddings (alpha = 1: the clean run itself).

    Returns:
        (kind, layer) -> [n, batch, T, d_model] (``q``/``k``/``v``) or [batch, T, d_model].
    """
    x_clean, x_corr = writes.clean[0], writes.corrupted[0]
    embed = None if alpha == 1 else x_corr + alpha * (x_clean - x_corr)
    B, T, D = x_clean.shape
    feed = Gradients(graph, B, T, D, x_clean.dtype, x_clean.device)
    with torch.enable_grad():
        where = metric_positions(enc, rows)
        logits = split_pass(lm, wiring, enc.clean[rows], enc.mask[rows], feed, embed=embed, positions=where)
        metric = logit_diff(logits, enc, rows, where).sum() / len(enc)
        keys = list(feed.leaves)
        grads = torch.autograd.grad(metric, [feed.leaves[k] for k in keys], allow_unused=True)
    return {k: torch.zeros_like(feed.leaves[k]) if g is None else g for k, g in zip(keys, grads)}


#: Columns (of batch x T x d_model) per block of :func:`edge_products`: a block of every writer's
#: difference in float64 (301 writers on SmolLM2: 9.9 MB) stays in the cache while each layer's
#: gradients multiply it.
PRODUCT_BLOCK = 4096


def edge_products(graph: Graph, diff: torch.Tensor, grads: dict) -> np.ndarray:
    """[edges] (o_u^corr - o_u^clean) . gradient at the edge's input, in the graph's edge order.

    The sum over batch, positions and width runs in float64, block by block of
    :data:`PRODUCT_BLOCK` columns: each block of the writes is turned to float64 once and every
    layer's inputs (its q, k, v and MLP gradients, then the logits') take their products with the
    writers that reach them from it, so the writes are read from memory once (a product per layer
    over the whole width read them 30 times on SmolLM2: the step cost 2.4 forward passes).

    Args:
        diff: [writers, batch, T, d_model] corrupted minus clean writes.
        grads: :func:`input_gradients`' dictionary (or a mean of several).
    """
    flat = diff.reshape(diff.shape[0], -1)
    layers = []
    for layer in range(graph.layers):
        per_kind = [grads[(kind, layer)].reshape(grads[(kind, layer)].shape[0], -1) for kind in "qkv"]
        per_kind.append(grads[("mlp", layer)].reshape(1, -1))
        layers.append((torch.cat(per_kind), [g.shape[0] for g in per_kind[:3]]))
    last = grads[("logits", graph.layers)].reshape(1, -1)
    sums = [torch.zeros(graph.reads("mlp", layer), g.shape[0], dtype=torch.float64, device=flat.device)
            for layer, (g, _) in enumerate(layers)]
    total = torch.zeros(graph.n_upstream, dtype=torch.float64, device=flat.device)
    for start in range(0, flat.shape[1], PRODUCT_BLOCK):
        block = flat[:, start:start + PRODUCT_BLOCK].double()
        for layer, (g, _) in enumerate(layers):
            n, m = graph.reads("q", layer), graph.reads("mlp", layer)
            gb = g[:, start:start + PRODUCT_BLOCK].double()
            sums[layer][:n, :-1] += block[:n] @ gb[:-1].T  # the q, k, v inputs read the writers before the layer
            sums[layer][:m, -1] += block[:m] @ gb[-1]  # the MLP's also its heads (sequential blocks)
        total += block @ last[0, start:start + PRODUCT_BLOCK].double()
    parts = []
    for layer, (_, sizes) in enumerate(layers):
        n = graph.reads("q", layer)
        for piece in sums[layer][:n, :-1].split(sizes, dim=1):
            parts.append(piece.T.reshape(-1))  # head-major, as the graph orders the edges
        parts.append(sums[layer][:, -1])
    parts.append(total)
    return torch.cat(parts).cpu().numpy()


def node_scores(graph: Graph, edges: np.ndarray) -> np.ndarray:
    """[writers] each writer's score: the sum of its outgoing edges' scores."""
    up, _ = graph.edge_index
    return np.bincount(up, weights=edges, minlength=graph.n_upstream)


def edge_scores(lm, wiring: Wiring, graph: Graph, enc: EncodedPairs, *, method: str = "eap-ig", steps: int = 5,
                batch_size: int = 8, progress=None, points: str = "right", keep: list | None = None) -> np.ndarray:
    """Every edge's score by EAP or EAP-IG (module docstring), summed over batches of pairs.

    Args:
        lm, wiring, graph: the model, its :func:`~probe.circuits.wiring.wire` and its :class:`Graph`.
        enc: the encoded pairs.
        method: ``"eap-ig"`` (``steps`` points) or ``"eap"`` (one point, alpha = 1).
        steps: m, the integration points of EAP-IG.
        batch_size: pairs per pass.
        points: EAP-IG's convention, ``"right"`` (alpha = k/m, k = 1..m) or ``"left"`` (k = 0..m-1,
            hannamw/EAP-IG's); EAP is alpha = 1 either way.
        progress: called with the number of backward passes done after each, or None.
        keep: a list to which each batch's :class:`Writes` is appended (for the circuits' passes,
            :class:`~probe.circuits.evaluate.Evaluator`), or None.

    Returns:
        [edges] float64, in logits of the mean logit difference.

    Raises:
        ValueError: an unknown method or convention, or steps < 1.
    """
    if method not in METHODS or steps < 1:
        raise ValueError(f"method must be one of {METHODS} with steps >= 1, not {method!r}, {steps}")
    m = 1 if method == "eap" else steps
    points_at = [1.0] if method == "eap" else alphas(m, points)
    total, done = np.zeros(graph.n_edges), 0
    for rows in batches(len(enc), batch_size):
        writes = capture_writes(lm, wiring, graph, enc, rows)
        if keep is not None:
            keep.append(writes)
        mean: dict = {}
        for alpha in points_at:
            for key, g in input_gradients(lm, wiring, graph, enc, rows, writes, alpha).items():
                mean[key] = mean.get(key, 0) + g / m
            done += 1
            if progress is not None:
                progress(done)
        total += edge_products(graph, writes.corrupted - writes.clean, mean)
    return total
