"""The test tiers hold (tests/README.md): a fast test cannot load an embedded model or start a
browser, and the tests' byte-level BPE tokenizer has what the tiny decoders need; tests are named and
described for what they check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import probe.loading.checkpoints as ploading
import probe.loading.models as pm
from conftest import SPECIAL_BPE, TierError, bpe_tokenizer, browser_or_skip, tolerance


def test_a_fast_test_cannot_load_an_embedded_model(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBE_CACHE", str(tmp_path))  # were the guard to fail, nothing is de-quantized here
    with pytest.raises(TierError, match="belongs in the slow tier"):
        pm.load_model("minilm")
    folder = pm.embedded_folder("minilm")
    if folder is not None:
        with pytest.raises(TierError, match="loads the embedded model in"):
            pm.load_model(str(folder))
    with pytest.raises(TierError, match="de-quantizes"):
        ploading.load_gguf(tmp_path, "model.gguf", None, None)
    with pytest.raises(TierError):
        pm.load_model("smollm2")
    assert list(tmp_path.iterdir()) == []


def test_a_test_outside_the_browser_tier_cannot_start_chromium():
    with pytest.raises(TierError, match="mark it @pytest.mark.browser"):
        browser_or_skip()


def test_tiers_are_registered_and_ordered(request):
    markers = request.config.getini("markers")
    assert any(m.startswith("slow:") for m in markers) and any(m.startswith("browser:") for m in markers)
    assert request.config.getoption("strict_markers")
    assert request.node.get_closest_marker("slow") is None


def test_bpe_tokenizer_is_byte_level_with_offsets_and_special_tokens():
    tok = bpe_tokenizer()
    assert len(tok) == 1000 and tok.sep_token is None
    assert [tok.unk_token, tok.bos_token, tok.eos_token, tok.pad_token] == [*SPECIAL_BPE, SPECIAL_BPE[2]]
    assert tok.convert_tokens_to_ids(list(SPECIAL_BPE)) == [0, 1, 2]
    enc = tok("The cat sat\non été", return_offsets_mapping=True)
    pieces = tok.convert_ids_to_tokens(enc["input_ids"])
    assert pieces[0] == "The" and pieces[1] == "Ġcat"  # no BOS added; a space is the byte piece Ġ
    assert "Ċ" in pieces  # a line end is the byte piece Ċ
    assert any("Ã" in p for p in pieces)  # é is two byte pieces' characters
    assert enc["offset_mapping"][1] == (3, 7)  # " cat": the offsets include the leading space
    assert tok.decode(enc["input_ids"]) == "The cat sat\non été"


def test_tolerance_rule():
    assert tolerance("probability") == {"atol": pytest.approx(64 * 1.1920929e-07), "rtol": 0.0}
    scaled = tolerance("scaled")
    assert scaled["rtol"] == pytest.approx(7.63e-6, rel=1e-3) and scaled["atol"] == scaled["rtol"]
    assert tolerance("scaled", torch.float64)["rtol"] == pytest.approx(64 * 2.220446e-16)
    with pytest.raises(ValueError, match="unknown kind"):
        tolerance("logits")


#: A failure-case number (two digits after F) that nothing in the repository defines.
CASE_NUMBER = re.compile(r"\bF[0-2][0-9]\b")


def test_tests_cite_no_case_number_only_what_they_check():
    """A test's name, docstring and comments say what fails and what it asserts, in words: a case
    number from a list outside the repository tells a reader nothing."""
    here = Path(__file__).parent
    cited = [f"{path.name}:{n}" for path in sorted(here.glob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if CASE_NUMBER.search(line)]
    assert cited == []
    assert CASE_NUMBER.search("a mask that overflows (F" + "06)") and not CASE_NUMBER.search("#E69F00, F.linear, F1")
