"""A circuit's pass as planned (probe.circuits.passplan: pruned to its paths, each input built from the
cheaper of its own stream minus the excluded edges' differences and the corrupted stream plus the
included edges') equals the pass as defined, written out here input by input: the pass's own stream
minus the dense sum over every excluded edge of (write - corrupted write). On tiny GPT-2, LLaMA
(grouped key/value heads) and Gemma 2 (norms after each sub-layer), GPT-NeoX (parallel blocks), for
many circuits including the complete and the empty graph; and the vectorised pruning equals the
edge-by-edge sweep."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_edge_circuits import random_pairs

from conftest import tiny_model
from probe.circuits.attribution import logit_diff, metric_positions
from probe.circuits.checked import graph_of
from probe.circuits.evaluate import Evaluator, excluded_matrix, random_edges, top_edges
from probe.circuits.feeds import Patch
from probe.circuits.forward import Feed, Heads, split_pass
from probe.circuits.graph import Graph, _reader_nodes, edge_matrix, paths, prune
from probe.circuits.passplan import first_change, plan_pass


class DensePatch(Feed):
    """The definition, input by input: the pass's own stream minus sum over the edges into the input
    outside the circuit of (the writer's write in this pass - its write in the corrupted run), every
    writer read, in float64."""

    def __init__(self, graph: Graph, corrupted: torch.Tensor, excluded: torch.Tensor) -> None:
        self.graph, self.corrupted, self.excluded = graph, corrupted.double(), excluded
        self.now = torch.zeros_like(self.corrupted)

    def wrote(self, kind, layer, out):
        g = self.graph
        if kind == "input":
            self.now[0] = out.double()
        elif kind == "mlp":
            self.now[g.mlp_node(layer)] = out.double()
        elif kind == "heads":
            u = g.head_node(layer, 0)
            self.now[u:u + g.heads] = out.double()

    def delta(self, kind, layer):
        rows = [d for d, (k, l_, _) in enumerate(self.graph.downstream) if (k, l_) == (kind, layer)]
        if not self.excluded[rows].any():
            return None
        # no edge reads a writer not yet written (its weight is 0)
        out = -torch.einsum("ru,ubtd->rbtd", self.excluded[rows].double(), self.now - self.corrupted)
        return out if kind in ("q", "k", "v") else out[0]


def dense_metric(ev: Evaluator, included: np.ndarray) -> float:
    """M of the circuit by :class:`DensePatch`, batch by batch as the evaluator batches."""
    excluded = excluded_matrix(ev.graph, included)
    values = []
    for rows, writes in zip(ev.rows, ev.writes):
        where = metric_positions(ev.enc, rows)
        logits = split_pass(ev.lm, ev.wiring, ev.enc.clean[rows], ev.enc.mask[rows],
                            DensePatch(ev.graph, writes.corrupted, excluded), positions=where)
        values.append(logit_diff(logits, ev.enc, rows, where).double())
    return float(torch.cat(values).mean())


def circuits(graph: Graph, scores: np.ndarray) -> list[np.ndarray]:
    """The complete and the empty graph, top-k and random circuits from 1 edge to all but one, and the
    complete graph less one edge."""
    n = graph.n_edges
    out = [np.ones(n, dtype=bool), np.zeros(n, dtype=bool)]
    for k in (1, 3, n // 50, n // 10, n // 3, n // 2, (9 * n) // 10, n - 1):
        out += [top_edges(scores, k), random_edges(n, k, k)]
    return out


@pytest.fixture(scope="module", params=["gpt2", "llama", "gemma2", "gpt_neox"])
def evaluated(request):
    lm = tiny_model(request.param)
    with graph_of(lm) as (wiring, graph, _):
        yield Evaluator(lm, wiring, graph, random_pairs(11, n=5), batch_size=3)


def test_the_planned_pass_equals_the_dense_sum_over_excluded_edges(evaluated):
    ev = evaluated
    scores = np.random.default_rng(0).normal(size=ev.graph.n_edges)
    full, empty = dense_metric(ev, np.ones(ev.graph.n_edges, dtype=bool)), None
    runs = set()
    for included in circuits(ev.graph, scores):
        got, want = ev.metric(included), dense_metric(ev, included)
        assert got == pytest.approx(want, abs=1e-5), int(included.sum())
        runs.add(ev.plan(included).run)
        if not included.any():
            empty = want
    assert runs == {"clean", "corrupted", "pass"}
    assert ev.metric(np.ones(ev.graph.n_edges, dtype=bool)) == ev.ld_clean  # the clean run itself, bit for bit
    assert ev.metric(np.zeros(ev.graph.n_edges, dtype=bool)) == ev.ld_corrupted
    assert full == pytest.approx(ev.ld_clean, abs=1e-5) and empty == pytest.approx(ev.ld_corrupted, abs=1e-5)


def test_a_pass_reads_only_the_writes_on_its_circuits_paths(evaluated):
    # a circuit of one path: input -> a last-layer head's value -> logits; the pass needs the differences of
    # the embeddings and that head only, and its M is the dense pass's
    ev = evaluated
    g = ev.graph
    up, down = g.edge_index
    last = g.layers - 1
    v_row = next(d for d, (k, l_, i) in enumerate(g.downstream) if (k, l_, i) == ("v", last, 0))
    head = g.head_node(last, 0)
    circuit = ((up == 0) & (down == v_row)) | ((up == head) & (down == len(g.downstream) - 1))
    plan = ev.plan(circuit)
    group = range(head, head + g.heads // g.kv_heads)  # the heads that read the value input
    if ev.wiring.layers[last].attn_post is not None:  # Gemma 2: each head's write scaled by the norm of their sum
        group = range(head, head + g.heads)
    assert plan.run == "pass" and set(np.flatnonzero(plan.writers)) == {0} | set(group)
    assert ev.metric(circuit) == pytest.approx(dense_metric(ev, circuit), abs=1e-5)


@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("share", [0.0, 0.03, 0.3, 0.7, 1.0])
def test_the_planned_streams_equal_the_definition_on_every_input_on_a_path(parallel, share, given):
    """Random writes: the writers off the pruned circuit's paths write what they wrote in the corrupted
    run (as in a pass); every input on a path then reads, by the plan, the own stream minus the excluded
    edges' differences, whichever sum the plan chose (inputs off the paths change nothing M reads).
    With the corrupted run's head inputs ``given`` (as the evaluator's passes have them), a head's input
    comes as :class:`Heads`: a head with terms gets its stream (the one above), a head that reads the
    corrupted stream alone gets the corrupted run's input as it was, any other keeps its own."""
    graph = Graph(layers=3, heads=4, kv_heads=2, parallel=parallel)
    g = torch.Generator().manual_seed(7)
    B, T, D = 2, 5, 6
    corrupted = torch.randn(graph.n_upstream, B, T, D, generator=g, dtype=torch.float64)
    included = np.random.default_rng(3).random(graph.n_edges) < share
    plan = plan_pass(graph, edge_matrix(graph, included), torch.float64)
    if plan.run != "pass":
        return
    writes = torch.where(torch.as_tensor(plan.writers)[:, None, None, None],
                         torch.randn(graph.n_upstream, B, T, D, generator=g, dtype=torch.float64), corrupted)
    bias = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    kept = paths(graph, edge_matrix(graph, included))
    readers = _reader_nodes(graph)
    on_path = [d for d in range(len(graph.downstream)) if kept[d].any() or any(
        kept[:, r].any() for r in readers[d])]

    def stream(w, n):
        return bias + w[:n].sum(0)

    reads = {}
    for layer in range(graph.layers):
        reads[("stream", layer)] = stream(corrupted, graph.reads("q", layer))
        reads[("mlp_in", layer)] = stream(corrupted, graph.reads("mlp", layer))
    inputs = None
    if given:  # what the corrupted run's attention received at each head input: [batch, n, T, d_head]
        inputs = {(kind, layer): torch.randn(B, graph.heads if kind == "q" else graph.kv_heads, T, 3, generator=g,
                                             dtype=torch.float64)
                  for kind in ("q", "k", "v") for layer in range(graph.layers)}
    feed = Patch(graph, plan, corrupted, reads, stream(corrupted, graph.n_upstream), inputs=inputs)
    excluded = excluded_matrix(graph, included).double()

    def check(kind, layer, got):
        rows = [d for d, (k, l_, _) in enumerate(graph.downstream) if (k, l_) == (kind, layer)]
        n = graph.reads(kind, None if kind == "logits" else layer)
        own = stream(writes, n)
        want = own[None] - torch.einsum("ru,ubtd->rbtd", excluded[rows, :n], writes[:n] - corrupted[:n])
        if isinstance(got, Heads):
            group = plan.groups[(kind, layer)]
            assert got.recompute == [i for i in range(len(rows)) if group.terms[i]]
            assert got.fixed == [i for i in range(len(rows)) if group.corrupted[i] and not group.terms[i]]
            if got.fixed:
                assert torch.equal(got.given, inputs[(kind, layer)][:, got.fixed])
            for i, d in enumerate(rows):  # a head without terms reads the corrupted or its own stream unchanged
                if d in on_path and not group.terms[i]:
                    start = reads[("stream", layer)] if group.corrupted[i] else own
                    torch.testing.assert_close(start, want[i], rtol=1e-10, atol=1e-10)
            full = own[None].expand_as(want).clone()
            full[got.fixed] = reads[("stream", layer)]  # they read the corrupted stream: its input is given
            if got.recompute:
                full[got.recompute] = got.streams
            got = full
        got = own[None].expand_as(want) if got is None else (got if kind in ("q", "k", "v") else got[None])
        for i, d in enumerate(rows):
            if d in on_path:
                torch.testing.assert_close(got[i], want[i], rtol=1e-10, atol=1e-10)

    feed.wrote("input", 0, writes[0])
    for layer in range(graph.layers):
        first = graph.head_node(layer, 0)
        for kind in ("q", "k", "v"):
            check(kind, layer, feed.fed(kind, layer, stream(writes, graph.reads("q", layer))))
        if parallel:
            check("mlp", layer, feed.fed("mlp", layer, stream(writes, graph.reads("mlp", layer))))
        feed.wrote("heads", layer, writes[first:first + graph.heads])
        if not parallel:
            check("mlp", layer, feed.fed("mlp", layer, stream(writes, graph.reads("mlp", layer))))
        feed.wrote("mlp", layer, writes[graph.mlp_node(layer)])
    check("logits", graph.layers, feed.fed("logits", graph.layers, stream(writes, graph.n_upstream)))


