"""``probe circuit`` as a function: edge scores (EAP or EAP-IG) of one decoder on prompt pairs, the
circuit of the top-scoring edges, its faithfulness curve against random circuits, the head labels of
a short analysis, and the analysis a run folder is written from (report section, edges.csv, nodes.csv,
circuit.csv, faithfulness.csv, heads.csv with ``circuit_score`` and ``in_circuit`` columns, run.json:
:func:`probe.entries.pairs.run_circuit` and its ``save``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..effects.pairs import LAST_POSITION, Pair, builtin_pairs, encode_pairs, metric_place
from ..effects.patch_run import label_texts
from ..effects.patching import MIN_GAP
from ..errors import InputError
from ..patterns import CircuitProbe, circuit_probe
from ..records import AnalysisResult
from ..runs.analysis import analyze, merge_head_columns
from ..settings import CircuitSettings
from ..sites import head_name
from ..util import progress_bar
from .attribution import batches, edge_scores, node_scores, pairs_per_batch
from .checked import graph_of
from .evaluate import SHARES, Evaluator, Faithfulness, curve_circuits, faithfulness_curve, random_edges, top_edges
from .forecast import Forecast
from .graph import Graph, edge_matrix, prune
from .greedy import Greedy, greedy_circuit
from .passplan import pass_key

#: The circuit's default size: this share of all edges.
DEFAULT_SHARE = 0.05
#: The labelling analysis per token, in forward passes of the same tokens (capture and statistics: 2.7-3.7
#: measured on SmolLM2, the 20 built-in pairs and the built-in sample, 2026-12-06).
LABEL_COST = 3.0


@dataclass
class CircuitRun:
    """What ``probe circuit`` measured.

    Attributes:
        graph: the model's :class:`~probe.circuits.graph.Graph`.
        scores: [edges] the edge scores (logits of the mean logit difference).
        method: ``"eap-ig"`` or ``"eap"``; steps: EAP-IG's m (1 for EAP); points: EAP-IG's integration
            points, ``"right"`` or ``"left"`` (:data:`~probe.circuits.attribution.POINTS`; None for EAP).
        circuit: [edges] boolean, the chosen circuit (top ``k`` edges by absolute score).
        faithfulness: the :class:`~probe.circuits.evaluate.Faithfulness` curve.
        ld_clean, ld_corrupted: the runs' mean logit differences.
        pairs, source: the pairs and where they came from; seconds: phase -> wall time; notes.
        passes: forward passes, by phase (``edges``, ``faithfulness``: the circuits evaluated, a pass a batch
            each as planned, with the clean and corrupted runs; ``circuits_run``: the circuit passes run, the
            others pruned to the clean or the corrupted run).
        seeds: random circuits per size.
        metric_at: where the metric reads the logits, in words (:func:`~probe.effects.pairs.metric_place`).
        greedy: the :class:`~probe.circuits.greedy.Greedy` pruning when the circuit was chosen by it
            (``circuit`` is then its circuit), else None.
    """

    graph: Graph
    scores: np.ndarray
    method: str
    steps: int
    circuit: np.ndarray
    faithfulness: Faithfulness
    ld_clean: float
    ld_corrupted: float
    pairs: list[Pair]
    source: str
    seconds: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    passes: dict = field(default_factory=dict)
    seeds: int = 5
    greedy: Greedy | None = None
    metric_at: str = LAST_POSITION
    points: str | None = "right"

    @property
    def circuit_faithfulness(self) -> float:
        """The chosen circuit's faithfulness (greedy's own pass, or the top-k row of the curve)."""
        if self.greedy is not None:
            return self.greedy.faithfulness
        f = self.faithfulness.frame
        return float(f[f["k"] == int(self.circuit.sum())].iloc[0]["faithfulness"])

    def edges_frame(self) -> pd.DataFrame:
        """One row per edge: ``upstream``, ``downstream`` (the node an input belongs to), ``input``
        (q, k, v, mlp, logits), ``score``, ``in_circuit``, ``on_path`` (in the circuit and on a path from
        the embeddings to the logits inside it, :func:`~probe.circuits.graph.prune`); graph order."""
        g, (up, down) = self.graph, self.graph.edge_index
        names = [g.downstream_name(*d) for d in g.downstream]
        return pd.DataFrame({"upstream": [g.upstream_names[u] for u in up], "downstream": [names[d] for d in down],
                             "input": [g.downstream[d][0] for d in down], "score": self.scores,
                             "in_circuit": self.circuit, "on_path": prune(g, self.circuit)})

    def nodes_frame(self) -> pd.DataFrame:
        """One row per writer: ``node``, ``kind`` (input, head, mlp), ``layer``, ``head`` (-1 but for
        heads), ``score`` (the sum of its outgoing edges' scores), ``circuit_edges`` (its outgoing
        edges in the circuit)."""
        g, (up, _) = self.graph, self.graph.edge_index
        rows = [("input", -1, -1)] + [r for layer in range(g.layers)
                                      for r in [("head", layer, h) for h in range(g.heads)] + [("mlp", layer, -1)]]
        frame = pd.DataFrame(rows, columns=["kind", "layer", "head"])
        frame.insert(0, "node", g.upstream_names)
        frame["score"] = node_scores(g, self.scores)
        frame["circuit_edges"] = np.bincount(up[self.circuit], minlength=g.n_upstream)
        return frame

    def heads_frame(self) -> pd.DataFrame:
        """``layer``, ``head``, ``circuit_score``, ``in_circuit`` (the head has an edge in the circuit,
        in or out): columns for heads.csv."""
        nodes = self.nodes_frame()
        heads = nodes[nodes["kind"] == "head"][["layer", "head", "score"]].rename(columns={"score": "circuit_score"})
        heads["in_circuit"] = [name in self.circuit_nodes() for name in nodes.loc[heads.index, "node"]]
        return heads.reset_index(drop=True)

    def circuit_nodes(self) -> set[str]:
        """The writers and heads with an edge in the circuit (a grouped key/value input counts for the
        query heads it serves)."""
        g, (up, down) = self.graph, self.graph.edge_index
        out = {g.upstream_names[u] for u in up[self.circuit]}
        rep = g.heads // g.kv_heads
        for d in set(down[self.circuit]):
            kind, layer, index = g.downstream[d]
            heads = [index] if kind == "q" else range(index * rep, (index + 1) * rep) if kind in ("k", "v") else []
            out |= {head_name(layer, h) for h in heads} | ({f"MLP{layer}"} if kind == "mlp" else set())
        return out


def _label_passes(lm, pairs: list[Pair], enc, batch_size: int) -> float:
    """The labelling analysis in forward passes of a batch of pairs (for the estimate): its texts' tokens
    over a batch's, times :data:`LABEL_COST`."""
    texts = label_texts(lm, pairs)
    tokens = sum(len(lm.tokenizer(str(t))["input_ids"]) for t in texts)
    return LABEL_COST * tokens / max(1, batch_size * enc.clean.shape[1])


