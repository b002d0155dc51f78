"""``probe path``: path patching of sender heads into receivers from the command line, equal to the library's
path_patch, names parsed and refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_edge_circuits import PAIRS_TSV

from conftest import invoke_cli, one_error, save_tiny, tiny_model
from probe.circuits.checked import checked_graph
from probe.circuits.path_run import parse_receivers, parse_senders, receiver_name
from probe.circuits.paths import path_patch
from probe.effects.pairs import Pair, encode_pairs
from probe.errors import InputError

PAIRS = [Pair(*line.split("\t")) for line in PAIRS_TSV.strip("\n").split("\n")]


def test_names_parse_to_the_graph_inputs():
    lm = tiny_model("llama")  # 4 query heads, 2 key/value heads
    graph = checked_graph(lm)[1]
    assert parse_senders("L0H1, L1H3,L0H1", graph) == [(0, 1), (1, 3)]
    got = parse_receivers("logits,L1H3.q,L1H3.k,L1KV0.v", graph)
    assert got == [("logits", 2, 0), ("q", 1, 3), ("k", 1, 1), ("v", 1, 0)]
    assert [receiver_name(graph, r) for r in got] == ["logits", "L1H3.q", "L1KV1.k", "L1KV0.v"]
    for bad in ("L2H0.q", "L1H4.q", "L1KV2.k", "L1KV0.q", "L1H0", "mlp"):
        with pytest.raises(InputError, match="--receivers"):
            parse_receivers(bad, graph)
    with pytest.raises(InputError, match="--senders"):
        parse_senders("L0H9", graph)
    # out-of-range heads (layer 2 of 2, head 4 of 4, a negative layer) are refused naming the model's range,
    # never wrapped or dropped
    for bad in ("L2H0", "L0H4", "L-1H0"):
        with pytest.raises(InputError, match=r"--senders: .* \(L0H0 \.\. L1H3\)"):
            parse_senders(bad, graph)


def test_path_command_writes_each_path_and_all_together(tmp_path):
    model = save_tiny("llama", tmp_path / "llama")
    (tmp_path / "pairs.tsv").write_text(PAIRS_TSV, encoding="utf-8")
    result = invoke_cli("path", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--senders", "L0H1,L0H2",
                        "--receivers", "logits,L1H3.k", "--out", tmp_path / "run", "--no-progress")
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(tmp_path / "run" / "path.csv")
    assert list(frame["senders"]) == ["L0H1", "L0H1", "L0H2", "L0H2", "L0H1+L0H2"]
    assert list(frame["receivers"]) == ["logits", "L1KV1.k"] * 2 + ["logits+L1KV1.k"]
    lm = tiny_model("llama")
    wiring, graph, _ = checked_graph(lm)
    enc = encode_pairs(lm, PAIRS)
    expect = [path_patch(lm, wiring, graph, enc, [s], [r]) for s in [(0, 1), (0, 2)]
              for r in [("logits", 2, 0), ("k", 1, 1)]]
    expect.append(path_patch(lm, wiring, graph, enc, [(0, 1), (0, 2)], [("logits", 2, 0), ("k", 1, 1)]))
    assert frame["effect"].to_numpy() == pytest.approx(expect, rel=1e-4, abs=1e-6)
    record = json.loads((tmp_path / "run" / "run.json").read_text())["path"]
    gap = record["ld_corrupted"] - record["ld_clean"]
    assert frame["share"].to_numpy() == pytest.approx(frame["effect"].to_numpy() / gap, rel=1e-4)
    assert record["norms"] == "recomputed from the patched stream" and "recomputed from the patched stream" in \
        result.output
    assert "Path patching" in (tmp_path / "run" / "index.html").read_text(encoding="utf-8")
    assert "exactly 0" not in result.output  # every path here carries something
    # one sender below the receiver, one at its layer: that path is exactly 0, said in a note, the run goes on
    below = invoke_cli("path", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--senders", "L0H1,L1H0",
                       "--receivers", "L1H2.q", "--out", tmp_path / "below", "--no-progress")
    assert below.exit_code == 0, below.output
    assert "L1H0 -> L1H2.q: 0 (share 0.000)" in below.output and "reads nothing the sender" in below.output


def test_bad_names_are_one_error_line_before_any_run_folder(tmp_path):
    model = save_tiny("gpt2", tmp_path / "gpt2")
    (tmp_path / "pairs.tsv").write_text(PAIRS_TSV, encoding="utf-8")
    one_error(invoke_cli("path", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--senders", "L0H1",
                         "--receivers", "L7H0.q", "--out", tmp_path / "run"), 1, "--receivers", "L7H0.q",
              "layers 0 .. 1")
    assert not (tmp_path / "run").exists()
    # a name of the wrong form is a usage error, found before the model loads (no such model folder here)
    for option, value in (("--senders", "foo"), ("--senders", "L0H1,"), ("--receivers", "L1H0.x")):
        names = {"--senders": "L0H1", "--receivers": "logits", option: value}
        one_error(invoke_cli("path", "--model", tmp_path / "none", "--senders", names["--senders"], "--receivers",
                             names["--receivers"], "--out", tmp_path / "run"), 2, option, "not a name of that form")
    assert not (tmp_path / "run").exists()


def test_a_receiver_below_every_sender_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """A receiver at or below the layer of every sender reads nothing they write, so every effect into it
    is exactly 0: refused in one line from the names (and the layer range from the config) before any
    weight loads. Before, the command loaded the model, patched for 91 s on SmolLM2 and reported 0."""
    import probe.loading.models as models

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    model = save_tiny("gpt2", tmp_path / "gpt2")
    (tmp_path / "pairs.tsv").write_text(PAIRS_TSV, encoding="utf-8")
    monkeypatch.setattr(models, "load_model", no_loading)
    for senders, receivers, receiver, lowest in (("L1H0", "L0H2.q", "L0H2.q", "L1H0"),
                                                  ("L1H0", "L1H2.k", "L1H2.k", "L1H0"),  # the same layer
                                                  ("L1H3,L1H1", "logits,L1H0.v", "L1H0.v", "L1H1")):
        line = one_error(invoke_cli("path", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--senders", senders,
                                    "--receivers", receivers, "--out", tmp_path / "run"), 1, "--receivers")
        assert f"{receiver} reads nothing the senders write" in line and f"lowest sender, {lowest}," in line, line
        assert not (tmp_path / "run").exists()
    # out of range, from the config alone
    one_error(invoke_cli("path", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--senders", "L0H1",
                         "--receivers", "L7H0.q", "--out", tmp_path / "run"), 1, "L7H0.q", "layers 0 .. 1")
    one_error(invoke_cli("path", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--senders", "L0H9",
                         "--receivers", "logits", "--out", tmp_path / "run"), 1, "--senders", "'L0H9'")
    # the check imports no torch: the command answers before the seconds torch's import takes
    import subprocess
    import sys

    code = "import sys, probe.bounds as n; n.path_reads('L1H0', 'L0H2.q')"
    run = subprocess.run([sys.executable, "-c", code + "\n"], capture_output=True, text=True)
    assert "reads nothing the senders write" in run.stderr
    code = "import sys, probe.bounds as n; n.path_reads('L0H1', 'L1H2.q'); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    # the library function: silent where a receiver reads a sender (or the logits)
    from probe.circuits.path_run import check_arguments
    from probe.loading.models import peek_config

    config = peek_config(str(model))
    check_arguments("L0H1,L1H0", "L1H2.q,logits", config)
    check_arguments("L0H1", "L1H2.v", None)
    with pytest.raises(InputError, match="L0H2.q reads nothing"):
        check_arguments("L0H1", "L0H2.q", None)


def test_a_post_norm_encoder_is_refused_by_its_kind_not_by_its_pairs(tmp_path):
    # path patching and circuits need a pre-norm model: BERT hears that, not advice on its pairs
    model = save_tiny("bert", tmp_path / "bert")
    for command, what in ((("path", "--senders", "L0H0", "--receivers", "logits"), "path patching"),
                          (("circuit",), "circuits")):
        line = one_error(invoke_cli(*command, "--model", model, "--out", tmp_path / "run"), 1,
                         f"{what} needs a pre-LN model", "is post-LN")
        assert "--pairs" not in line and "masked-LM" not in line
        assert not (tmp_path / "run").exists()


def test_a_pre_norm_encoder_runs_path_patching_and_circuits_on_masked_pairs(tmp_path):
    # ModernBERT (spec discovered, masked-LM head): the metric at each prompt's [MASK]; both commands
    # write complete run folders (the values: tests/test_edge_circuits.py on the same model)
    from generic_models import generic_model

    from conftest import bert_tokenizer

    tok = bert_tokenizer()
    generic_model("modernbert", tok, masked_lm=True).save_pretrained(tmp_path / "mb")
    tok.save_pretrained(tmp_path / "mb")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("The capital of France is [MASK] .\tThe capital of Italy is [MASK] .\t paris\t rome\n"
                     "She went to the [MASK] to buy bread .\tShe went to the [MASK] to buy shoes .\t bakery\t store\n",
                     encoding="utf-8")
    result = invoke_cli("path", "--model", tmp_path / "mb", "--pairs", pairs, "--senders", "L1H0,L1H1,L1H2,L1H3",
                        "--receivers", "logits", "--out", tmp_path / "path", "--no-progress")
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(tmp_path / "path" / "path.csv")
    assert len(frame) == 5 and frame["effect"].notna().all()  # each head alone, then the four together
    assert (frame["effect"] != 0).all()  # each last-layer head writes to the logits directly
    result = invoke_cli("circuit", "--model", tmp_path / "mb", "--pairs", pairs, "--steps", 2, "--edges", 20,
                        "--seeds", 2, "--out", tmp_path / "circuit", "--no-progress")
    assert result.exit_code == 0, result.output
    edges = pd.read_csv(tmp_path / "circuit" / "edges.csv")
    assert len(edges) == 110  # 2 layers of 4 heads, no grouping, sequential: as GPT-2's graph
    nodes = pd.read_csv(tmp_path / "circuit" / "nodes.csv").set_index("node")["score"]
    sums = edges.groupby("upstream")["score"].sum()
    assert np.allclose(nodes.loc[sums.index], sums, rtol=1e-4, atol=1e-6)


def test_the_other_paths_time_is_said_after_the_first_where_it_is_long(tmp_path, monkeypatch):
    """``probe path`` said nothing while it patched (91 s on SmolLM2 for one path): after the first path it
    says what the others will take at its pace, where that reaches 10 s (probe.runs.pace.LONG_S), once;
    a short run says nothing, and the effects are the same with or without the line."""
    from probe.circuits import path_run
    from probe.runs import pace

    lm = tiny_model("gpt2")
    ticks = iter([100.0, 106.0])  # the first of 3 paths (2 senders into logits, then both together): 6 s

    lines: list[str] = []
    said = path_run.measure(lm, "L0H1,L0H2", "logits", PAIRS, estimate=lines.append, clock=lambda: next(ticks))
    assert lines == ["path patching: the first of 3 paths took 6.0 s; the other 2 will take about 12 s on this "
                     "machine as loaded now, then the heads are labelled"]
    quiet: list[str] = []
    ticks = iter([0.0, 4.9])  # 2 x 4.9 s: under 10 s
    silent = path_run.measure(lm, "L0H1,L0H2", "logits", PAIRS, estimate=quiet.append, clock=lambda: next(ticks))
    assert quiet == []
    pd.testing.assert_frame_equal(said.frame, silent.frame)
    pd.testing.assert_frame_equal(said.frame, path_run.measure(lm, "L0H1,L0H2", "logits", PAIRS).frame)
    assert path_run.rest_line(60.0, 1) is None  # one path: nothing left to say
    assert path_run.rest_line(2.0, 41).endswith("the other 40 will take about 80 s on this machine as loaded now, "
                                                "then the heads are labelled")
    assert "about 1.5 min" in path_run.rest_line(45.0, 3)
    # the command prints it on stderr (the threshold lowered: a tiny model's paths take milliseconds)
    model = save_tiny("gpt2", tmp_path / "gpt2")
    (tmp_path / "pairs.tsv").write_text(PAIRS_TSV, encoding="utf-8")
    monkeypatch.setattr(pace, "LONG_S", 0.0)
    result = invoke_cli("path", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--senders", "L0H1,L0H2",
                        "--receivers", "logits", "--out", tmp_path / "run", "--no-progress")
    assert result.exit_code == 0, result.output
    assert [ln for ln in result.stderr.splitlines() if ln.startswith("path patching: the first of 3 paths took ")]
    assert result.stdout.index("LD clean") >= 0