def _prune_edge_by_edge(graph: Graph, included: np.ndarray) -> np.ndarray:
    """Pruning as first written: one sweep forward over the edges for what the embeddings reach, one
    backward for what reaches the logits."""
    up, down = graph.edge_index
    inc = np.asarray(included, dtype=bool)
    readers = _reader_nodes(graph)
    reached = np.zeros(graph.n_upstream, dtype=bool)
    reached[0] = True
    for e in np.flatnonzero(inc):
        if reached[up[e]]:
            reached[readers[down[e]]] = True
    useful = np.zeros(graph.n_upstream, dtype=bool)
    for e in np.flatnonzero(inc)[::-1]:
        d = down[e]
        if not readers[d] or useful[readers[d]].any():
            useful[up[e]] = True
    keep = inc & reached[up]
    return keep & np.array([not readers[d] or bool(useful[readers[d]].any()) for d in down])


@pytest.mark.parametrize("graph", [Graph(2, 2, 1), Graph(3, 4, 2, True), Graph(4, 4, 4), Graph(6, 9, 3)])
def test_vectorised_pruning_equals_the_edge_by_edge_sweep(graph):
    for share in (0.0, 0.01, 0.05, 0.2, 0.5, 0.9, 1.0):
        for seed in range(3):
            included = np.random.default_rng(seed).random(graph.n_edges) < share
            assert np.array_equal(prune(graph, included), _prune_edge_by_edge(graph, included)), (share, seed)


