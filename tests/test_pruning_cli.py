"""``probe prune`` on the command line: the run folder (report section with the curve plot,
pruning.csv, heads.csv importance, run.json), --json, --save-pruned and loading that folder back
with analyze/verify/prune, and one-line errors with the documented exit statuses."""

from __future__ import annotations

import csv
import json
import re

import pytest

from conftest import invoke_cli as run
from conftest import one_error, save_tiny
from probe.loading.pruned import PRUNED_FILE
from probe.report import CSP

SENTENCES = ["The cat sat on the mat.", "A dog barked at the moon.", "Birds sing in the morning.",
             "It rained all day long.", "She read the old letter twice.", "We walked home after the game.",
             "The train was late again.", "He painted the fence blue.", "They laughed at the joke.",
             "Snow covered the quiet town."]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("prune")
    model = save_tiny("bert", root / "model")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    result = run("prune", "--model", model, "--corpus", corpus, "--steps", 2, "--out", root / "run",
                 "--save-pruned", root / "pruned", "--json", "--no-progress")
    assert result.exit_code == 0, result.output + repr(result.exception)
    return root, model, corpus, json.loads(result.stdout)


def test_json_output(setup):
    root, model, _, out = setup
    assert list(out) == ["model", "objective", "curves", "pruned_params", "params_before", "speedup"]
    assert out["objective"] == "fidelity" and out["model"] == str(model)
    assert [p[0] for p in out["curves"]["importance"]] == [0.0, 0.25, 0.5]
    assert len(out["curves"]["random"][0]) == 3
    assert out["pruned_params"] < out["params_before"]


def test_run_folder(setup):
    root, _, _, out = setup
    run_dir = root / "run"
    assert sorted(p.name for p in run_dir.iterdir()) == [".probe-files.json", "examples.npz", "heads.csv",
                                                         "index.html", "pruning.csv", "run.json"]
    with open(run_dir / "pruning.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["order", "step", "fraction", "n_pruned", "value", "std", "layer", "head"]
    points = {(r["step"], r["fraction"], r["value"]) for r in rows if r["order"] == "importance"}  # a row per head
    imp = [float(x) for _, f, v in sorted(points) for x in (f, v)]
    assert imp == pytest.approx([x for p in out["curves"]["importance"] for x in p], rel=1e-5, abs=1e-9)
    # each pruned head is its own row with integer layer and head columns (no "3.5" that reads as a number)
    pruned = [(int(r["layer"]), int(r["head"])) for r in rows if r["order"] == "importance" and r["layer"]]
    rec_removed = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))["pruning"]["removed"]
    assert sorted(pruned) == sorted((d["layer"], d["head"]) for d in rec_removed) and len(pruned) == 4  # 50% of 2 x 4
    assert all(r["layer"] == r["head"] == "" for r in rows if r["step"] == "0")
    with open(run_dir / "heads.csv", newline="", encoding="utf-8") as fh:
        heads = list(csv.DictReader(fh))
    assert {"importance", "importance_raw", "nearest_js", "pruned_step"} <= set(heads[0])
    by_layer = {}
    for h in heads:
        by_layer.setdefault(h["layer"], []).append(float(h["importance"]))
    for values in by_layer.values():  # normalized per layer (l2 = 1)
        assert sum(v * v for v in values) == pytest.approx(1.0, abs=1e-4)
    rec = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    assert rec["pruning"]["curves"] == out["curves"]
    assert rec["pruning"]["split"] == {"scoring": 5, "held_out": 5, "seed": 0}
    assert rec["output"]["pruning.csv"].endswith("pruning.csv")


def test_report_draws_the_curves_as_inline_svg(setup):
    root, _, _, out = setup
    html = (root / "run" / "index.html").read_text(encoding="utf-8")
    assert f'content="{CSP}"' in html.replace("&#39;", "'")
    assert 'id="pruning"' in html and html.count("<svg") == 1
    svg = re.search(r"<svg.*?</svg>", html, re.S).group(0)
    orders = re.findall(r'<polyline points="([^"]+)"[^>]*data-order="(\w+)"', svg)
    assert [o for _, o in orders] == ["importance", "redundancy", "random"]
    assert all(len(points.split()) == 3 for points, _ in orders)  # steps 0, 1, 2
    assert 'data-band="random"' in svg
    assert 'data-fig="prune-importance"' in html
    section = html.split('<h2 id="pruning">', 1)[1].split("<h2", 1)[0]
    assert "<script" not in section  # the curves are SVG: the page's scripts are the other sections' and its own