def circuit_sizes(n_edges: int, k: int, shares=SHARES) -> list[int]:
    """The faithfulness curve's sizes: ``shares`` of ``n_edges`` (at least 1 edge) and ``k``."""
    return sorted({max(1, round(s * n_edges)) for s in shares} | {k})


def measure(lm, pairs: list[Pair] | None = None, settings: CircuitSettings | None = None, *,
            source: str = "built-in IOI set", progress: bool = False, say=None, plan=None, estimate=None,
            **options) -> CircuitRun:
    """Edge scores, the circuit and the faithfulness curve of ``lm`` on ``pairs`` (default the built-in
    set), as ``settings`` say (:class:`~probe.settings.CircuitSettings`: ``method``, ``steps``, ``points``,
    ``edges``, ``select``, ``threshold``, ``max_passes``, ``seeds``, ``shares``, ``batch_size``; or those
    fields as keyword ``options``, checked the same way; its ``pairs`` field is not read here).
    ``say``: a callable given one line per stage, or None; ``plan``: called once the graph is
    checked, before any score, as ``plan(graph, sizes, batches)`` (sizes: the faithfulness curve's sizes of
    the top-k circuit; batches: of pairs), or None; ``shares``: the curve's sizes as
    shares of all edges (default :data:`~probe.circuits.evaluate.SHARES`). ``select``: ``top-k`` (the
    ``edges`` of largest |score|) or ``greedy`` (:func:`~probe.circuits.greedy.greedy_circuit` keeping
    faithfulness >= ``threshold`` within ``max_passes`` circuit passes; the curve then includes its
    size, so the top-k circuit of the same size stands beside it). ``points``: EAP-IG's integration
    points (:func:`~probe.circuits.attribution.alphas`: ``right``, the default, or ``left``, hannamw/EAP-IG's).
    ``estimate``: a callable given one line after the first gradient pass, the run's cost from that
    pass's time, and an updated line after each stage from the time measured so far
    (:class:`~probe.circuits.forecast.Forecast`), or None. ``batch_size``: pairs per pass, None: as
    many as :func:`~probe.circuits.attribution.pairs_per_batch` allows (the 20 built-in pairs in one).

    Raises:
        UnsupportedAnalysisError: a model outside the graph (:func:`~probe.circuits.checked.graph_of`).
        InputError: pairs that do not encode (:func:`~probe.effects.pairs.encode_pairs`); ``edges``
            larger than the graph.
    """
    s = CircuitSettings.from_mapping(options) if settings is None else settings
    method, steps, points, edges, select = s.method, s.steps, s.points, s.edges, s.select
    threshold, max_passes, seeds, shares, batch_size = s.threshold, s.max_passes, s.seeds, s.shares, s.batch_size
    pairs = builtin_pairs() if pairs is None else pairs
    enc = encode_pairs(lm, pairs)
    with graph_of(lm) as (wiring, graph, _):
        k = edges if edges is not None else max(1, round(DEFAULT_SHARE * graph.n_edges))
        if not 1 <= k <= graph.n_edges:
            raise InputError(f"--edges {k}: {lm.name}'s graph has {graph.n_edges} edges")
        m = 1 if method == "eap" else steps
        batch_size = batch_size or pairs_per_batch(graph, enc, lm.geometry.d_model)
        n_batches, seconds = len(batches(len(enc), batch_size)), {}
        sizes_planned = circuit_sizes(graph.n_edges, k, shares or SHARES)
        if plan:
            plan(graph, len(sizes_planned), n_batches)
        coupled = [layer.attn_post is not None for layer in wiring.layers]
        # the random circuits do not depend on the scores: which of them need a pass is known now (one pass
        # for each distinct pruned form: the evaluator remembers the others)
        random_keys = {pass_key(graph, edge_matrix(graph, random_edges(graph.n_edges, size, s)), coupled)
                       for size in sizes_planned for s in range(seeds)} - {None} if estimate is not None else set()
        forecast = Forecast(n_batches, m, len(sizes_planned) + len(random_keys),
                            (max_passes or 0) if select == "greedy" else 0,
                            _label_passes(lm, pairs, enc, batch_size) if estimate is not None else 0.0)
        t = time.perf_counter()

        def first(done, bar=None) -> None:  # after the first backward pass: the whole run's cost from its time
            if done == 1 and estimate is not None:
                estimate(forecast.first_pass())
            if bar is not None:
                bar(done)

        kept: list = []
        with _bar(progress, n_batches * m, f"{method} gradients", "backward") as bar:
            scores = edge_scores(lm, wiring, graph, enc, method=method, steps=steps, batch_size=batch_size,
                                 progress=lambda done, bar=bar: first(done, bar), points=points, keep=kept)
        seconds["edges_s"] = time.perf_counter() - t
        if say:
            say(f"edge scores ({method}, {graph.n_edges} edges): done in {seconds['edges_s']:.1f} s")
        evaluator = Evaluator(lm, wiring, graph, enc, batch_size, writes=kept)
        if estimate is not None:
            forecast.runs = len(random_keys | evaluator.pending(top_edges(scores, size) for size in sizes_planned))
            estimate(forecast.after_scores(seconds["edges_s"]))
        t = time.perf_counter()
        greedy = None
        if select == "greedy":
            with _bar(progress, max_passes, "greedy pruning", "circuit") as bar:
                rounds = None if not say else lambda *r, t=t: say(_round_line(*r, evaluator, t))
                greedy = greedy_circuit(evaluator, scores, threshold, max_passes, progress=bar, on_round=rounds)
            k = int(greedy.circuit.sum())
            if say:
                say(f"greedy pruning ({greedy.passes} circuits, {greedy.rounds} rounds): {k} edges kept, faithfulness "
                    f"{greedy.faithfulness:.3f}{'' if greedy.converged else ' (pass budget spent before convergence)'}")
        sizes = circuit_sizes(graph.n_edges, k, shares or SHARES)
        if select == "greedy" and estimate is not None:
            curve_runs = len(evaluator.pending(c for _, _, c in curve_circuits(scores, sizes, seeds)))
            estimate(forecast.after_greedy(time.perf_counter() - t, evaluator.runs, curve_runs,
                                           evaluator.layers_run / graph.layers))
        runs_before, layers_before, t_curve = evaluator.runs, evaluator.layers_run, time.perf_counter()
        with _bar(progress, 2 + len(sizes) * (1 + seeds), "circuit passes", "circuit") as bar:
            curve = faithfulness_curve(evaluator, scores, sizes, seeds, progress=bar)
        seconds["faithfulness_s"] = time.perf_counter() - t
        if say:
            say(f"faithfulness ({evaluator.passes} circuits, {evaluator.runs} of them run): done in "
                f"{seconds['faithfulness_s']:.1f} s")
        if estimate is not None:
            estimate(forecast.after_faithfulness(time.perf_counter() - t_curve, evaluator.runs - runs_before,
                                                 (evaluator.layers_run - layers_before) / graph.layers))
        passes = {"edges": n_batches * (2 + 2 * m), "faithfulness": n_batches * (2 + evaluator.passes),
                  "circuits_run": n_batches * evaluator.runs}
        circuit = greedy.circuit if greedy is not None else top_edges(scores, k)
        gap = evaluator.ld_clean - evaluator.ld_corrupted
        notes = [] if abs(gap) >= MIN_GAP else [
            f"|LD_clean - LD_corrupted| = {abs(gap):.3g} < {MIN_GAP}: the pairs barely separate the answers, so every "
            "faithfulness divides by a difference of that size and is dominated by noise"]
        return CircuitRun(graph, scores, method, m, circuit, curve, evaluator.ld_clean,
                          evaluator.ld_corrupted, pairs, source, seconds, notes, passes, seeds, greedy,
                          metric_place(lm.kind), None if method == "eap" else points)