def test_the_default_batch_holds_the_pairs_the_memory_allows():
    from probe.circuits.attribution import pairs_per_batch

    graph, enc = Graph(30, 9, 3), random_pairs(0, n=20, T=16)
    per_pair = (2 * graph.n_upstream + 5 * len(graph.downstream)) * 16 * 576 * 4  # SmolLM2's shape: 111 MB
    assert per_pair == 110_850_048
    assert pairs_per_batch(graph, enc, 576) == 20  # the 20 built-in pairs in one batch (2.2 GB)
    assert pairs_per_batch(graph, random_pairs(0, n=40, T=16), 576) == 29  # 3 GiB
    assert pairs_per_batch(graph, enc, 576, memory=5 * per_pair + 1) == 5
    assert pairs_per_batch(graph, enc, 576, memory=1) == 1


def fresh(ev: Evaluator) -> Evaluator:
    """An evaluator of the same model and writes that has run nothing (remembers no circuit)."""
    return Evaluator(ev.lm, ev.wiring, ev.graph, ev.enc, batch_size=3, writes=ev.writes)


def test_circuits_that_prune_to_nothing_or_to_the_clean_run_need_no_pass(evaluated):
    ev = fresh(evaluated)
    n = ev.graph.n_edges
    up, down = ev.graph.edge_index
    runs = ev.runs
    only_logits = down == len(ev.graph.downstream) - 1
    dangling = ~only_logits & (up == 0)  # the embeddings into every head and MLP, nothing on to the logits
    assert not ev.needs_pass(dangling) and ev.plan(dangling).run == "corrupted"
    assert ev.metric(dangling) == ev.ld_corrupted and ev.runs == runs
    assert not ev.needs_pass(np.ones(n, dtype=bool)) and ev.metric(np.ones(n, dtype=bool)) == ev.ld_clean
    assert ev.needs_pass(only_logits) and ev.runs == runs
    ev.metric(only_logits)
    assert ev.runs == runs + 1


