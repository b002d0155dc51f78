"""One library call per run kind (probe.entries.kinds): on tiny models, every command's run folder equals the
folder its library call's ``RunResult.save`` writes (the same files; CSV, NPY and NPZ content equal; JSON equal
but for the keys listed in :data:`VOLATILE`, the times and dates); the call writes nothing until ``save``, and
its result carries the tables, arrays, notes and records a notebook or the live page reads."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_edge_circuits import PAIRS_TSV

import probe
from conftest import invoke_cli, save_tiny, tiny_model
from probe.entries.kinds import RUNS
from probe.errors import InputError
from probe.settings import (
    SETTINGS,
    AnalyzeSettings,
    CircuitSettings,
    CompareSettings,
    EffectsSettings,
    PatchSettings,
    PathSettings,
    PruneSettings,
    VerifySettings,
    WhySettings,
)

#: JSON keys whose values are times or dates (measured again by every run): left out of the comparison.
#: ``speedup``/``speedup_range``: the pruned copy's forward time against the gated model's, a timing ratio.
VOLATILE = {"created", "timings_s", "seconds", "speedup", "speedup_range"}

TEXTS = ["The cat sat on the mat and looked at the dog.", "When Mary and John went to the store, John gave a drink.",
         "A quick brown fox jumps over the lazy dog."]


def _stable(value):
    """``value`` without the :data:`VOLATILE` keys, at any depth."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def assert_same_folder(a: Path, b: Path) -> list[str]:
    """Two run folders hold the same files with the same content (HTML pages: the same file name; JSON: equal
    but for :data:`VOLATILE`); returns the file names."""
    files = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    for name in files:
        x, y = a / name, b / name
        if name.endswith(".csv"):
            pd.testing.assert_frame_equal(pd.read_csv(x), pd.read_csv(y), check_exact=True, obj=name)
            assert x.read_bytes() == y.read_bytes(), name
        elif name.endswith((".npy", ".npz")):
            ex, ey = np.load(x, allow_pickle=False), np.load(y, allow_pickle=False)
            if name.endswith(".npy"):
                np.testing.assert_array_equal(ex, ey, err_msg=name)
            else:
                assert sorted(ex.files) == sorted(ey.files), name
                for key in ex.files:
                    np.testing.assert_array_equal(ex[key], ey[key], err_msg=f"{name}:{key}")
        elif name.endswith(".json"):
            ja, jb = (json.loads(p.read_text(encoding="utf-8")) for p in (x, y))
            assert _stable(ja) == _stable(jb), name
    return files


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("calls")
    model = save_tiny("llama", root / "model")
    pairs = root / "pairs.tsv"
    pairs.write_text(PAIRS_TSV, encoding="utf-8")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 2) + "\n", encoding="utf-8")
    return root, model, pairs, corpus


def _command(root: Path, name: str, *args) -> Path:
    out = root / f"cli-{name}"
    res = invoke_cli(name, *args, "--out", out, "--no-progress")
    assert res.exit_code == 0, res.output + repr(res.exception)
    return out


def test_analyze_folder_equals_the_calls_save(llama, tmp_path):
    root, model, _, _ = llama
    cli = _command(tmp_path, "analyze", "--model", model, *(a for t in TEXTS for a in ("--text", t)))
    run = probe.run_analyze(str(model), AnalyzeSettings(texts=TEXTS))
    assert not (tmp_path / "lib").exists()
    lib = run.save(tmp_path / "lib")
    files = assert_same_folder(cli, lib)
    assert {"heads.csv", "run.json", "index.html", "examples.npz"} <= set(files)
    assert run.tables["heads"] is run.analysis.heads and len(run.tables["heads"]) == 8
    assert run.arrays["example_0"].shape[:2] == (2, 4)  # [sites, heads, query, key]
    record = run.records()
    assert record["kind"] == "analyze" and len(record["heads"]) == 8 and json.dumps(record)
    assert record["counts"] == json.loads((lib / "run.json").read_text())["counts"]


