"""``probe patch`` on the command line: the run folder (patch.csv with every head, composition.csv, heads.csv
effect/dla columns, run.json's patching record, the report section with its heatmaps), the pair file's errors
as one line, encoders refused as one line; and the Python API's DataFrames."""

from __future__ import annotations

import csv
import json
import re

import pytest
from click.testing import CliRunner

import probe
from conftest import invoke_cli as run
from conftest import one_error, save_tiny, tiny_model
from probe.cli import main

GOOD = ("clean\tcorrupted\tanswer\twrong\n"
        "The cat and the dog ran to\tThe dog and the cat ran to\t the\t a\n"
        "When Mary and John went to the store, John gave a drink to\t"
        "When Mary and John went to the store, Mary gave a drink to\t Mary\t John\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("patch")
    model = save_tiny("llama", root / "model")
    pairs = root / "pairs.tsv"
    pairs.write_text(GOOD, encoding="utf-8")
    return root, model, pairs


def test_patch_writes_the_run_folder(setup):
    root, model, pairs = setup
    out = root / "run"
    result = run("patch", "--model", model, "--pairs", pairs, "--out", out, "--no-progress")
    assert result.exit_code == 0, result.output
    assert "largest effects (each the share of the clean - corrupted LD recovered; patch.csv): L" in result.output
    assert "Report:" in result.output
    stages = re.findall(r"^(activation patching|direct logit attribution|composition scores|labelling analysis): "
                        r"done in \d+\.\d s$", result.stderr, re.M)  # issue 27 item 11: no bars, a line a stage
    assert stages == ["activation patching", "direct logit attribution", "composition scores", "labelling analysis"]
    # the patched passes' time once the first passes are timed (issue 49 item 6): 2 passes, from blocks 0 and 1
    assert re.search(r"^estimate from the first passes \(\d+\.\d s; \d+\.\d\d s a block, \d+\.\d\d s a pass besides\): "
                     r"about \d+ s for 2 patched passes \(1\.5 whole passes' blocks\) on this machine as loaded now; "
                     r"then DLA, the composition scores, the labelling analysis$",
                     result.stderr, re.M), result.stderr
    rows = list(csv.DictReader((out / "patch.csv").open()))
    assert [(int(r["layer"]), int(r["head"])) for r in rows] == [(layer, h) for layer in range(2) for h in range(4)]
    assert set(rows[0]) == {"stack", "kind", "layer", "head", "effect", "effect_last", "raw", "raw_last"}
    assert rows[0]["stack"] == "decoder" and rows[0]["kind"] == "self"
    heads = list(csv.DictReader((out / "heads.csv").open()))
    assert {"effect", "effect_last", "dla", "induction", "label"} <= set(heads[0])
    assert float(heads[3]["effect"]) == pytest.approx(float(rows[3]["effect"]), rel=1e-5)
    comp = list(csv.DictReader((out / "composition.csv").open()))
    assert len(comp) == 4 * 4 and {"q", "k", "v"} <= set(comp[0])
    record = json.loads((out / "run.json").read_text())["patching"]
    assert record["pairs"] == 2 and record["normalized"] is True and record["dla"]["holds"] is True
    assert len(record["k_partners"]) == 3 * 4  # 3 writers for each of layer 1's 4 heads (no induction head)
    html = (out / "index.html").read_text()
    for fig in ("patch-all", "patch-last", "dla-heads"):
        assert f'data-fig="{fig}"' in html
    assert "K-composition partners" in html


def test_the_first_line_counts_the_pairs_in_words(setup, tmp_path):
    """One pair is "on 1 pair", two "on 2 pairs" (before: "on 1 pairs"), as probe circuit says it."""
    root, model, _ = setup
    for n in (1, 2):
        pairs = tmp_path / f"{n}.tsv"
        pairs.write_text("".join(GOOD.splitlines(keepends=True)[:n + 1]), encoding="utf-8")
        result = run("patch", "--model", model, "--pairs", pairs, "--out", tmp_path / f"run{n}", "--no-progress")
        assert result.exit_code == 0, result.output
        word = "pair" if n == 1 else "pairs"
        assert f"(8 heads) on {n} {word} ({pairs})" in result.output, result.output


@pytest.mark.parametrize("direction,min_gap,unit", [
    ("denoise", None, "each the share of the clean - corrupted LD recovered"),
    ("noise", None, "each the share of the clean - corrupted LD lost"),
    ("denoise", 1e9, "each the change of LD, in logits"),  # a gap too small to divide by: patch.csv holds LD changes
])
def test_the_first_line_says_what_the_effects_are(setup, tmp_path, monkeypatch, direction, min_gap, unit):
    root, model, pairs = setup
    if min_gap is not None:
        import probe.effects.patching as patching

        monkeypatch.setattr(patching, "MIN_GAP", min_gap)
    out = tmp_path / "run"
    result = run("patch", "--model", model, "--pairs", pairs, "--out", out, "--no-progress", "--direction", direction)
    assert result.exit_code == 0, result.output
    assert f"largest effects ({unit}; patch.csv): L" in result.output
    record = json.loads((out / "run.json").read_text())["patching"]
    assert record["direction"] == direction


@pytest.mark.parametrize("text,fragments", [
    ("a\tb\tc\n", ["line 1: 3 tab-separated fields"]),
    ("The cat ran to\tThe big dog ran quickly to\t the\t a\n", ["pair 1", "different token counts", "big dog"]),
    ("The cat ran to\tThe dog ran to\t she\t a\n", ["the answer ' she' is 2 tokens", "one token each"]),
])
def test_bad_pair_files_are_one_error_line(setup, tmp_path, text, fragments):
    root, model, _ = setup
    bad = tmp_path / "bad.tsv"
    bad.write_text(text, encoding="utf-8")
    one_error(run("patch", "--model", model, "--pairs", bad, "--out", tmp_path / "run"), 1, *fragments)
    assert not (tmp_path / "run").exists()


def test_an_encoder_without_its_masked_lm_head_is_refused_in_one_line(tmp_path):
    model = save_tiny("bert", tmp_path / "bert")  # a BertModel, as minilm is
    one_error(run("patch", "--model", model, "--out", tmp_path / "run"), 1, "BertModel without a masked-LM head")


def test_python_api_returns_dataframes():
    lm = tiny_model("gpt2")
    pairs = [probe.Pair("The cat and the dog ran to", "The dog and the cat ran to", " the", " a")]
    assert list(probe.patch_heads(lm, pairs).columns[:6]) == ["stack", "kind", "layer", "head", "effect",
                                                               "effect_last"]
    assert set(probe.direct_logit_attribution(lm, pairs)["component"]) == {"embed", "head", "b_O", "mlp",
                                                                            "norm_bias", "unembed_bias"}
    assert len(probe.composition_scores(lm)) == 16


def test_patch_json_prints_the_patching_record(setup):
    root, model, pairs = setup
    result = run("patch", "--model", model, "--pairs", pairs, "--out", root / "json", "--json", "--direction", "noise")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["direction"] == "noise" and record["pairs"] == 2 and len(record["top"]) == 8
    written = json.loads((root / "json" / "run.json").read_text())["patching"]
    assert record["ld_clean"] == written["ld_clean"]


def test_probe_patch_defaults_to_the_embedded_decoder():
    """``probe patch`` patches decoders: its --model default is the embedded decoder (smollm2), not
    the encoder the other commands default to (which it would refuse after loading)."""


    res = CliRunner().invoke(main, ["patch", "--help"])
    assert res.exit_code == 0 and "[default: smollm2]" in " ".join(res.output.split())  # click wraps help lines


def test_refusals_come_before_the_weights_load(tmp_path, monkeypatch):
    """Issue 27 item 10: 'probe patch' on an encoder without its masked-LM head and 'probe analyze
    --generate' on an encoder were refused only after the model had loaded (87-104 s), --generate after
    'Analyzing ...': both are decided from the config, and the weights never load."""
    import probe.loading.models as pm
    from conftest import invoke_cli, one_error, save_tiny

    bert = save_tiny("bert", tmp_path / "bert")
    assert pm.peek_config(str(bert)).architectures == ["BertModel"]
    assert pm.peek_config("some-org/some-hub-model") is None and pm.peek_config(str(tmp_path / "none")) is None

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(pm, "load_model", no_load)
    one_error(invoke_cli("patch", "--model", bert, "--out", tmp_path / "p"), 1,
              f"{bert} is a BertModel without a masked-LM head")
    result = invoke_cli("analyze", "--model", bert, "--generate", 5, "--out", tmp_path / "a")
    one_error(result, 1, f"--generate writes targets for encoder-decoder models (BART, Marian, T5); {bert} is not one")
    assert "Analyzing" not in result.output
    assert not (tmp_path / "p").exists() and not (tmp_path / "a").exists()


def test_pairs_the_tokenizer_refuses_are_refused_before_the_weights_load(tmp_path, monkeypatch):
    """Issue 27 item 10: unequal pair lengths and a multi-token answer waited for the model to load."""
    import probe.loading.models as pm
    from conftest import invoke_cli, one_error, save_tiny

    gpt2 = save_tiny("gpt2", tmp_path / "gpt2")
    lm = pm.load_model(str(gpt2))
    preview = pm.preview_model(str(gpt2))
    assert preview.model is None and preview.kind == lm.kind and preview.max_length == lm.max_length
    assert preview.geometry == lm.geometry

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(pm, "load_model", no_load)
    unequal = tmp_path / "unequal.tsv"
    unequal.write_text("the cat sat on the mat\tthe cat sat\t the\t a\n", encoding="utf-8")
    one_error(invoke_cli("patch", "--model", gpt2, "--pairs", unequal, "--out", tmp_path / "u"), 1,
              "pair 1: the clean and corrupted prompts have different token counts")
    long = tmp_path / "long.tsv"
    long.write_text("the cat sat\tthe dog sat\t unbelievably\t a\n", encoding="utf-8")
    answer = len(preview.tokenizer(" unbelievably", add_special_tokens=False)["input_ids"])
    assert answer > 1
    one_error(invoke_cli("patch", "--model", gpt2, "--pairs", long, "--out", tmp_path / "l"), 1,
              f"pair 1: the answer ' unbelievably' is {answer} tokens")