def test_a_circuit_whose_pruned_form_ran_before_is_not_run_again(evaluated):
    """Greedy pruning tries circuits that differ only in edges off their paths: such a circuit has the
    pruned form, the plan and the pass of one run before, so its M is remembered, not run again; and a
    fresh evaluator that runs it gets the same value, bit for bit."""
    ev = fresh(evaluated)
    g = ev.graph
    up, down = g.edge_index
    only_logits = down == len(g.downstream) - 1
    first_q = next(d for d, (kind, layer, _) in enumerate(g.downstream) if kind == "q" and layer == 1)
    off = (up == g.head_node(0, 0)) & (down == first_q)  # L0H0 into a head of layer 1: L0H0 reads nothing
    assert off.sum() == 1
    with_off = only_logits | off
    assert ev.plan(with_off).key == ev.plan(only_logits).key != b""
    other = only_logits | ((up == 0) & (down == first_q))  # the embeddings into that head: on a path
    nothing, everything = np.zeros(g.n_edges, dtype=bool), np.ones(g.n_edges, dtype=bool)
    # the passes a list of circuits will cost (the forecast's count): one per distinct pruned form
    assert ev.pending([only_logits, with_off, nothing, everything, other, with_off]) == {
        ev.plan(only_logits).key, ev.plan(other).key}
    value = ev.metric(only_logits)
    assert ev.pending([only_logits, with_off, other]) == {ev.plan(other).key}
    runs, remembered = ev.runs, ev.remembered
    assert not ev.needs_pass(with_off)
    assert ev.metric(with_off) == value and (ev.runs, ev.remembered) == (runs, remembered + 1)
    other_ev = fresh(ev)
    assert other_ev.needs_pass(with_off) and other_ev.metric(with_off) == value and other_ev.runs == 1
    assert ev.needs_pass(other) and ev.plan(other).key != ev.plan(only_logits).key
    ev.forget()  # to time a pass again: the next one runs
    assert ev.needs_pass(with_off) and ev.metric(with_off) == value and ev.runs == runs + 1


