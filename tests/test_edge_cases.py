"""Edge cases found in review: each test pins the right behaviour of one fixed bug."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from conftest import tiny_model
from probe.analysis import analyze
from probe.capture import attention_hooks, capture_attention
from probe.cli import main
from probe.errors import InputError, ProbeError
from probe.reference import MaskError, attention
from probe.report import plots, write_run
from probe.stats import TokenClassifier, is_punctuation
from probe.verify import verify


def test_gguf_cache_is_float32_whatever_dtype_came_first(tmp_path, monkeypatch):
    """A bfloat16 first load must not leave bf16-rounded weights for later float32 loads."""
    from probe.models import load_model

    monkeypatch.setenv("PROBE_CACHE", str(tmp_path))
    bf16 = load_model("smollm2", dtype=torch.bfloat16)
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    from probe.models import dequantized_cache

    folder = dequantized_cache("smollm2")
    assert folder.parent == tmp_path
    assert json.loads((folder / "config.json").read_text()).get("dtype", "float32") == "float32"
    with safe_open(str(next(folder.glob("*.safetensors"))), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in list(f.keys())[:20]} == {"F32"}
    fp32 = load_model("smollm2")  # from the cache
    assert next(fp32.model.parameters()).dtype == torch.float32
    w = fp32.model.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(w, w.to(torch.bfloat16).float())  # full float32 precision, not bf16 values


@pytest.mark.parametrize("tokens", [["It", "costs", "$$", "to", "fix"], ["$x^$", "$\\frac$", "a"]])
def test_dollar_tokens_do_not_break_the_heatmap(tokens):
    a = np.full((len(tokens), len(tokens)), 1.0 / len(tokens))
    assert plots.attention_heatmap(a, tokens, "t").startswith("data:image/png;base64,")


def test_analyze_takes_one_string_as_one_text(minilm):
    res = analyze(minilm, "Hello there, world.", n_examples=1)
    assert res.counts["sequences"] == 1
    assert res.examples[0].text == "Hello there, world."


def test_capture_restores_the_attention_implementation():
    lm = tiny_model("gpt2", attn_implementation="sdpa")
    assert lm.model.config._attn_implementation == "eager"  # from_pretrained_objects switched it
    lm.model.set_attn_implementation("sdpa")
    captured = capture_attention(lm, "The cat sat on the mat.")
    assert len(captured.attentions) == lm.geometry.n_layers
    assert any("restored afterwards" in n for n in captured.notes)
    assert lm.model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError):
        with attention_hooks(lm, lambda layer, probs: None):
            raise RuntimeError("boom")
    assert lm.model.config._attn_implementation == "sdpa"


def test_verify_with_no_case_is_an_error_and_one_name_is_accepted():
    lm = tiny_model("bert")
    with pytest.raises(ProbeError, match="no verification case"):
        verify(lm, cases=[])
    res = verify(lm, cases="sentence")
    assert [c.name for c in res.cases] == ["sentence"] and res.passed


def test_hash_marks_are_punctuation_outside_wordpiece(smollm2, minilm):
    assert is_punctuation("##", None) and is_punctuation("###", None)
    assert not is_punctuation("##", "##")  # WordPiece: the bare continuation marker is no text
    assert is_punctuation("##,", "##")
    bpe = TokenClassifier(smollm2.tokenizer)
    assert bpe.continuation_prefix is None
    for piece in ("##", "Ġ##", "Ġ###"):
        token_id = smollm2.tokenizer.convert_tokens_to_ids(piece)
        assert token_id != smollm2.tokenizer.unk_token_id, piece
        assert bpe.is_punct(token_id), piece
    wp = TokenClassifier(minilm.tokenizer)
    assert wp.continuation_prefix == "##"
    assert wp.is_punct(minilm.tokenizer.convert_tokens_to_ids(","))
    assert not wp.is_punct(minilm.tokenizer.convert_tokens_to_ids("##s"))


def test_left_padding_tokenizer_gives_the_same_statistics(minilm):
    texts = ["A short one.", "A somewhat longer sentence, with a comma, follows here."]
    right = analyze(minilm, texts, batch_size=2).heads
    minilm.tokenizer.padding_side = "left"
    try:
        left = analyze(minilm, texts, batch_size=2).heads
        enc = capture_attention(minilm, texts).encoded
        assert enc.tokens(minilm.tokenizer, 0)[0] == "[CLS]"
    finally:
        minilm.tokenizer.padding_side = "right"
    num = right.select_dtypes("number").columns
    np.testing.assert_allclose(left[num].to_numpy(), right[num].to_numpy(), atol=1e-7, equal_nan=True)


def test_out_below_a_file_fails_before_the_analysis(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("keep me\n")
    result = CliRunner().invoke(main, ["analyze", "--text", "The cat sat.", "--out", str(blocker / "run")])
    assert result.exit_code == 1
    assert result.output.strip().startswith("Error: cannot create output folder") and "is a file" in result.output
    assert "Analyzing" not in result.output  # no model was loaded
    assert blocker.read_text() == "keep me\n"


def test_report_with_an_infinite_verification_difference(minilm, tmp_path):
    res = analyze(minilm, ["The cat sat on the mat."], n_examples=1)
    record = {"model": "minilm", "passed": False, "max_abs_diff": "inf", "per_layer": [], "cases": []}
    path = write_run(res, minilm.tokenizer, tmp_path / "run", verification=record)
    assert "max absolute difference inf" in (path / "index.html").read_text()


def test_mask_with_the_wrong_head_count_is_a_mask_error():
    q = k = v = torch.randn(2, 4, 5, 8)
    with pytest.raises(MaskError, match="does not fit"):
        attention(q, k, v, mask=torch.ones(2, 3, 5, 5, dtype=torch.bool))
    out, probs = attention(q, k, v, mask=torch.ones(2, 1, 5, 5, dtype=torch.bool))
    assert torch.allclose(probs.sum(-1), torch.ones(2, 4, 5))


def test_thresholds_are_checked_before_the_forward_pass(minilm, monkeypatch):
    calls = []
    monkeypatch.setattr(minilm.model, "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(InputError, match="must be in"):
        analyze(minilm, ["Hi there."], thresholds={"self": 2.0})
    with pytest.raises(InputError, match="unknown label"):
        analyze(minilm, ["Hi there."], thresholds={"induction": 0.5})
    assert calls == []
    monkeypatch.undo()
    res = analyze(minilm, ["Hi there, you."], thresholds={"self": np.float32(0.25)})
    assert res.thresholds["self"] == 0.25


@pytest.mark.parametrize("max_length", [1, 0, -3])
def test_capture_rejects_max_length_below_two(minilm, max_length):
    with pytest.raises(InputError, match="at least 2"):
        capture_attention(minilm, "The cat sat.", max_length=max_length)


def test_unknown_word_only_text_is_analysed(minilm):
    res = analyze(minilm, ["\U0001F600", "A normal sentence here."], n_examples=1)
    assert res.counts["tokens"] == 3 + 7  # [CLS] [UNK] [SEP] + [CLS] a normal sentence here . [SEP]
    assert res.examples[0].tokens == ["[CLS]", "[UNK]", "[SEP]"] and not res.examples[0].truncated
    assert math.isfinite(res.heads["self"].sum())
