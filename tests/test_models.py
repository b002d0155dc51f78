"""Loading: embedded models, the dequantized GGUF cache, folders, wrapping built models."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import probe.loading.models as pm
from conftest import notes, save_tiny, tiny_model
from probe.errors import ModelLoadError, UnsupportedArchitectureError


@pytest.mark.slow
def test_gguf_cache_is_float32_whatever_dtype_came_first(tmp_path, monkeypatch, caplog):
    """A bfloat16 first load must not leave bf16-rounded weights for later float32 loads; the
    first load says it is a one-time de-quantizing step."""
    monkeypatch.setenv("PROBE_CACHE", str(tmp_path))
    with notes(caplog, "probe.loading.models"):
        bf16 = pm.load_model("smollm2", dtype=torch.bfloat16)
    assert any("one-time step" in r.getMessage() and str(tmp_path) in r.getMessage() for r in caplog.records)
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    folder = pm.dequantized_cache("smollm2")
    assert folder.parent == tmp_path
    assert json.loads((folder / "config.json").read_text()).get("dtype", "float32") == "float32"
    with safe_open(str(next(folder.glob("*.safetensors"))), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in list(f.keys())[:20]} == {"F32"}
    caplog.clear()
    with notes(caplog, "probe.loading.models"):
        fp32 = pm.load_model("smollm2")  # from the cache, silently
    assert not any("one-time" in r.getMessage() for r in caplog.records)
    assert next(fp32.model.parameters()).dtype == torch.float32
    w = fp32.model.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(w, w.to(torch.bfloat16).float())  # full float32 precision, not bf16 values


@pytest.mark.parametrize("kind", ["gpt_neox", "phi3", "gemma", "gemma2", "gemma3", "qwen3", "electra"])
def test_new_architectures_load_from_a_folder(kind, tmp_path):
    folder = save_tiny(kind, tmp_path / kind)
    lm = pm.load_model(str(folder))
    assert lm.source == str(folder) and lm.model.config._attn_implementation == "eager"
    assert [s.layer for s in lm.sites] == [0, 1]
    assert lm.kind == ("encoder" if kind == "electra" else "decoder")


def test_wrapping_switches_to_eager_and_right_padding():
    model, tok = tiny_model("llama", attn_implementation="sdpa", wrap=False)
    tok.padding_side = "left"
    lm = pm.from_pretrained_objects(model, tok)
    assert model.config._attn_implementation == "eager" and tok.padding_side == "right"
    assert lm.notes and "sdpa" in lm.notes[0]


def test_max_length_counts_position_offsets():
    assert tiny_model("roberta").max_length == 65  # 66 positions, numbered from pad_token_id + 1
    assert tiny_model("bert").max_length == 64
    assert tiny_model("gpt2", max_positions=32).max_length == 32


def test_unsupported_configuration_is_one_clear_error(tmp_path):
    model, tok = tiny_model("bert", wrap=False)
    model.config.is_decoder = True
    with pytest.raises(UnsupportedArchitectureError, match="is_decoder=True"):
        pm.from_pretrained_objects(model, tok)
    with pytest.raises(ModelLoadError, match="no model given"):
        pm.load_model("  ")
