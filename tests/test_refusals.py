"""One refusal idiom: the same condition raises the same error class from every entry point. A model whose
heads were physically removed is refused with ``UnsupportedAnalysisError`` by ablation, patching, direct
logit attribution and composition alike (one line on the command line); the circuit probe's conditions a
user can change are ``InputError``; a programming mistake is a ``ValueError``, not an ``InputError``."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conftest import bpe_tokenizer, tiny_model
from probe.cli import main
from probe.effects.ablation import ablating
from probe.effects.composition import composition_scores
from probe.effects.dla import direct_logit_attribution
from probe.effects.measure import head_effects
from probe.effects.patching import patch_heads
from probe.errors import InputError, ProbeError, UnsupportedAnalysisError
from probe.patterns import circuit_probe, repeated_random_tokens
from probe.pruning import remove_heads, save_pruned

TEXTS = ["The cat sat on the mat and looked at the dog."] * 8


@pytest.fixture(scope="module")
def pruned():
    lm = tiny_model("llama")
    remove_heads(lm, {0: [1]})
    assert lm.pruned is not None
    return lm


@pytest.mark.parametrize("entry", [
    lambda lm: head_effects(lm, TEXTS, heads=False),
    lambda lm: patch_heads(lm),
    lambda lm: direct_logit_attribution(lm),
    lambda lm: composition_scores(lm),
], ids=["ablation", "patching", "dla", "composition"])
def test_a_model_with_removed_heads_gets_one_error_class_from_every_causal_entry_point(pruned, entry):
    with pytest.raises(UnsupportedAnalysisError, match="heads removed from its weights") as info:
        entry(pruned)
    assert not isinstance(info.value, InputError)


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
