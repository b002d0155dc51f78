"""The ``probe`` command line and corpus reading."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import probe.loading.models as pm
from conftest import SHARED_DATA, conllu
from probe.cli import main
from probe.measures.stats import STATISTICS
from probe.text.corpus import read_corpus

UD_DEV = SHARED_DATA / "ud-ewt" / "en_ewt-ud-dev.conllu"
NASTY = "Look: <script>alert(1)</script> & <b>bold</b> text."


def run(*args, **kwargs):
    return CliRunner().invoke(main, list(args), **kwargs)


def assert_clean_error(result, *fragments):
    """Exit code != 0, one 'Error: ...' line naming every fragment, no traceback."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # not an uncaught error
    assert "Traceback" not in result.output
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


# --------------------------------------------------------------------------- a successful run

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    result = run("analyze", "--text", "The cat sat on the mat, and then it slept.",
                 "--text", NASTY, "--text", "Short one.", "--out", str(out), "--no-progress")
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert f"Report: {out / 'index.html'}" in result.stdout
    assert "72 heads" in result.stdout
    return out


@pytest.mark.slow
def test_analyze_writes_the_run_files(run_dir):
    # and the head groups' files (probe.patterns): clusters.csv and the distance matrices
    assert sorted(p.name for p in run_dir.iterdir()) == [
        ".probe-files.json", "clusters.csv", "examples.npz", "head_distance.npy", "head_distance_layers.npy",
        "heads.csv", "index.html",
        "run.json"]