def test_saved_model_loads_back_in_analyze_verify_and_prune(setup):
    root, _, corpus, _ = setup
    pruned = root / "pruned"
    record = json.loads((pruned / PRUNED_FILE).read_text(encoding="utf-8"))
    assert sum(len(v) for v in record["pruned_heads"].values()) == 4
    res = run("analyze", "--model", pruned, "--corpus", corpus, "--out", root / "analysis", "--no-progress")
    assert res.exit_code == 0, res.output
    html = (root / "analysis" / "index.html").read_text(encoding="utf-8")
    # the removed heads, grey in the grid (with the ink that reads on grey)
    assert len(re.findall(r'background: #BDBDBD; color: #[0-9A-Fa-f]{6}" title="L', html)) == 4
    assert "4 heads physically removed" in html
    with open(root / "analysis" / "heads.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    gone = {(int(k), h) for k, hs in record["pruned_heads"].items() for h in hs}
    assert {(int(r["layer"]), int(r["head"])) for r in rows if r["label"] == "removed"} == gone
    res = run("verify", "--model", pruned, "--no-progress")
    assert res.exit_code == 0 and "PASS" in res.stdout, res.output
    res = run("prune", "--model", pruned, "--corpus", corpus, "--steps", 1, "--fraction", 0.75, "--order",
              "importance,random", "--out", root / "again", "--json", "--no-progress")
    assert res.exit_code == 0, res.output
    again = json.loads(res.stdout)
    assert [p[0] for p in again["curves"]["importance"]] == [0.5, 0.75]  # starts at the heads already gone


def test_help_says_which_objective_each_model_gets():
    res = run("prune", "--help")
    assert res.exit_code == 0
    for word in ("clm", "decoders", "mlm", "masked-LM head", "fidelity", "minilm", "classification", "--labels"):
        assert word in res.stdout


@pytest.mark.parametrize("args,code,fragment", [
    (["--fraction", "1"], 2, "--fraction must be in (0, 1)"),
    (["--fraction", "0"], 2, "--fraction must be in (0, 1)"),
    (["--seeds", "2"], 2, "--seeds must be at least 3"),
    (["--order", "importance,worst"], 2, "distinct orders"),
    (["--steps", "0"], 2, "--steps must be at least 1"),
])
def test_malformed_options_exit_2(setup, args, code, fragment):
    root, model, corpus, _ = setup
    res = run("prune", "--model", model, "--corpus", corpus, *args)
    one_error(res, code, fragment)


def test_user_errors_exit_1_with_one_line(setup, tmp_path):
    root, model, corpus, _ = setup
    small = tmp_path / "small.txt"
    small.write_text("One.\nTwo.\nThree.\n", encoding="utf-8")
    one_error(run("prune", "--model", model, "--corpus", small, "--out", tmp_path / "a"), 1,
              "corpus too small to split: 3 sequence")
    one_error(run("prune", "--model", model, "--corpus", corpus, "--objective", "mlm", "--out", tmp_path / "b"), 1,
              "no MaskedLM head")
    one_error(run("prune", "--model", model, "--corpus", corpus, "--save-pruned", root / "run"), 1,
              "holds a probe run folder, not a pruned model folder")
    one_error(run("prune", "--model", model, "--corpus", corpus, "--out", root / "run"), 1,
              "already exists and is not empty")
    labels = tmp_path / "labels.txt"
    labels.write_text("pos\nneg\n", encoding="utf-8")
    one_error(run("prune", "--model", model, "--corpus", corpus, "--labels", labels, "--out", tmp_path / "c"), 1,
              "2 labels for 10 sequences")
