"""``probe analyze`` as a library function: :func:`probe.entries.analyze.analyze_run` gives a notebook the run
the command writes (the same heads.csv and sections), and :func:`probe.runs.analysis.merge_head_columns` is the
one way a command's columns join the heads table."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import save_tiny, tiny_model
from probe.cli import main
from probe.entries.analyze import analysis_input, analyze_run, announcement, count_sequences
from probe.errors import InputError
from probe.loading.models import load_model
from probe.runs.analysis import merge_head_columns
from probe.text.corpus import sample_texts

TEXTS = ["The cat sat on the mat and looked at the dog.", "When Mary and John went to the store, John gave a drink.",
         "A quick brown fox jumps over the lazy dog."]


def test_the_library_run_equals_the_commands_run(tmp_path):
    folder = save_tiny("llama", tmp_path / "model")
    args = [a for t in TEXTS for a in ("--text", t)]
    res = CliRunner().invoke(main, ["analyze", "--model", str(folder), *args, "--out", str(tmp_path / "cli"),
                                    "--no-progress"])
    assert res.exit_code == 0, res.output
    result, path = analyze_run(load_model(str(folder)), TEXTS, out=tmp_path / "lib", source="--text")
    assert path == tmp_path / "lib"
    cli, lib = pd.read_csv(tmp_path / "cli" / "heads.csv"), pd.read_csv(path / "heads.csv")
    pd.testing.assert_frame_equal(cli, lib)
    assert len(lib) == 8 and {"induction", "label", "norm_mass"} <= set(lib.columns)
    a, b = (json.loads((p / "run.json").read_text()) for p in (tmp_path / "cli", path))
    assert a["settings"] == b["settings"] and a["counts"] == b["counts"]
    sections = {k for k in a if isinstance(a[k], dict) and k not in ("model", "settings", "counts", "timings_s")}
    assert sections == {k for k in b if isinstance(b[k], dict) and k not in ("model", "settings", "counts",
                                                                              "timings_s")}
    assert {"rollout", "attention-steps"} <= set(b) and set(result.results) >= {"rollout", "circuits"}


def test_merge_head_columns_matches_on_the_keys_both_tables_have():
    heads = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "self": [0.1, 0.2, 0.3, 0.4]})
    frame = pd.DataFrame({"stack": ["decoder"] * 3, "kind": ["self"] * 3, "layer": [1, 0, 0], "head": [1, 1, 0],
                          "effect": [4.0, 2.0, 1.0], "other": [9, 9, 9]})
    out = merge_head_columns(heads, frame, ["effect"])
    assert list(out.columns) == ["layer", "head", "self", "effect"]  # stack/kind only in frame: not added
    assert out["effect"].tolist()[:2] == [1.0, 2.0] and pd.isna(out["effect"][2]) and out["effect"][3] == 4.0
    assert list(merge_head_columns(heads, frame).columns) == ["layer", "head", "self", "effect", "other"]
    with pytest.raises(pd.errors.MergeError):
        merge_head_columns(heads, pd.concat([frame, frame]))


def test_the_input_of_a_run_is_read_by_the_library(tmp_path):
    """What --text, --corpus and no input give, and the refusal of two inputs, without the command line."""
    assert analysis_input(TEXTS, limit=2) == (TEXTS[:2], "--text", None)
    assert analysis_input() == (sample_texts(), "built-in sample", None)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    streamed, source, annotated = analysis_input(corpus=str(corpus))
    assert list(streamed) == TEXTS and source == str(corpus) and annotated is None
    assert count_sequences(str(corpus), None, 2) == 2 and count_sequences(None, None, None) is None
    with pytest.raises(InputError, match="not two of them"):
        analysis_input(TEXTS, corpus=str(corpus))


def test_the_start_line_says_how_many_sequences_and_the_model_shape():
    lm = tiny_model("llama")
    g = lm.geometry
    line = announcement(lm, TEXTS, "--text")
    assert line == f"Analyzing 3 sequences (--text) with {lm.name}: {g.n_layers} layers x {g.n_heads} heads"
    assert announcement(lm, None, "c.txt", counted=1).startswith("Analyzing 1 sequence from c.txt with ")