def test_a_sparse_product_is_built_without_torchs_beta_warning():
    """A newcomer's ``probe circuit`` printed torch's 'Sparse CSR tensor support is in beta' warning in the
    middle of its progress lines: the product is built without it, and equals the dense product."""
    import warnings

    from probe.circuits.passplan import SPARSE_BELOW, _product
    w = np.zeros((6, 40), dtype=np.int8)
    w[0, 3] = w[5, 17] = 1
    w[2, 30] = -1
    assert np.count_nonzero(w) < SPARSE_BELOW * 40  # sparse enough to be stored as CSR
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        product = _product(w, 0, 40, torch.float64, torch.device("cpu"))
    assert [str(c.message) for c in caught] == []
    assert product.weights.layout == torch.sparse_csr
    x = torch.randn(40, 3, dtype=torch.float64)
    assert torch.equal(product.weights @ x, torch.as_tensor(w, dtype=torch.float64) @ x)



def test_the_compiled_sums_equal_the_product_of_the_signed_weights():
    """The compiled sums over writers (probe.circuits.rowsums), block by block of the width, equal the
    dense product of the signed weights in float64 (to float32's rounding); a row without a term is 0."""
    pytest.importorskip("numba")
    from probe.circuits import rowsums

    rng = np.random.default_rng(11)
    w = (rng.random((16, 40)) < 0.3) * rng.choice([-1, 1], size=(16, 40))
    w[4] = 0
    diff = torch.as_tensor(rng.standard_normal((40, 3 * rowsums.BLOCK + 123)), dtype=torch.float32)
    got = rowsums.weighted_rows(rowsums.csr(w), diff)
    assert got is not None
    want = torch.as_tensor(w, dtype=torch.float64) @ diff.double()
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
    assert torch.count_nonzero(got[4]) == 0


def _greedy_like(graph: Graph, seed: int, steps: int = 10) -> list[np.ndarray]:
    """Circuits as greedy pruning tries them: from the complete graph, each the kept circuit less a
    few random edges, every other one kept."""
    rng = np.random.default_rng(seed)
    kept, out = np.ones(graph.n_edges, dtype=bool), []
    for i in range(steps):
        trial = kept.copy()
        trial[rng.choice(graph.n_edges, 2, replace=False)] = False
        out.append(trial)
        if i % 2 == 0:
            kept = trial
    return out


def whole(ev: Evaluator) -> Evaluator:
    """A fresh evaluator that never re-enters a pass."""
    out = fresh(ev)
    out.reentry_refused = "whole passes (the test's reference)"
    return out


@pytest.fixture(scope="module", params=["gpt2", "llama", "gemma2", "gpt_neox", "falcon", "gemma3"])
def deep(request):
    """An evaluator of a 4-layer model (re-entry from layers 1 to 4)."""
    lm = tiny_model(request.param, layers=4)
    with graph_of(lm) as (wiring, graph, _):
        yield Evaluator(lm, wiring, graph, random_pairs(11, n=5), batch_size=3)