@pytest.mark.slow
def test_heads_csv(run_dir):
    with open(run_dir / "heads.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 72
    columns = list(rows[0])
    assert columns[:4] == ["layer", "head", "label", "labels"]
    assert set(STATISTICS) <= set(columns)
    assert [(int(r["layer"]), int(r["head"])) for r in rows] == [(l, h) for l in range(6) for h in range(12)]
    for r in rows:
        assert r["label"] in r["labels"].split(";")
        for name in STATISTICS:
            assert np.isfinite(float(r[name]))  # an encoder with [SEP]: every statistic defined
        for name in ("self", "prev", "next", "first", "sep", "punct", "norm_entropy", "long", "max_weight"):
            assert -1e-6 <= float(r[name]) <= 1 + 1e-6


@pytest.mark.slow
def test_run_json(run_dir):
    rec = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    for key in ("model", "settings", "thresholds", "counts", "versions", "timings_s"):
        assert key in rec, key
    assert rec["model"]["name"] == "minilm"
    assert (rec["model"]["layers"], rec["model"]["heads"]) == (6, 12)
    assert rec["settings"]["batch_size"] == 16 and rec["settings"]["input"] == "--text"
    assert rec["thresholds"]["previous-token"] == {"statistic": "prev", "threshold": 0.5}
    assert rec["thresholds"]["broad"] == {"statistic": "norm_entropy", "threshold": 0.8}
    assert rec["counts"]["sequences"] == 3 and rec["counts"]["truncated"] == 0
    assert rec["counts"]["tokens"] > 20
    assert set(rec["versions"]) >= {"probe", "python", "torch", "transformers"}
    assert rec["timings_s"]["analyze_s"] > 0
    assert rec["timings_s"]["report_s"] > 0
    assert rec["timings_s"]["model_load_s"] > 0
    assert sum(rec["primary_label_counts"].values()) == 72


@pytest.mark.slow
def test_out_folder_not_overwritten_without_force(run_dir):
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    result = run("analyze", "--text", "Other text.", "--out", str(run_dir))
    assert_clean_error(result, "--force", str(run_dir))
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


@pytest.mark.slow
def test_force_overwrites_probe_files_and_keeps_others(tmp_path, minilm, monkeypatch):
    monkeypatch.setattr(pm, "load_model", lambda name, **kw: minilm)  # reuse the loaded model
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    (out / "heads.csv").write_text("stale", encoding="utf-8")
    result = run("analyze", "--text", "Hello there.", "--out", str(out))
    assert_clean_error(result, "probe did not write", "choose another folder")  # at once: --force would not help
    # a folder probe did not write: --force refuses too (its heads.csv is the user's)
    result = run("analyze", "--text", "Hello there.", "--out", str(out), "--force")
    assert_clean_error(result, "probe did not write")
    assert (out / "heads.csv").read_text(encoding="utf-8") == "stale"
    assert sorted(p.name for p in out.iterdir()) == ["heads.csv", "notes.txt"]

    mine = tmp_path / "run"
    assert run("analyze", "--text", "Hello there.", "--out", str(mine)).exit_code == 0
    (mine / "notes.txt").write_text("mine", encoding="utf-8")
    result = run("analyze", "--text", "Hello there.", "--out", str(mine), "--force",
                 "--threshold", "previous-token=0.3", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    assert (mine / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert (mine / "heads.csv").read_text(encoding="utf-8").startswith("layer,head,label,labels,")
    rec = json.loads((mine / "run.json").read_text(encoding="utf-8"))
    assert rec["thresholds"]["previous-token"]["threshold"] == 0.3
    assert rec["settings"]["batch_size"] == 2


@pytest.mark.slow
def test_default_out_is_a_new_reports_folder(tmp_path, minilm, monkeypatch):
    monkeypatch.setattr(pm, "load_model", lambda name, **kw: minilm)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        result = run("analyze", "--text", "One.", "--text", "Two, three.", "--limit", "1")
        assert result.exit_code == 0, result.output
    runs = sorted((tmp_path / "reports").iterdir())
    assert len(runs) == 2 and all(p.name.startswith("minilm-") for p in runs)
    for p in runs:
        assert sorted(f.name for f in p.iterdir()) == [
            ".probe-files.json", "clusters.csv", "examples.npz", "head_distance.npy", "head_distance_layers.npy",
            "heads.csv",
            "index.html", "run.json"]
        assert json.loads((p / "run.json").read_text(encoding="utf-8"))["counts"]["sequences"] == 1


# --------------------------------------------------------------------------- bad input

@pytest.fixture
def out(tmp_path):
    return tmp_path / "never-written"


def test_empty_text(out):
    assert_clean_error(run("analyze", "--text", "", "--out", str(out)), "empty")
    assert_clean_error(run("analyze", "--text", "ok", "--text", "   ", "--out", str(out)), "text 2 is empty")
    assert not out.exists()


def test_empty_corpus_file(tmp_path, out):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n", encoding="utf-8")
    assert_clean_error(run("analyze", "--corpus", str(empty), "--out", str(out)), "no text", str(empty))
    assert not out.exists()


def test_missing_corpus_file(tmp_path, out):
    missing = tmp_path / "nope.txt"
    assert_clean_error(run("analyze", "--corpus", str(missing), "--out", str(out)), "not found", str(missing))
    assert not out.exists()


def test_non_utf8_corpus_names_file_and_line(tmp_path, out):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("First line.\nSecond line.\nCaf\u00e9 au lait.\n".encode("latin-1"))
    line = assert_clean_error(run("analyze", "--corpus", str(bad), "--out", str(out)), str(bad), "line 3")
    assert "UTF-8" in line
    assert not out.exists()


def test_text_and_corpus_together(tmp_path, out):
    corpus = tmp_path / "c.txt"
    corpus.write_text("A line.\n", encoding="utf-8")
    assert_clean_error(run("analyze", "--text", "x", "--corpus", str(corpus), "--out", str(out)), "either")


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_bad_limit(limit, out):
    result = run("analyze", "--text", "Fine text.", "--limit", limit, "--out", str(out))
    assert_clean_error(result, "--limit", "at least 1")
    assert result.exit_code == 2  # a malformed option, as the README says
    assert not out.exists()


@pytest.mark.parametrize("args", [["--batch-size", "0"], ["--max-length", "1"], ["--threshold", "bogus=0.5"],
                                  ["--threshold", "self=-1"], ["--threshold", "self=abc"],
                                  ["--threshold", "previous-token=1.5"]])
def test_usage_errors(args, out):
    result = run("analyze", "--text", "Fine.", "--out", str(out), *args)
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert not out.exists()


def test_usage_error_is_one_line_through_the_entry_point(tmp_path):
    """click's usage errors come out as one 'Error: ...' line (exit code 2), not a usage block."""
    proc = subprocess.run([sys.executable, "-m", "probe", "analyze", "--batch-size", "0", "--text", "Hi."],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and "--batch-size" in lines[0], proc.stderr
    assert "probe analyze --help" in lines[0]


def test_a_path_given_as_text_is_analysed_as_text_with_a_note(out, tiny_bert_folder, tmp_path):
    """``--text /some/dir`` is analysed as its characters (it is text); a note says --text takes text and
    a file of texts is --corpus."""
    result = run("analyze", "--model", str(tiny_bert_folder), "--text", str(tmp_path), "--out", str(out),
                 "--no-distance", "--no-circuits", "--no-norm")
    assert result.exit_code == 0, result.output
    note = [ln for ln in result.stderr.splitlines() if ln.startswith("note: --text takes the text itself")]
    assert len(note) == 1 and "(a folder on this machine)" in note[0] and "--corpus FILE" in note[0]
    plain = run("analyze", "--model", str(tiny_bert_folder), "--text", "a/b is not a path here", "--out",
                str(out.parent / "plain"), "--no-distance", "--no-circuits", "--no-norm")
    assert plain.exit_code == 0 and "--text takes the text itself" not in plain.stderr


@pytest.mark.parametrize("text", ["\u200b", "   \u200b  "])
def test_text_with_only_special_tokens(text, out, tiny_bert_folder):
    assert_clean_error(run("analyze", "--model", str(tiny_bert_folder), "--text", text, "--out", str(out)),
                       "no tokens besides special tokens")
    assert not out.exists()


def test_a_folder_without_weights_or_tokenizer_says_which(tmp_path, out, tiny_bert_folder):
    """A folder with only config.json got transformers' cut-off "Couldn't instantiate the backend tokenizer
    from one of: " (nothing about the weights); one without tokenizer files loaded with a tokenizer built
    from nothing. Each is refused in one line naming what is missing."""
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tiny_bert_folder / "config.json", bare / "config.json")
    line = assert_clean_error(run("analyze", "--model", str(bare), "--text", "Hi.", "--out", str(out)), "no weights")
    assert "and no tokenizer files" in line and "nothing to load" in line
    weights = tmp_path / "no-tok"
    weights.mkdir()
    for f in tiny_bert_folder.iterdir():
        if f.name in ("config.json", "model.safetensors"):
            shutil.copy(f, weights / f.name)
    line = assert_clean_error(run("analyze", "--model", str(weights), "--text", "Hi.", "--out", str(out)),
                              "no tokenizer files")
    assert "no weights" not in line and "tokenizer.save_pretrained" in line
    assert not out.exists()


def test_a_folder_whose_config_asks_for_flash_attention_says_what_it_is_measured_with(tmp_path, out,
                                                                                    tiny_bert_folder):
    """A config asking for flash_attention_2 was loaded with eager attention without a word in the command's
    output: the note says so, on probe's log as the command runs, and in run.json."""
    import shutil

    folder = tmp_path / "fa2"
    shutil.copytree(tiny_bert_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "attn_implementation": "flash_attention_2"}))
    said = "the folder's config asks for flash_attention_2 attention; loaded with eager attention"
    # on probe's log, which the command prints as note: lines on its own stderr (whatever command ran before it
    # in this process: the log's handler writes to the stderr of the moment, not the first command's)
    result = run("analyze", "--model", str(folder), "--text", "The cat sat on the mat.", "--out", str(out),
                 "--no-distance", "--no-circuits", "--no-norm")
    assert result.exit_code == 0, result.output
    assert sum(line.startswith(f"note: {said}") for line in result.stderr.splitlines()) == 1, result.stderr
    assert any(said in n for n in json.loads((out / "run.json").read_text())["notes"])
    plain = run("analyze", "--model", str(tiny_bert_folder), "--text", "The cat sat on the mat.", "--out",
                str(tmp_path / "plain"), "--no-distance", "--no-circuits", "--no-norm")
    assert plain.exit_code == 0 and "asks for" not in plain.stderr


def test_a_truncated_text_says_where_and_why(out, tiny_bert_folder):
    """A text cut to the model's limit (a ModernBERT's 65 tokens) was counted as truncated without the
    limit or its reason; the summary names both."""
    result = run("analyze", "--model", str(tiny_bert_folder), "--text", " ".join(["word"] * 100), "--out",
                 str(out), "--no-distance", "--no-circuits", "--no-norm")
    assert result.exit_code == 0, result.output
    rec = json.loads((out / "run.json").read_text())
    limit = rec["model"]["max_length"]
    assert rec["counts"]["truncated"] == 1 and rec["settings"]["max_length"] == limit
    assert f", 1 truncated at {limit} tokens (the model's limit)" in result.stdout
    shorter = run("analyze", "--model", str(tiny_bert_folder), "--text", " ".join(["word"] * 100), "--max-length",
                  20, "--out", str(out.parent / "short"), "--no-distance", "--no-circuits", "--no-norm")
    assert shorter.exit_code == 0 and ", 1 truncated at 20 tokens (--max-length)" in shorter.stdout


def test_model_path_that_is_a_file(tmp_path, out):
    f = tmp_path / "corpus.txt"
    f.write_text("not a model\n")
    assert_clean_error(run("analyze", "--model", str(f), "--text", "Hi.", "--out", str(out)),
                       "is a file, not a model folder")


def test_hub_unreachable_without_offline_flag_fails_fast_and_quietly(tmp_path):
    """No HF_HUB_OFFLINE: probe sees the Hub endpoint is unreachable and loads from the cache only,
    so the user gets one line, not the Hub client's retry messages."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # discard port: connection refused at once
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty cache
    proc = subprocess.run([sys.executable, "-m", "probe", "analyze", "--model", "bert-base",
                           "--text", "Hi.", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "google-bert/bert-base-uncased" in lines[0] and "not reachable" in lines[0]
    assert "minilm" in lines[0]


def test_unknown_model_name_offline(out):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    line = assert_clean_error(run("analyze", "--model", "no-such-model-xyz", "--text", "Hi.", "--out", str(out)),
                              "no-such-model-xyz")
    assert "minilm" in line and "smollm2" in line
    assert not out.exists()


def test_unknown_model_name_subprocess(tmp_path):
    """Through the real entry point: one line on stderr, exit code 1, no traceback."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "probe", "analyze", "--model", "acme/not-a-model",
                           "--text", "Hi.", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "acme/not-a-model" in errors[0]
    assert "minilm" in errors[0] and "smollm2" in errors[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("model_type", ["fsmt", "prophetnet"])
def test_unsupported_model_type_folder(tmp_path, out, model_type):
    """A folder of an encoder-decoder type whose attention is its own code, holding a config alone: one line,
    nothing to load. Such a type is no longer refused before its weights are read: FSMT and MVP are captured
    from the maps they return (tests/test_tiny_types.py), ProphetNet is refused once loaded, in one line."""
    folder = tmp_path / f"{model_type}-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
    assert_clean_error(run("analyze", "--model", str(folder), "--text", "Hi.", "--out", str(out)),
                       str(folder), "no weights")
    assert not out.exists()


def test_folder_with_unknown_model_type_or_no_config(tmp_path, out):
    folder = tmp_path / "weird"
    folder.mkdir()
    assert_clean_error(run("analyze", "--model", str(folder), "--text", "Hi.", "--out", str(out)),
                       "no config.json")
    (folder / "config.json").write_text(json.dumps({"model_type": "no-such-type"}), encoding="utf-8")
    assert_clean_error(run("analyze", "--model", str(folder), "--text", "Hi.", "--out", str(out)), str(folder))
    assert_clean_error(run("analyze", "--model", str(tmp_path / "absent"), "--text", "Hi.", "--out", str(out)),
                       "not found")
    assert not out.exists()


def test_models_lists_embedded_as_installed():
    result = run("models")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    for alias in ("minilm", "smollm2"):
        line = next(ln for ln in lines if ln.startswith(alias))
        assert re.search(r"\bembedded\s+installed\b", line), line
    assert any(ln.startswith("minilm (default)") for ln in lines)
    assert any(ln.startswith("bert-base") and "Hub" in ln for ln in lines)


# --------------------------------------------------------------------------- corpus through the CLI

CONLLU = conllu("corpus")


@pytest.mark.slow
def test_corpus_file_through_cli_reaches_the_analysis(tmp_path, monkeypatch, minilm):
    """A CoNLL-U corpus with --limit reaches analyze as exactly its first '# text =' sentences."""
    import probe.entries.texts
    import probe.runs.analysis as pa

    path = tmp_path / "tiny.conllu"
    path.write_text(CONLLU, encoding="utf-8")
    seen = {}

    class Stop(Exception):
        pass

    def fake_analyze(lm, texts, **kw):
        seen["model"], seen["texts"] = lm.name, list(texts)
        raise Stop

    monkeypatch.setattr(pm, "load_model", lambda name, **kw: minilm)
    monkeypatch.setattr(pa, "analyze", fake_analyze)
    monkeypatch.setattr(probe.entries.texts, "analyze", fake_analyze)  # the run's own reference to it
    result = run("analyze", "--model", "minilm", "--corpus", str(path), "--limit", "2",
                 "--out", str(tmp_path / "o"))
    assert isinstance(result.exception, Stop), result.output
    assert seen == {"model": "minilm", "texts": ["I don't know.", "Vámonos al mar."]}


@pytest.mark.slow
@pytest.mark.skipif(not UD_DEV.exists(), reason=f"shared UD EWT data not found at {UD_DEV}")
def test_ud_ewt_50_sentences(minilm):
    from probe.runs.analysis import analyze

    texts = read_corpus(UD_DEV, limit=50)
    assert len(texts) == 50 and all(t.strip() for t in texts)
    result = analyze(minilm, texts, batch_size=16, n_examples=2)
    heads = result.heads
    assert len(heads) == 72
    assert result.counts["sequences"] == 50 and result.counts["batches"] == 4
    assert result.counts["tokens"] == sum(len(minilm.tokenizer(t)["input_ids"]) for t in texts)
    assert not heads[list(STATISTICS)].isna().any().any()
    for name in ("self", "prev", "next", "first", "sep", "punct", "norm_entropy", "long", "max_weight"):
        assert heads[name].between(-1e-6, 1 + 1e-6).all(), name
    assert (heads["entropy"] >= 0).all() and (heads["distance"] >= 0).all()
    assert set(heads["label"]) <= {"previous-token", "next-token", "self", "first-token", "sep",
                                   "punctuation", "broad", "long-range", "mixed"}
    # BERT-like encoders have specialised heads: not every head is mixed (Clark et al. 2019)
    assert (heads["label"] != "mixed").sum() >= 5
    assert [ex.probs.shape[:2] for ex in result.examples] == [(6, 12)] * 2


@pytest.mark.slow
def test_long_and_non_latin_examples_stay_readable(tmp_path):
    """A truncated example is drawn on its first 64 tokens and marked truncated; glyphs missing
    from the plotting font produce no warning flood; the transformers over-length warning is gone."""
    out = tmp_path / "run"
    long_text = " ".join(["word"] * 900)
    result = run("analyze", "--text", long_text, "--text", "日本語のテキスト 🙂 and some English.",
                 "--out", str(out), "--no-progress")
    assert result.exit_code == 0, result.output
    assert "Glyph" not in result.stderr and "Token indices sequence length" not in result.stderr
    rec = json.loads((out / "run.json").read_text())
    assert rec["counts"]["truncated"] == 1
    html = (out / "index.html").read_text()
    assert "first 64 of 512 tokens" in html
    assert re.search(r"Example 1 \(512 tokens, truncated\): word word .* \[\.\.\.\]</blockquote>", html)


@pytest.mark.slow
def test_summary_times_add_up_to_the_wall_time(tmp_path):
    """The summary line's phases add up to its total, and the total is the wall time the user
    waited (the process is timed from its start; nothing slow happens after the last line)."""
    import time

    out = tmp_path / "run"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "probe", "analyze", "--text", "The cat sat on the mat.",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    m = re.search(r" in ([\d.]+) s \((.*)\)\n", proc.stdout)
    assert m, proc.stdout
    total = float(m.group(1))
    parts = dict((name.strip(), float(v)) for name, v in re.findall(r"([a-z -]+) ([\d.]+) s", m.group(2)))
    assert set(parts) == {"start-up", "model load", "analysis", "rollout", "report", "other"}
    assert sum(parts.values()) == pytest.approx(total, abs=1e-9)  # what the user reads adds up
    assert wall - 0.5 <= total <= wall + 0.05  # the line writes the total to 0.1 s: rounding may pass the wall
    t = json.loads((out / "run.json").read_text())["timings_s"]
    phases = ("startup_s", "input_s", "model_load_s", "analyze_s", "rollout_s", "report_s", "other_s")
    assert sum(t[k] for k in phases) == pytest.approx(t["total_s"], abs=1e-3)
    assert t["total_s"] == pytest.approx(total, abs=0.051)


@pytest.mark.slow
def test_tiny_corpus_gets_a_note(minilm):
    from probe.runs.analysis import MIN_TOKENS, analyze

    res = analyze(minilm, ["Hi."], n_examples=0)
    assert res.counts["tokens"] == 4 < MIN_TOKENS  # [CLS] hi . [SEP]
    assert any("labels are unreliable" in n for n in res.notes)
    big = analyze(minilm, [" ".join(["word"] * MIN_TOKENS)], n_examples=0)
    assert not any("labels are unreliable" in n for n in big.notes)


def test_out_below_a_file_fails_before_the_analysis(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("keep me\n")
    result = run("analyze", "--text", "The cat sat.", "--out", str(blocker / "run"))
    assert result.exit_code == 1
    assert result.output.strip().startswith("Error: cannot create output folder") and "is a file" in result.output
    assert "Analyzing" not in result.output  # no model was loaded
    assert blocker.read_text() == "keep me\n"


# --------------------------------------------------------------------------- --coref and --syntax

TREES = conllu("didnt") + conllu("dogs")


@pytest.fixture(scope="module")
def tiny_bert_folder(tmp_path_factory):
    from conftest import save_tiny

    return save_tiny("bert", tmp_path_factory.mktemp("tiny") / "bert")


def test_coref_and_syntax_write_their_files(tiny_bert_folder, tmp_path):
    from probe.linguistic import coref_heads, syntax_heads
    from probe.loading.models import load_model

    conllu = tmp_path / "three.conllu"
    conllu.write_text(TREES)
    out = tmp_path / "run"
    result = run("analyze", "--model", str(tiny_bert_folder), "--coref", "--syntax", str(conllu), "--out", str(out),
                 "--no-progress")
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "(coreference: built-in probe set, 67 examples; syntax: " in result.stderr
    assert "coreference: 67 of 67 examples scored; best head" in result.stdout
    assert "syntax: 3 of 3 sentences aligned; 9 dependencies;" in result.stdout
    assert {"coref.csv", "syntax.csv"} <= {p.name for p in out.iterdir()}
    lm = load_model(str(tiny_bert_folder))
    coref_csv = pd.read_csv(out / "coref.csv")
    api = coref_heads(lm)
    assert coref_csv["kind"].tolist() == api.table["kind"].tolist()
    np.testing.assert_allclose(coref_csv["accuracy"], api.table["accuracy"], rtol=1e-5)
    syntax_csv = pd.read_csv(out / "syntax.csv")
    assert list(syntax_csv.columns) == ["relation", "direction", "kind", "layer", "head", "offset", "n", "accuracy",
                                        "ci_low", "ci_high"]
    assert set(syntax_csv["relation"]) == {"all"}  # no relation reaches 100 dependencies in three sentences
    np.testing.assert_allclose(syntax_csv["accuracy"], syntax_heads(lm, conllu).table["accuracy"], rtol=1e-5)
    record = json.loads((out / "run.json").read_text())
    assert record["coreference"]["counts"]["scored"] == 67 and record["syntax"]["counts"]["sentences"] == 3
    heads = pd.read_csv(out / "heads.csv")
    np.testing.assert_allclose(heads["coref_accuracy"], api.heads["accuracy"], rtol=1e-5)
    assert record["settings"]["input"].startswith("coreference: built-in probe set")


@pytest.mark.parametrize("option, limit, expected", [("--corpus", None, 7), ("--corpus", "5", 5),
                                                      ("--corpus", "9", 7), ("--pairs", "2", 2)])
def test_start_line_counts_a_files_sequences(tiny_bert_folder, tmp_path, option, limit, expected):
    """--corpus and --pairs are streamed: the start line still says how many sequences (at most --limit)
    and from which file, before the analysis starts."""
    path = tmp_path / ("c.tsv" if option == "--pairs" else "c.conllu")
    if option == "--pairs":
        path.write_text("".join(f"Sentence {i}.\tAnother {i}.\n" for i in range(7)), encoding="utf-8")
    else:
        path.write_text("".join(f"# text = Sentence number {i}.\n1\tx\t_\t_\t_\t_\t0\troot\t_\t_\n\n"
                                for i in range(7)), encoding="utf-8")
    args = ["analyze", "--model", str(tiny_bert_folder), option, str(path), "--out", str(tmp_path / "run"),
            "--no-progress", "--no-distance", "--no-rollout"] + (["--limit", limit] if limit else [])
    result = run(*args)
    assert result.exit_code == 0, result.output
    first = result.stderr.splitlines()[0]
    assert first == (f"Analyzing {expected} sequence{'s' if expected > 1 else ''} from {path} with "
                     f"{tiny_bert_folder}: 2 layers x 4 heads"), first
    assert json.loads((tmp_path / "run" / "run.json").read_text())["counts"]["sequences"] == expected


def test_coref_value_builtin_and_limit(tiny_bert_folder, tmp_path):
    result = run("analyze", "--model", str(tiny_bert_folder), "--coref", "builtin", "--limit", "5",
                 "--out", str(tmp_path / "run"), "--no-progress")
    assert result.exit_code == 0, result.output
    assert "coreference: 5 of 5 examples scored" in result.stdout
    assert not (tmp_path / "run" / "syntax.csv").exists()


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p / "missing.tsv", "GAP file not found"),
    (lambda p: (p / "cols.tsv", (p / "cols.tsv").write_text("ID\tText\n1\tx\n"))[0], "missing column(s) Pronoun"),
    (lambda p: (p / "head.tsv", (p / "head.tsv").write_text(
        "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\n"))[0], "has no examples"),
])
def test_bad_coref_file_is_one_error_before_loading(tmp_path, make, fragment):
    path = make(tmp_path)
    result = run("analyze", "--coref", str(path), "--out", str(tmp_path / "run"))
    assert result.exit_code == 1
    assert_clean_error(result, fragment, str(path))
    assert "Analyzing" not in result.output and not (tmp_path / "run").exists()


