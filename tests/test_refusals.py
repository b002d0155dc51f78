"""One refusal idiom: the same condition raises the same error class from every entry point. A model whose
heads were physically removed is refused with ``UnsupportedAnalysisError`` by ablation, patching, direct
logit attribution and composition alike (one line on the command line); the circuit probe's conditions a
user can change are ``InputError``; a programming mistake is a ``ValueError``, not an ``InputError``."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from conftest import bpe_tokenizer, tiny_model
from probe.causal.gates import gated, ones
from probe.cli import main
from probe.effects.ablation import ablating
from probe.effects.composition import composition_scores
from probe.effects.dla import direct_logit_attribution
from probe.effects.measure import head_effects
from probe.effects.patching import patch_heads
from probe.errors import InputError, ProbeError, UnsupportedAnalysisError
from probe.patterns import HeadDistances, circuit_probe, health_thresholds, repeated_random_tokens
from probe.pruning import prune, remove_heads, save_pruned
from probe.sites import Site

TEXTS = ["The cat sat on the mat and looked at the dog."] * 8


@pytest.fixture(scope="module")
def pruned():
    lm = tiny_model("llama")
    remove_heads(lm, {0: [1]})
    assert lm.pruned is not None
    return lm


@pytest.mark.parametrize("entry, analysis", [
    (lambda lm: head_effects(lm, TEXTS, heads=False), "ablation"),
    (lambda lm: patch_heads(lm), "patching"),
    (lambda lm: direct_logit_attribution(lm), "direct logit attribution"),
    (lambda lm: composition_scores(lm), "composition"),
], ids=["ablation", "patching", "dla", "composition"])
def test_a_model_with_removed_heads_gets_one_error_class_from_every_causal_entry_point(pruned, entry, analysis):
    """One class and one sentence, naming the analysis asked for."""
    with pytest.raises(UnsupportedAnalysisError) as info:
        entry(pruned)
    assert not isinstance(info.value, InputError)
    assert str(info.value) == (f"{pruned.name} has heads removed from its weights: {analysis} needs every head; "
                               "measure the original model")


def test_gates_and_pruning_accept_a_model_with_removed_heads(pruned):
    """Gates act on a pruned model in the original numbering (pruning again builds on them): a removed
    head's gate is 0, the others 1, and they still act; nothing is refused."""
    with gated(pruned) as state:  # entering checks on one sentence that closing a present head acts
        assert state.fired == set(range(pruned.geometry.n_layers))
    expected = torch.ones(pruned.geometry.n_layers, pruned.geometry.n_heads)
    expected[0, 1] = 0
    assert torch.equal(ones(pruned), expected)


@pytest.mark.parametrize("entry, error, message", [
    (lambda: health_thresholds({"uniform": 1.5}), InputError, "must be in \\(0, 1\\]"),
    (lambda: health_thresholds({"saturation": 0.5}), InputError, "unknown health check"),
    (lambda: HeadDistances([Site("encoder", 0)], 2, sample_rows=1), InputError, "at least 2"),
    (lambda: prune(tiny_model("t5"), TEXTS), UnsupportedAnalysisError, "one-stack models"),
    (lambda: remove_heads(tiny_model("bloom"), {0: [1]}), UnsupportedAnalysisError, "cannot remove heads"),
], ids=["health-threshold", "health-check", "sample-rows", "prune-encoder-decoder", "remove-bloom"])
def test_what_a_user_can_fix_is_input_error_and_what_a_model_cannot_do_is_unsupported(entry, error, message):
    """A bad option is an InputError; an analysis a model's kind or structure rules out is an
    UnsupportedAnalysisError; neither is the other (both are one Error: line, exit status 1)."""
    other = UnsupportedAnalysisError if error is InputError else InputError
    with pytest.raises(error, match=message) as info:
        entry()
    assert not isinstance(info.value, other)


def test_the_cli_refuses_a_pruned_folder_with_one_line_from_effects_and_patch(pruned, tmp_path):
    folder = tmp_path / "pruned"
    save_pruned(pruned, folder)
    pairs = tmp_path / "pairs.tsv"  # pairs the tiny tokenizer accepts: the removed heads are what is refused
    pairs.write_text("The cat and the dog ran to\tThe dog and the cat ran to\t the\t a\n", encoding="utf-8")
    for command, extra in (("effects", []), ("patch", ["--pairs", str(pairs)])):
        res = CliRunner().invoke(main, [command, "--model", str(folder), *extra, "--out", str(tmp_path / command)])
        assert res.exit_code == 1, res.output
        lines = [x for x in res.output.splitlines() if x.startswith("Error:")]
        assert len(lines) == 1 and "heads removed from its weights" in lines[0], res.output
        assert "Traceback" not in res.output


def test_circuit_probe_conditions_a_user_can_change_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="n >= 2"):
        repeated_random_tokens(bpe_tokenizer(), n=1)
    short = tiny_model("llama", max_positions=32)
    with pytest.raises(InputError, match="the probe needs 50 tokens; the model takes 32"):
        circuit_probe(short)


def test_a_programming_mistake_is_a_value_error_not_an_input_error():
    lm = tiny_model("gpt2")
    with pytest.raises(ValueError, match="head_means") as info:
        with ablating(lm, "mean", None):
            pass
    assert not isinstance(info.value, ProbeError)