def _top_only(graph: Graph) -> list[np.ndarray]:
    """Circuits that differ in the logits' input only, then in the top layer's MLP: re-entered at
    ``graph.layers`` (every block answered), then at the top layer."""
    up, down = graph.edge_index
    logits = len(graph.downstream) - 1
    top = graph.layers - 1
    top_mlp = next(d for d, (kind, layer, _) in enumerate(graph.downstream) if kind == "mlp" and layer == top)
    a = np.ones(graph.n_edges, dtype=bool)
    a[(down == logits) & (up == 1)] = False
    b = a.copy()
    b[(down == logits) & (up == 2)] = False
    c = b.copy()
    c[(down == top_mlp) & (up == 3)] = False
    return [a, b, c]


def test_a_pass_re_entered_at_its_first_changed_layer_equals_the_whole_pass(deep):
    """Each circuit's pass re-enters the model at the lowest layer where its plan differs from the pass
    before; its M equals a whole pass's bit for bit, circuit after circuit, and the passes computed fewer
    layers than whole ones. A check that computed no block (re-entered at the top) does not count."""
    ev = fresh(deep)
    top = _top_only(ev.graph)
    assert ev.metric(top[0]) == whole(ev).metric(top[0]) and ev.layers_run == ev.graph.layers
    assert ev.metric(top[1]) == whole(ev).metric(top[1])  # every block answered: checked, but proves nothing
    assert not ev._checked and ev.layers_run == 2 * ev.graph.layers
    sequence = top[2:] + _greedy_like(ev.graph, 3, steps=16)
    sequence += circuits(ev.graph, np.random.default_rng(4).normal(size=ev.graph.n_edges))
    got = [ev.metric(c) for c in sequence]
    assert got == [whole(ev).metric(c) for c in sequence]
    assert ev.reentry_refused is None and ev._checked
    assert ev.layers_run < ev.runs * ev.graph.layers
    ev.forget()  # to time a pass: the next one runs whole
    layers = ev.layers_run
    ev.metric(sequence[-1])
    assert ev.layers_run == layers + ev.graph.layers


def test_first_change_is_the_lowest_layer_of_a_changed_input_or_an_unrecorded_writer():
    graph = Graph(4, 3, 3)
    up, down = graph.edge_index
    layer_of = np.array([layer for _, layer, _ in graph.downstream])
    everything = np.ones(graph.n_edges, dtype=bool)
    base = plan_pass(graph, edge_matrix(graph, everything & ~((down == len(graph.downstream) - 1) & (up == 0))))
    for d in range(len(graph.downstream)):  # one edge fewer into each input in turn: that input's layer
        into = np.flatnonzero((down == d) & (up != 0))
        if not len(into):
            continue
        plan = plan_pass(graph, edge_matrix(graph, everything & (np.arange(graph.n_edges) != into[0])))
        if plan.run != "pass":
            continue
        assert first_change(graph, base, plan) == layer_of[d]
        assert first_change(graph, plan, plan) == graph.layers  # nothing differs
    # a writer the plan needs whose difference the pass before did not record: from the writer's layer on
    unrecorded = dataclasses.replace(base, writers=base.writers.copy())
    unrecorded.writers[graph.head_node(2, 1)] = False
    assert first_change(graph, unrecorded, base) == 2 and first_change(graph, base, unrecorded) == graph.layers


def test_a_re_entered_pass_that_differs_from_the_whole_one_turns_re_entry_off(evaluated, monkeypatch):
    """The check: where the first re-entered pass does not give the whole pass's logits (here: re-entered
    one layer too high, so a changed layer answers the pass before's output), the evaluator keeps the whole
    pass's value and runs whole passes from then on."""
    import probe.circuits.evaluate as evaluate

    ev = fresh(evaluated)
    sequence = _greedy_like(ev.graph, 5)
    monkeypatch.setattr(evaluate, "first_change", lambda graph, before, plan: graph.layers)
    got = [ev.metric(c) for c in sequence]
    assert got == [whole(ev).metric(c) for c in sequence]
    assert ev.reentry_refused == "a pass re-entered at a layer did not give the whole pass's logits"
    assert ev.layers_run == ev.runs * ev.graph.layers  # the pass that failed its check computed no block