@pytest.mark.parametrize("content, fragment", [
    ("", "no CoNLL-U sentence"),
    ("1\tI\n\n", "no HEAD/DEPREL column"),
    ("# text = Hello world\n1\tHello\t_\t_\t_\t_\t0\troot\t_\t_\n2\tthere\t_\t_\t_\t_\t1\tdep\t_\t_\n\n",
     "no sentence whose words could be found"),
])
def test_bad_syntax_file_is_one_error_before_loading(tmp_path, content, fragment):
    path = tmp_path / "bad.conllu"
    path.write_text(content)
    result = run("analyze", "--syntax", str(path), "--out", str(tmp_path / "run"))
    assert result.exit_code == 1
    assert_clean_error(result, fragment)
    assert "Analyzing" not in result.output


def test_annotated_text_is_the_corpus(tmp_path):
    result = run("analyze", "--coref", "--text", "Some text.", "--out", str(tmp_path / "run"))
    assert result.exit_code == 2  # a usage error
    assert_clean_error(result, "--coref and --syntax analyse their own annotated text")
    missing = run("analyze", "--syntax", str(tmp_path / "nope.conllu"), "--out", str(tmp_path / "run"))
    assert_clean_error(missing, "CoNLL-U file not found")


# --------------------------------------------------------------------------- pattern analyses (probe.patterns)

