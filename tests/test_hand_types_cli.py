"""GPT-Neo and MPNet, whose transformers attention never calls the attention interface, through their hand
specs end to end on the command line: verify at 0.0, analyze, effects and patch write their run folders."""

from __future__ import annotations

import csv
import json
import re

import pytest
import torch
import transformers

from conftest import invoke_cli, make_tokenizer, save_tiny, tiny_config

DECODER_PAIRS = ("clean\tcorrupted\tanswer\twrong\n"
                 "The cat and the dog ran to\tThe dog and the cat ran to\t the\t a\n")
MLM_PAIRS = ("clean\tcorrupted\tanswer\twrong\n"
             "the capital of france is [MASK] .\tthe river of england was [MASK] .\tparis\tlondon\n")


@pytest.fixture(scope="module", params=["gpt_neo", "mpnet"])
def folder(request, tmp_path_factory):
    """A saved tiny model: GPT-Neo's causal LM, MPNet with its masked-LM head (what patching an encoder reads)."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "gpt_neo":
        return request.param, save_tiny("gpt_neo", root / "model")
    tok = make_tokenizer("wordpiece")
    torch.manual_seed(0)
    transformers.MPNetForMaskedLM(tiny_config("mpnet", len(tok))).eval().save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return request.param, root / "model"


def test_verify_passes_at_zero(folder):
    kind, model = folder
    result = invoke_cli("verify", "--model", model, "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["passed"] is True and record["max_abs_diff"] == 0.0
    names = [c["name"] for c in record["cases"]]
    assert ("kv-cache" in names) == (kind == "gpt_neo") and "max-length" in names


def test_analyze_effects_and_patch_write_their_runs(folder, tmp_path):
    kind, model = folder
    result = invoke_cli("analyze", "--model", model, "--out", tmp_path / "a", "-n", "6", "--no-progress")
    assert result.exit_code == 0, result.output
    heads = list(csv.DictReader((tmp_path / "a" / "heads.csv").open()))
    assert [(int(r["layer"]), int(r["head"])) for r in heads] == [(i, h) for i in range(2) for h in range(4)]
    result = invoke_cli("effects", "--model", model, "--out", tmp_path / "e", "-n", "6", "--ablation", "zero",
                        "--seeds", "5", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "Report:" in result.output and (tmp_path / "e" / "index.html").exists()
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(DECODER_PAIRS if kind == "gpt_neo" else MLM_PAIRS, encoding="utf-8")
    result = invoke_cli("patch", "--model", model, "--pairs", pairs, "--out", tmp_path / "p", "--no-progress")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((tmp_path / "p" / "patch.csv").open()))
    assert len(rows) == 8 and all(re.fullmatch(r"-?[0-9.e+-]+|nan", r["effect"]) for r in rows)
