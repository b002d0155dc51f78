"""What measuring changes comes back exactly as it was (probe.capture.hooks.measuring, ModelState).

The field case : a model in train mode with one block put back in eval mode
(``model.train(); model.encoder.layer[0].eval()``). A tool that saved only the top-level flag and
called ``model.train(True)`` on exit put every sub-module in train mode: the block the user had
switched off came back with dropout on. Every entry point (capture, verify, analyze, show, the
circuit probe) must leave each module's own ``training`` flag, each parameter's ``requires_grad``
and the attention implementation of every config as they were.
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from probe import capture_attention, verify
from probe.capture.hooks import measuring
from probe.entries.notebook import show
from probe.runs.analysis import analyze

TEXT = "The cat sat on the mat because it was warm."


def first_block(lm):
    return lm.model.encoder.layer[0] if lm.model_type == "bert" else lm.model.transformer.h[0]


def state(model) -> dict:
    return {"training": {n: m.training for n, m in model.named_modules()},
            "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
            "attn": model.config._attn_implementation}


def mixed_modes(kind: str, attn: str = "eager"):
    lm = tiny_model(kind, attn_implementation=attn)
    lm.model.train()
    first_block(lm).eval()
    next(lm.model.parameters()).requires_grad_(False)
    return lm


def entry_points(kind: str):
    from probe.patterns import circuit_probe

    calls = {"capture": lambda lm: capture_attention(lm, TEXT),
             "verify": lambda lm: verify(lm, cases=["sentence", "right-padded"]),
             "analyze": lambda lm: analyze(lm, [TEXT, "Short one."], n_examples=1),
             "show": lambda lm: show(lm, TEXT)}
    if kind == "gpt2":
        calls["circuit probe"] = lambda lm: circuit_probe(lm, n=5, batch_size=2)
    return calls


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_every_entry_point_restores_each_modules_own_flag(kind):
    lm = mixed_modes(kind)
    before = state(lm.model)
    in_eval = [n for n, flag in before["training"].items() if not flag]
    assert len(in_eval) >= 10 and before["training"][""] is True  # a block and its sub-modules, the rest training
    for name, call in entry_points(kind).items():
        call(lm)
        assert state(lm.model) == before, name


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_measured_in_eval_mode_and_told(kind):
    """Inside, every module is in eval mode (no dropout), and the note says it was restored."""
    lm = mixed_modes(kind)
    with measuring(lm.model) as m:
        assert not any(mod.training for mod in lm.model.modules())
    assert any("train mode" in n and "restored" in n for n in m.notes)
    assert state(lm.model)["training"][""] is True


def test_only_a_submodule_in_train_mode_is_measured_in_eval_mode():
    """The top-level flag is not the only one: a model in eval mode with one training block."""
    lm = tiny_model("bert")
    first_block(lm).train()
    before = state(lm.model)
    got = capture_attention(lm, TEXT)
    assert any("train mode" in n for n in got.notes)
    assert state(lm.model) == before


def test_attention_implementation_and_flags_come_back_after_an_error():
    lm = mixed_modes("gpt2")
    lm.model.set_attn_implementation("sdpa")  # a user's choice after loading (probe loads eager)
    before = state(lm.model)
    assert before["attn"] == "sdpa"
    with pytest.raises(RuntimeError, match="inside"), measuring(lm.model):
        assert lm.model.config._attn_implementation == "probe"  # GPT-2's modules call the interface
        raise RuntimeError("inside")
    assert state(lm.model) == before
    capture_attention(lm, TEXT)
    assert state(lm.model) == before


def test_requires_grad_changed_inside_comes_back():
    lm = tiny_model("bert")
    before = state(lm.model)
    with measuring(lm.model, implementation="eager"):  # transformers allows output_attentions under eager only
        for p in lm.model.parameters():
            p.requires_grad_(False)
        lm.model.config.output_attentions = True
    assert state(lm.model) == before
    assert lm.model.config.output_attentions is False
    assert torch.is_grad_enabled()