@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    from conftest import save_tiny

    root = tmp_path_factory.mktemp("tiny")
    return {kind: save_tiny(kind, root / kind) for kind in ("llama", "bert")}


def test_decoder_run_has_the_circuit_probe_and_its_time(tiny_folders, tmp_path):
    out = tmp_path / "run"
    result = run("analyze", "--model", str(tiny_folders["llama"]), "--text", "The cat sat on the mat.",
                 "--text", "It slept.", "--out", str(out), "--threshold", "induction=0.3")
    assert result.exit_code == 0, result.output
    assert re.search(r"\(start-up [\d.]+ s, model load [\d.]+ s, circuit probe [\d.]+ s, analysis", result.stdout)
    rec = json.loads((out / "run.json").read_text())
    assert rec["circuits"]["settings"]["n"] == 25 and rec["circuits"]["settings"]["sink_source"] == "corpus"
    assert rec["thresholds"]["induction"] == {"statistic": "induction", "threshold": 0.3}
    assert rec["timings_s"]["circuits_s"] > 0
    with open(out / "heads.csv", newline="", encoding="utf-8") as fh:
        columns = list(next(csv.DictReader(fh)))
    assert {"induction", "duplicate", "prev_random", "group", "pattern"} <= set(columns)


def test_no_distance_no_circuits(tiny_folders, tmp_path):
    out = tmp_path / "run"
    result = run("analyze", "--model", str(tiny_folders["llama"]), "--text", "The cat sat on the mat.",
                 "--out", str(out), "--no-distance", "--no-circuits")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        ".probe-files.json", "examples.npz", "heads.csv", "index.html", "run.json"]
    rec = json.loads((out / "run.json").read_text())
    assert "circuits" not in rec and "groups" not in rec and "health" in rec and "pattern-types" in rec
    with open(out / "heads.csv", newline="", encoding="utf-8") as fh:
        columns = list(next(csv.DictReader(fh)))
    assert "cluster" in columns and "group" not in columns and "induction" not in columns


