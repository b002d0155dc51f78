"""Greedy pruning of the edge graph (probe circuit --select greedy): the circuit keeps the threshold,
its faithfulness is its own pass's, a converged circuit loses the threshold without any one of its
edges, the pass budget is kept."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_edge_circuits import PAIRS_TSV, random_pairs

from conftest import invoke_cli, save_tiny, tiny_model
from probe.circuits.attribution import edge_scores
from probe.circuits.checked import checked_graph
from probe.circuits.evaluate import Evaluator
from probe.circuits.greedy import greedy_circuit
from probe.effects.pairs import EncodedPairs


@pytest.fixture(scope="module", params=["gpt2", "gpt_neox"])
def pruned(request):
    lm = tiny_model(request.param)
    wiring, graph, _ = checked_graph(lm)
    enc = random_pairs(3)
    ev = Evaluator(lm, wiring, graph, enc)
    scores = edge_scores(lm, wiring, graph, enc, method="eap")
    return ev, scores, greedy_circuit(ev, scores, 0.8)


def _faith(ev, included):
    n = len(included)
    full, empty = ev.metric(np.ones(n, dtype=bool)), ev.metric(np.zeros(n, dtype=bool))
    return (ev.metric(included) - empty) / (full - empty)


def test_the_greedy_circuit_keeps_the_threshold_by_its_own_pass(pruned):
    ev, scores, g = pruned
    assert g.converged and 0 < g.circuit.sum() < len(scores)
    assert g.faithfulness >= 0.8
    assert _faith(ev, g.circuit) == pytest.approx(g.faithfulness, abs=1e-9)


def test_a_converged_circuit_loses_the_threshold_without_any_one_of_its_edges(pruned):
    ev, _, g = pruned
    for e in np.flatnonzero(g.circuit):
        fewer = g.circuit.copy()
        fewer[e] = False
        assert _faith(ev, fewer) < 0.8


def test_the_pass_budget_is_kept_and_a_lower_threshold_keeps_fewer_edges(pruned):
    ev, scores, g = pruned
    short = greedy_circuit(ev, scores, 0.8, max_passes=6)
    assert short.passes <= 6 and not short.converged and short.circuit.sum() >= g.circuit.sum()
    assert greedy_circuit(ev, scores, 0.3).circuit.sum() <= g.circuit.sum()


def test_each_round_is_reported_as_it_ends(pruned):
    """A second greedy pruning on the same evaluator (its circuits remembered) chooses the same circuit,
    and reports each round as it ends: the last report is the result's own."""
    ev, scores, g = pruned
    seen = []
    again = greedy_circuit(ev, scores, 0.8, on_round=lambda *r: seen.append(r))
    assert np.array_equal(again.circuit, g.circuit) and again.faithfulness == g.faithfulness
    assert [r[0] for r in seen] == list(range(1, again.rounds + 1))
    assert seen[-1] == (again.rounds, again.passes, int(again.circuit.sum()), again.faithfulness)
    assert all(a[1] < b[1] and a[2] >= b[2] for a, b in zip(seen, seen[1:]))
    assert again.converged and len(seen) >= 2 and seen[-1][2] == seen[-2][2]  # the last round removed nothing


def test_pairs_that_do_not_differ_keep_the_complete_graph():
    lm = tiny_model("llama")
    wiring, graph, _ = checked_graph(lm)
    enc = random_pairs(4)
    same = EncodedPairs(enc.clean, enc.clean, enc.mask, enc.last, enc.answer, enc.wrong)
    g = greedy_circuit(Evaluator(lm, wiring, graph, same), np.ones(graph.n_edges), 0.8)
    assert g.circuit.all() and np.isnan(g.faithfulness)


def test_circuit_command_with_greedy_selection(tmp_path):
    model = save_tiny("gpt2", tmp_path / "gpt2")
    (tmp_path / "pairs.tsv").write_text(PAIRS_TSV, encoding="utf-8")
    result = invoke_cli("circuit", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--method", "eap",
                        "--select", "greedy", "--threshold", "0.9", "--seeds", 2, "--out", tmp_path / "run",
                        "--no-progress")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run" / "run.json").read_text())["circuit"]
    greedy, k = record["greedy"], record["circuit_edges"]
    assert record["select"] == "greedy" and greedy["edges"] == k == len(pd.read_csv(tmp_path / "run" / "circuit.csv"))
    assert record["circuit_faithfulness"] == greedy["faithfulness"] >= 0.9
    top = pd.read_csv(tmp_path / "run" / "faithfulness.csv").set_index("k").loc[k, "faithfulness"]
    assert greedy["top_k_faithfulness"] == pytest.approx(top, abs=1e-5)  # top-k of the same size beside it
    assert f"greedy circuit of {k} edges: faithfulness {greedy['faithfulness']:.3f}" in result.output
    assert f"greedy pruning, round {greedy['rounds']}: {greedy['passes']} circuits so far" in result.output
    assert "greedy pruning from the complete graph" in (tmp_path / "run" / "index.html").read_text(encoding="utf-8")
    bad = invoke_cli("circuit", "--model", model, "--threshold", "1.5")
    assert bad.exit_code == 2 and "--threshold" in bad.output


@pytest.mark.parametrize("greedy", [None, {"edges": 4, "share": 0.05, "faithfulness": 0.93}])
def test_the_faithfulness_legend_stays_inside_the_figure(greedy):
    import re

    from probe.circuits.report import CHAR_WIDTH, faithfulness_svg

    frame = pd.DataFrame({"k": [1, 10, 100], "share": [0.001, 0.01, 0.1], "faithfulness": [0.1, 0.5, 0.9],
                          "random_mean": [0.0, 0.1, 0.3], "random_std": [0.01, 0.05, 0.1]})
    svg = str(faithfulness_svg(frame, greedy))
    width = float(re.search(r'viewBox="0 0 (\d+)', svg).group(1))
    panel = re.search(r'<rect x="(\d+)" y="\d+" width="([\d.]+)"', svg)
    right = float(panel.group(1)) + float(panel.group(2))
    legend = [(float(x), text) for x, text in re.findall(r'<text x="([\d.]+)" y="[\d.]+">([^<]+)</text>', svg)
              if float(x) > right]
    assert {t for _, t in legend} >= {"top-k edges", "random (mean \u00b1 1 sd)"}
    assert ("greedy circuit" in {t for _, t in legend}) == (greedy is not None)
    assert all(x + CHAR_WIDTH * len(text) <= width for x, text in legend)  # 7 px a character: above 11 px sans
    assert ('data-point="greedy"' in svg) == (greedy is not None)
