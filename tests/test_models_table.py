"""The supported-models table (docs/models.md, probe/data/models.tsv) is a test: tiny random models of
transformers' model types, probe run on each, the result equal to the committed table."""

from __future__ import annotations

import math
import re
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from click.testing import CliRunner

from probe.cli import main
from probe.loading.support import COLUMNS, STAMP, STATUSES, model_types, status_counts, table_version, type_note

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import models_table  # noqa: E402 - tools/ is not a package: its folder on the path first
import tiny_models  # noqa: E402

DOCS = ROOT / "docs" / "models.md"

#: A fixed sample across kinds: types with a hand-written spec and types probe discovers or refuses.
SAMPLE = ("llama", "qwen2", "mixtral", "falcon", "gpt_neo", "bert", "deberta-v2", "esm", "bart", "t5", "pegasus",
          "mt5")


def committed() -> dict[str, dict]:
    return {r["type"]: r for r in model_types()}


def test_the_sample_runs_as_the_committed_table_says():
    """Each sample type built, wrapped, verified and analyzed in a worker process: status and reason
    equal the committed table's row (a change in probe that changes a row must regenerate the table)."""
    kinds = dict(tiny_models.text_types())
    rows = models_table.table([(t, kinds[t]) for t in SAMPLE], echo=lambda s: None)
    table = committed()
    for r in rows:
        assert (r["status"], r["reason"]) == (table[r["type"]]["status"], table[r["type"]]["reason"]), r
        if r["status"] == "works":  # verification passed: a finite largest difference recorded
            assert math.isfinite(float(r["max_diff"])), r
    assert {r["kind"] for r in rows} == {"decoder", "encoder", "encoder-decoder"}


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "t5gemma", "deberta-v2", "zamba2", "gpt_neo"])
def test_tiny_configs_are_tiny(model_type):
    """Two layers (each stack), width 64, the tokenizer's vocabulary; per-layer lists as long as the layers."""
    kind = dict(tiny_models.text_types())[model_type]
    model, tok = tiny_models.build(model_type, kind)
    configs = [model.config] + [getattr(model.config, k) for k in ("encoder", "decoder") if
                                hasattr(getattr(model.config, k, None), "to_dict")]
    checked = 0
    for cfg in configs:
        d = cfg.to_dict()
        layers = next((d[k] for k in tiny_models.LAYER_KEYS if isinstance(d.get(k), int)), None)
        if layers is None:  # a composite config (t5gemma): its encoder and decoder say
            continue
        checked += 1
        assert layers == tiny_models.LAYERS, (model_type, d)
        assert next(d[k] for k in ("hidden_size", "d_model", "n_embd", "dim") if k in d) == tiny_models.HIDDEN
        for key in ("layer_types", "layers_block_type", "attention_layers"):
            if isinstance(d.get(key), list):
                assert len(d[key]) == layers, (model_type, key, d[key])
    assert checked >= 1
    assert model.get_input_embeddings().num_embeddings == len(tok)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    assert not model.training


def test_per_layer_lists_keep_every_kind_of_layer():
    values = ["linear_attention"] * 2 + ["hybrid"] + ["linear_attention"] * 3
    assert tiny_models._per_layer("layers_block_type", values, 2) == ["linear_attention", "hybrid"]
    assert tiny_models._per_layer("layer_types", ["full_attention"] * 5, 2) == ["full_attention"] * 2
    assert tiny_models._per_layer("intermediate_size", [16384] * 35, 2) == [tiny_models.FFN] * 2


def test_the_committed_table_is_whole_and_consistent():
    """Stamped with the transformers version it was made with, as docs/models.md says; on that version, one
    row per model type of the installed transformers, in the same order, kinds as computed now (on another,
    `probe models --all` says so: the next test); docs/models.md's status column equals the tsv's; the counts
    add up."""
    rows = model_types()
    made = table_version()
    assert made and f"every text model type of transformers {made}:" in DOCS.read_text(encoding="utf-8")
    if made == version("transformers"):
        assert [(r["type"], r["kind"]) for r in rows] == tiny_models.text_types()
    assert all(set(r) == set(COLUMNS) and r["status"] in STATUSES for r in rows)
    assert all((r["status"] == "out of scope") == (r["kind"] == "not text") for r in rows)
    assert all(r["reason"] == "" for r in rows if r["status"] == "works")
    assert all(r["reason"] for r in rows if r["status"] == "refused")
    # every refusal names probe's step or the reason, never a bare exception ("IndexError: index 128 ...")
    assert not [r["type"] for r in rows if re.match(r"\w+(Error|Exception|Warning):", r["reason"])]
    assert all(r["analyze"] == "ran" for r in rows if r["status"] == "works")
    text = DOCS.read_text(encoding="utf-8")
    assert models_table.status_column(text) == {r["type"]: r["status"] for r in rows if r["kind"] != "not text"}
    c = status_counts(rows)
    assert f"**{c['all']['works']} work, {c['all']['refused']} refused**" in text
    assert sum(c["all"].values()) == len(rows)
    # the README says the same counts
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    text_types = sum(1 for r in rows if r["kind"] != "not text")
    analyzed = sum(1 for r in rows if r["analyze"] == "ran")
    assert (f"stamped with ({made}) on a tiny model, and `probe models --all` prints it. Of its {text_types} text "
            f"types, {c['all']['works']} pass `probe verify` and `probe analyze` runs on {analyzed};") in readme