def test_pairs_file(tiny_folders, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("Is it raining?\tNo, it is sunny.\n\nWho called?\tNobody did.\n", encoding="utf-8")
    out = tmp_path / "run"
    result = run("analyze", "--model", str(tiny_folders["bert"]), "--pairs", str(pairs), "--out", str(out),
                 "--map-sequences", "1")
    assert result.exit_code == 0, result.output
    rec = json.loads((out / "run.json").read_text())
    assert rec["pattern-types"]["pairs"] == 2 and rec["counts"]["sequences"] == 2
    assert rec["groups"]["map_sequences"] == 1 and rec["groups"]["map_sequences_seen"] == 1
    bad = tmp_path / "bad.tsv"
    bad.write_text("One\ttwo\nno tab here\n", encoding="utf-8")
    bert = ("--model", str(tiny_folders["bert"]))
    assert_clean_error(run("analyze", *bert, "--pairs", str(bad), "--out", str(tmp_path / "x")),
                       str(bad), "line 2", "tab")
    assert_clean_error(run("analyze", *bert, "--pairs", str(pairs), "--text", "x", "--out", str(tmp_path / "y")),
                       "either")


def test_streamed_corpus_and_pairs_feed_every_analysis(tiny_folders, tmp_path):
    """--corpus and --pairs are streamed: the circuit probe's sink texts are the corpus's first 16
    and the analysis still sees every sequence (up to --limit)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Sentence {i} is about the cat.\n" for i in range(20)), encoding="utf-8")
    out = tmp_path / "run"
    result = run("analyze", "--model", str(tiny_folders["llama"]), "--corpus", str(corpus), "--out", str(out),
                 "--no-progress")
    assert result.exit_code == 0, result.output
    rec = json.loads((out / "run.json").read_text())
    assert rec["counts"]["sequences"] == 20 and rec["groups"]["map_sequences_seen"] == 20
    assert rec["circuits"]["settings"]["sink_source"] == "corpus" and rec["circuits"]["settings"]["sink_texts"] == 16
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"Question {i}?\tAnswer {i}.\n" for i in range(9)), encoding="utf-8")
    out = tmp_path / "pairs-run"
    result = run("analyze", "--model", str(tiny_folders["bert"]), "--pairs", str(pairs), "--limit", "7",
                 "--out", str(out), "--no-progress")
    assert result.exit_code == 0, result.output
    rec = json.loads((out / "run.json").read_text())
    assert rec["counts"]["sequences"] == 7 and rec["pattern-types"]["pairs"] == 7


@pytest.mark.parametrize("args", [["--health-threshold", "saturated=2"], ["--health-threshold", "padding=0.1"],
                                  ["--health-threshold", "bogus=0.5"], ["--health-threshold", "uniform"],
                                  ["--map-sequences", "0"], ["--threshold", "induction=0"]])
def test_pattern_usage_errors(args, out):
    result = run("analyze", "--text", "Fine.", "--out", str(out), *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_circuit_probe_longer_than_the_model_limit_is_skipped_with_a_note(tmp_path):
    from conftest import save_tiny

    folder = save_tiny("llama", tmp_path / "short", max_positions=32)  # the probe needs 2 x 25 tokens
    out = tmp_path / "run"
    result = run("analyze", "--model", str(folder), "--text", "The cat sat.", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "note: decoder circuit probe skipped: the probe needs 50 tokens; the model takes 32" in result.stderr
    assert "circuits" not in json.loads((out / "run.json").read_text())


@pytest.mark.parametrize("args, message", [
    (["analyze", "--text", "a", "--corpus", "x.txt"], "give either --text, --corpus or --pairs, not two of them"),
    (["analyze", "--coref", "--text", "a"], "--coref and --syntax analyse their own annotated text"),
    (["analyze", "--syntax", "x.conllu", "--corpus", "x.txt"], "--coref and --syntax analyse their own"),
    (["analyze", "--pairs", "x.tsv", "--generate", "3"], "give either --pairs (sources and targets) or --generate"),
    (["effects", "--ablation", "bogus"], "unknown ablation 'bogus'; choose from zero, mean, resample"),
    (["effects", "--corpus", "x.txt", "--pairs", "x.tsv"], "give either --corpus or --pairs, not both"),
    (["verify", "--mutant", "nope"], "--mutant must be one of alibi-sign, c2p-sign"),  # the settings' message
    (["why", "--head", "L1H0", "--text", "  "], "--text is empty"),  # before the model loads, not after
])
def test_usage_errors_exit_with_status_2(tmp_path, args, message):
    """Issue 27 item 13: options that do not go together are usage errors (status 2, as docs/usage.md says),
    refused before a model loads or a folder is claimed."""
    result = run(*args, *([] if args[0] == "verify" else ["--out", str(tmp_path / "run")]))
    assert result.exit_code == 2
    line = assert_clean_error(result, message)
    assert line.endswith(f"{args[0]} --help')")
    assert not (tmp_path / "run").exists()


def test_the_report_line_gives_the_folder_as_an_absolute_path(tmp_path, monkeypatch, tiny_bert_folder):
    """A run into a relative folder says where its page is from anywhere: the folder made absolute."""
    monkeypatch.chdir(tmp_path)
    result = run("analyze", "--model", str(tiny_bert_folder), "--text", "The cat sat on the mat.", "--out", "rel/run",
                 "--no-progress")
    assert result.exit_code == 0, result.output
    page = tmp_path / "rel" / "run" / "index.html"
    assert f"Report: {page}" in result.stdout.splitlines() and page.is_file()


def test_a_long_value_is_echoed_cut_in_every_error_line(tmp_path):
    """An 80,000-character ``--head`` was echoed whole in its one error line. Every error line (usage errors,
    the library's errors, click's own) keeps the first characters of a long value and says how long it was."""
    from conftest import invoke_cli, one_error
    from probe.errors import ECHO_KEPT, InputError, cut_long

    long = "L" * 80_000
    line = one_error(invoke_cli("why", "--model", tmp_path / "none", "--text", "a b", "--head", long), 2,
                     "is not a head of the form L5H1", "[80,002 characters]")  # the value with its quotes
    assert len(line) < 400 and "'" + "L" * (ECHO_KEPT - 1) + "... [80,002 characters]" in line
    line = one_error(invoke_cli("analyze", "--model", "m" * 5000, "--text", "a b", "--out", tmp_path / "run"), 1,
                     "no model is named", "[5,002 characters] (longer than")  # no traceback from the file system
    assert len(line) < 1000
    line = one_error(invoke_cli("analyze", "--dtype", "x" * 9000), 2, "[9,00")  # click's own message
    assert len(line) < 1000
    # in the library: the exception's text, and a message of many short words keeps its start and its end
    assert str(InputError(f"head {long!r} out of range")).endswith("[80,002 characters] out of range")
    words = " ".join(f"w{i}" for i in range(3000))
    cut = cut_long(words)
    assert len(cut) <= 2100 and cut.startswith("w0 w1 ") and cut.endswith("w2998 w2999")
    assert cut_long("a path /tmp/" + "x" * 250 + " stays") == "a path /tmp/" + "x" * 250 + " stays"



def test_the_command_list_never_cuts_a_line_inside_parentheses():
    """``probe --help`` lists each command with its first sentence, shortened with "..." where long; a
    sentence ending at an abbreviation's full stop was cut inside its parenthesis ("path  Path patching
    (Wang et al."): each line's parentheses close, or it ends with "..."."""
    result = run("--help")
    assert result.exit_code == 0, result.output
    listing = result.output.split("Commands:\n", 1)[1]
    lines = {}
    for line in listing.splitlines():
        name, _, text = line.strip().partition(" ")
        lines[name] = text.strip()
    assert set(lines) >= {"analyze", "path", "patch", "why", "live"}, lines
    for name, text in lines.items():
        assert text.count("(") == text.count(")") or text.endswith("..."), (name, text)
    assert lines["path"].startswith("Path patching of sender heads into receivers")