def test_patch_folder_equals_the_calls_save(llama, tmp_path):
    root, model, pairs, _ = llama
    cli = _command(tmp_path, "patch", "--model", model, "--pairs", pairs, "--component", "z,q")
    run = probe.run_patch(str(model), PatchSettings(pairs=str(pairs), components=("q",)))
    files = assert_same_folder(cli, run.save(tmp_path / "lib"))
    assert {"patch.csv", "composition.csv", "components.csv"} <= set(files)
    assert set(run.tables) == {"heads", "patching", "dla", "composition", "components"}
    assert run.notes == run.analysis.notes and "patch_s" in run.analysis.timings


def test_path_folder_equals_the_calls_save(llama, tmp_path):
    root, model, pairs, _ = llama
    cli = _command(tmp_path, "path", "--model", model, "--pairs", pairs, "--senders", "L0H1,L0H2",
                   "--receivers", "logits,L1H3.q")
    run = probe.run_path(str(model), PathSettings(senders="L0H1,L0H2", receivers="logits,L1H3.q", pairs=str(pairs)))
    assert_same_folder(cli, run.save(tmp_path / "lib"))
    assert len(run.tables["path"]) == 2 * 2 + 1  # each sender into each receiver, and all together


def test_circuit_folder_equals_the_calls_save(llama, tmp_path):
    root, model, pairs, _ = llama
    args = ("--method", "eap", "--seeds", "2", "--shares", "0.1,0.5", "--edges", "6")
    cli = _command(tmp_path, "circuit", "--model", model, "--pairs", pairs, *args)
    settings = CircuitSettings(pairs=str(pairs), method="eap", seeds=2, shares=(0.1, 0.5), edges=6)
    run = probe.run_circuit(str(model), settings)
    files = assert_same_folder(cli, run.save(tmp_path / "lib"))
    assert {"edges.csv", "nodes.csv", "faithfulness.csv"} <= set(files)
    assert int(run.arrays["circuit"].sum()) == 6 and run.arrays["scores"].shape == (len(run.tables["edges"]),)


def test_effects_folder_equals_the_calls_save(llama, tmp_path):
    root, model, _, corpus = llama
    cli = _command(tmp_path, "effects", "--model", model, "--corpus", corpus, "--seeds", "5", "--ablation", "zero")
    run = probe.run_effects(str(model), EffectsSettings(corpus=str(corpus), seeds=5, ablation="zero"))
    files = assert_same_folder(cli, run.save(tmp_path / "lib"))
    assert {"effects.csv", "label_effects.csv"} <= set(files)


def test_prune_folder_equals_the_calls_save(llama, tmp_path):
    root, model, _, corpus = llama
    cli = _command(tmp_path, "prune", "--model", model, "--corpus", corpus, "--steps", "2", "--order",
                   "importance,random")
    run = probe.run_prune(str(model), PruneSettings(corpus=str(corpus), steps=2, orders=("importance", "random")))
    files = assert_same_folder(cli, run.save(tmp_path / "lib"))
    assert "pruning.csv" in files and list(run.tables["curves"]["order"].unique()) == ["importance", "random"]


def test_why_folder_equals_the_calls_save(llama, tmp_path):
    root, model, _, _ = llama
    cli = _command(tmp_path, "why", "--model", model, "--text", TEXTS[1], "--head", "L1H2", "--top", "3")
    run = probe.run_why(str(model), WhySettings(head="L1H2", text=TEXTS[1], top=3))
    files = assert_same_folder(cli, run.save(tmp_path / "lib"))
    assert "why.csv" in files
    w = run.measured.why
    assert run.arrays["contributions"].shape == (len(w.sources), len(w.sources), len(w.tokens))


def test_compare_folder_equals_the_calls_save(llama, tmp_path):
    root, model, _, _ = llama
    a = _command(tmp_path, "analyze", "--model", model, "--text", TEXTS[0])
    b = _command(tmp_path / "b", "analyze", "--model", model, "--text", TEXTS[2])
    res = invoke_cli("compare", a, b, "--out", tmp_path / "cli-compare")
    assert res.exit_code == 0, res.output
    run = probe.run_compare(CompareSettings(runs=(str(a), str(b))))
    files = assert_same_folder(tmp_path / "cli-compare", run.save(tmp_path / "lib"))
    assert {"compare.csv", "compare.json"} <= set(files)
    assert len(run.tables["compare"]) == 8 and len(run.records()["heads"]) == 8