class _bar:
    """A progress bar as a context manager whose instance is the progress callback (or None)."""

    def __init__(self, show: bool, total: int, desc: str, unit: str) -> None:
        self.bar = progress_bar(total=total, desc=desc, unit=unit, leave=False) if show else None

    def __enter__(self):
        return None if self.bar is None else (lambda done: self.bar.update(done - self.bar.n))

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def _round_line(rounds: int, passes: int, edges: int, faithfulness: float, evaluator: Evaluator, start: float) -> str:
    """The line said after each round of greedy pruning (a round that removes nothing ends it)."""
    return (f"greedy pruning, round {rounds}: {passes} circuits so far ({evaluator.runs} run), {edges} edges kept, "
            f"faithfulness {faithfulness:.3f}, {time.perf_counter() - start:.0f} s")


def circuit_analysis(lm, pairs: list[Pair] | None = None, *, say=None, progress: bool = False,
                     **kw) -> tuple[CircuitRun, AnalysisResult]:
    """Measure (:func:`measure`, ``kw`` its options) and label the heads with a short analysis:
    ``(CircuitRun, the analysis the run folder is written from)``, no folder written.

    Raises:
        UnsupportedAnalysisError, InputError: as :func:`measure`.
    """
    result = measure(lm, pairs, progress=progress, say=say, **kw)
    t = time.perf_counter()
    analysis = analyze(lm, label_texts(lm, result.pairs), progress=progress,
                       finished=[circuit_probe(lm)] if CircuitProbe.refusal(lm) is None else [])
    result.seconds["analyze_s"] = time.perf_counter() - t
    if say:
        say(f"labelling analysis: done in {result.seconds['analyze_s']:.1f} s")
    analysis.heads = merge_head_columns(analysis.heads, result.heads_frame())
    analysis.results["circuit"] = result
    analysis.timings.update({k: round(v, 4) for k, v in result.seconds.items()})
    return result, analysis