def test_greedy_pruning_with_re_entered_passes_keeps_the_same_circuit(evaluated):
    from probe.circuits.greedy import greedy_circuit

    ev = fresh(evaluated)
    scores = np.random.default_rng(6).normal(size=ev.graph.n_edges)
    a, b = greedy_circuit(ev, scores, threshold=0.5), greedy_circuit(whole(ev), scores, threshold=0.5)
    assert np.array_equal(a.circuit, b.circuit) and a.faithfulness == b.faithfulness and a.passes == b.passes
    assert ev.reentry_refused is None and ev.layers_run < ev.runs * ev.graph.layers


def test_a_block_that_overwrites_its_input_does_not_change_the_recorded_pass():
    """A re-entered pass hands the recorded output of the block below its first changed layer to a block
    that computes; a block that overwrites its input in place (after reading it) must not change the record
    that later passes re-enter from."""
    lm = tiny_model("llama")
    with graph_of(lm) as (wiring, graph, _):
        block = wiring.layers[1].block
        own = block.forward

        def overwriting(hidden_states, *args, **kwargs):
            out = own(hidden_states.clone(), *args, **kwargs)
            hidden_states.zero_()
            return out

        block.forward = overwriting
        try:
            ev = Evaluator(lm, wiring, graph, random_pairs(11, n=5), batch_size=3)
            sequence = _greedy_like(graph, 7, steps=14)
            got = [ev.metric(c) for c in sequence]
            assert got == [whole(ev).metric(c) for c in sequence]
            assert ev.reentry_refused is None and ev.layers_run < ev.runs * graph.layers
        finally:
            del block.forward


def _side_state(wiring, missing: str):
    """Block 1 of a 2-layer model reads state that block 0 leaves in a per-forward dict (as Gemma 3n's
    shared key/value states): re-entered above block 0 the state is missing (``"zeros"``: block 1 reads
    zeros; ``"raise"``: KeyError). Returns the two blocks (their ``forward`` replaced)."""
    side: dict = {}
    b0, b1 = wiring.layers[0].block, wiring.layers[1].block
    own0, own1 = b0.forward, b1.forward

    def hidden(out):
        return out[0] if isinstance(out, tuple) else out

    def first(*args, **kwargs):
        side.clear()
        out = own0(*args, **kwargs)
        side["h"] = hidden(out).detach().clone()
        return out

    def second(*args, **kwargs):
        out = own1(*args, **kwargs)
        h = hidden(out)
        extra = side["h"] if missing == "raise" else side.get("h", torch.zeros_like(h))
        h = h + 0.5 * extra
        side.clear()
        return (h, *out[1:]) if isinstance(out, tuple) else h

    b0.forward, b1.forward = first, second
    return b0, b1


@pytest.mark.parametrize("missing", ["zeros", "raise"])
def test_a_model_that_cannot_be_re_entered_is_caught_by_the_check_and_runs_whole(missing):
    """A check that answers every block proves nothing, so the next re-entered pass is checked too; where it
    gives other logits or raises, the evaluator keeps the whole pass's M and runs whole passes from then on."""
    lm = tiny_model("llama")
    with graph_of(lm) as (wiring, graph, _):
        blocks = _side_state(wiring, missing)
        try:
            ev = Evaluator(lm, wiring, graph, random_pairs(11, n=5), batch_size=3)
            sequence = _top_only(graph)  # re-entered at 2 (every block answered), then at 1
            assert [ev.metric(c) for c in sequence] == [whole(ev).metric(c) for c in sequence]
            assert ev.reentry_refused.startswith("re-entering a pass failed: KeyError" if missing == "raise"
                                                 else "a pass re-entered at a layer did not give")
        finally:
            for block in blocks:
                del block.forward