def test_markdown_cells_escape_what_markdown_reads():
    assert models_table._cell("a|b_c *d* <e>") == r"a\|b\_c \*d\* &lt;e&gt;"
    rows = [{"type": "x_y", "kind": "decoder", "status": "refused", "reason": "no | way", "analyze": "ran",
             "max_diff": "", "seconds": "0.1"},
            {"type": "z", "kind": "encoder", "status": "works", "reason": "", "analyze": "ran", "max_diff": "0.0e+00",
             "seconds": "1.0"}]
    md = models_table.markdown(rows, "0")
    assert models_table.status_column(md) == {"x_y": "refused", "z": "works"}
    assert "**1 work, 1 refused**" in md
    assert "`probe.analyze` alone ran on 2 types" in md
    assert models_table.COLUMNS == COLUMNS


def test_probe_models_all_prints_the_table():
    result = CliRunner().invoke(main, ["models", "--all"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    text_rows = [r for r in model_types() if r["kind"] != "not text"]
    assert len(lines) == len(text_rows) + 2 + (table_version() != version("transformers"))  # header, rows, counts
    for r, line in zip(text_rows, lines[1:]):
        assert line.split()[:3] == [r["type"], r["kind"], r["status"]], line
        assert type_note(r) in line
    c = status_counts(model_types())
    assert lines[len(text_rows) + 1].startswith(f"{c['all']['works']} of {len(text_rows)} text model types work")
    assert "--all" in CliRunner().invoke(main, ["models", "--help"]).stdout


@pytest.mark.parametrize("installed", ["same", "9.9.9"])
def test_probe_models_all_says_when_the_installed_transformers_is_not_the_tables(monkeypatch, installed):
    """The table says what probe did on the transformers it was made with: on another installed version one
    more line names both versions and how to remake the table; on the same version nothing is added."""
    import probe.cli.listing  # noqa: F401 - the module whose version lookup is replaced

    installed = table_version() if installed == "same" else installed
    monkeypatch.setattr("importlib.metadata.version", lambda name: installed if name == "transformers" else "0")
    lines = CliRunner().invoke(main, ["models", "--all"]).stdout.splitlines()
    text_rows = [r for r in model_types() if r["kind"] != "not text"]
    extra = lines[len(text_rows) + 2:]
    if installed == table_version():
        assert extra == []
    else:
        assert len(extra) == 1 and f"made with transformers {table_version()}" in extra[0]
        assert f"transformers {installed} is installed" in extra[0] and "tools/models_table.py" in extra[0]


def test_the_tools_stamp_is_the_one_probe_reads():
    assert models_table.STAMP == STAMP


@pytest.mark.slow
def test_the_whole_table_is_true(tmp_path):
    """Regenerate every row (one worker process, the time caps of tools/models_table.py): docs/models.md's
    status column is what probe does today."""
    assert models_table.main(["--out", str(tmp_path)]) == 0
    fresh = models_table.status_column((tmp_path / "models.md").read_text(encoding="utf-8"))
    assert fresh == models_table.status_column(DOCS.read_text(encoding="utf-8"))


def test_both_tools_run_types_through_the_one_worker_loop():
    """tools/workers.py's loop, with a stand-in runner (no process): a row the tool calls stopped is tried once
    more at the end, after a fresh worker (``stop``), in its place; the rest are kept as first tried; the
    worker stopped at the end. models_table.py and feature_matrix.py both use this loop, not a copy."""
    import feature_matrix
    import workers

    assert models_table.run_types is workers.run_types is feature_matrix.run_types
    assert models_table.Runner is workers.Runner is feature_matrix.Runner

    class Stand:
        def __init__(self):
            self.calls = []

        def run(self, model_type, kind):
            self.calls.append(("run", model_type))
            tries = sum(c == ("run", model_type) for c in self.calls)
            slow = model_type == "b" and tries == 1
            return workers.Outcome(None if slow else {"n": tries}, why="timed out" if slow else None)

        def stop(self):
            self.calls.append(("stop", None))

    def row_of(model_type, kind, outcome):
        return {"type": model_type, "kind": kind, "reason": outcome.why or "", **(outcome.row or {})}

    stand, said = Stand(), []
    rows = workers.run_types([("a", "decoder"), ("b", "encoder"), ("c", "decoder")], stand, row_of,
                             lambda r: r["reason"] == "timed out", said.append, lambda r: r["reason"] or "ok")
    assert rows == [{"type": "a", "kind": "decoder", "reason": "", "n": 1},
                    {"type": "b", "kind": "encoder", "reason": "", "n": 2},
                    {"type": "c", "kind": "decoder", "reason": "", "n": 1}]
    assert stand.calls == [("run", "a"), ("run", "b"), ("run", "c"), ("stop", None), ("run", "b"), ("stop", None)]
    assert said == ["[1/3] a (decoder): ok", "[2/3] b (encoder): timed out", "[3/3] c (decoder): ok",
                    "[again] b (encoder): ok"]