def test_verify_prints_the_calls_record(llama, tmp_path):
    """probe verify writes no folder: its --json output is the call's record (save writes it as verify.json)."""
    root, model, _, _ = llama
    res = invoke_cli("verify", "--model", model, "--quick", "--json", "--no-progress")
    assert res.exit_code == 0, res.output
    run = probe.run_verify(str(model), VerifySettings(quick=True))
    assert _stable(json.load(io.StringIO(res.stdout))) == _stable(run.records())
    assert run.measured.passed and list(run.tables["cases"]["name"]) == ["sentence"]
    saved = run.save(tmp_path / "verify")
    assert json.loads((saved / "verify.json").read_text()) == json.loads(json.dumps(run.records()))


def test_a_notebook_runs_every_kind_on_a_loaded_model(llama, tmp_path):
    """One line a kind on one loaded model, every kind of probe.entries.kinds.RUNS (compare: the model against
    itself, every difference 0); nothing written until save."""
    root, _, pairs, corpus = llama
    lm = tiny_model("llama")
    runs = {
        "analyze": probe.run_analyze(lm, AnalyzeSettings(texts=TEXTS[:1], rollout=False)),
        "verify": probe.run_verify(lm, VerifySettings(quick=True)),
        "prune": probe.run_prune(lm, PruneSettings(corpus=str(corpus), steps=2, orders=("importance",))),
        "effects": probe.run_effects(lm, EffectsSettings(corpus=str(corpus), seeds=5, ablation="zero")),
        "patch": probe.run_patch(lm, PatchSettings(pairs=str(pairs))),
        "path": probe.run_path(lm, PathSettings(senders="L0H1", receivers="logits", pairs=str(pairs))),
        "circuit": probe.run_kind("circuit", lm, {"pairs": str(pairs), "method": "eap", "seeds": 1, "edges": 4}),
        "why": probe.run_why(lm, WhySettings(head="L1H0", text=TEXTS[0])),
        "compare": probe.run_compare(models=(lm, lm), texts=TEXTS),
    }
    assert set(runs) == set(RUNS) and {k: r.kind for k, r in runs.items()} == {k: k for k in runs}
    assert not any(tmp_path.iterdir())
    for kind, run in runs.items():
        assert isinstance(run.notes, list) and run.tables, kind
        assert json.dumps(run.records(), allow_nan=True), kind
    assert runs["patch"].timings == {} and runs["patch"].lm is lm  # a loaded model: no load time
    deltas = runs["compare"].tables["compare"].filter(like="delta_")
    assert len(deltas) == 8 and deltas.shape[1] > 3 and (deltas.fillna(0) == 0).all().all()


def test_compare_takes_two_loaded_models_without_settings():
    """``run_compare(models=(a, b))``: the settings' defaults, the models named by their names; neither settings
    nor models is one line."""
    with pytest.raises(InputError) as err:
        probe.run_compare()
    assert str(err.value) == "run_compare needs its settings (CompareSettings) or two loaded models (models=)"
    lm = tiny_model("gpt2")
    run = probe.run_compare(models=(lm, lm), texts=TEXTS[:1])
    assert run.settings == CompareSettings(models=(lm.name, lm.name))
    assert run.pair[0].settings["input"] == "texts" and run.pair[0].counts["sequences"] == 1


def test_the_api_page_runs_every_kind_in_one_line():
    """docs/api.md's block of run calls: one line a kind of probe.entries.kinds.RUNS, each its kind's call with
    its kind's settings class (the block is not run: every kind on SmolLM2 takes minutes; the test above runs
    each the same way on a tiny model)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text(encoding="utf-8")
    block = page.split("## One call per run kind", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    lines = {kind: [ln for ln in block.splitlines() if f"probe.run_{kind}(" in ln] for kind in RUNS}
    assert {kind: len(found) for kind, found in lines.items()} == dict.fromkeys(RUNS, 1)
    for kind, (line,) in lines.items():
        assert f"{SETTINGS[kind].__name__}(" in line, line
        assert line.startswith("run = probe.run_") and (kind == "compare" or f"run_{kind}(lm, " in line), line
