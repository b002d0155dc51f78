"""Which kinds of model and site each analysis measures: the rule on the accumulator's class
(``model_kinds``, ``site_kinds``, read by ``Accumulator.refusal``), refused in the library by
``run``/``analyze`` with one line, and read (not restated) by the CLI."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from conftest import save_tiny, tiny_model
from probe.capture.hooks import Hooks
from probe.errors import ProbeError, UnsupportedAnalysisError
from probe.linguistic.coref import CorefAccumulator
from probe.linguistic.syntax import SyntaxAccumulator
from probe.measures.accumulators import Accumulator, ExampleMaps, TokenCounts, check_supported
from probe.measures.stats import HeadStatistics
from probe.patterns import HeadDistances, HealthProbe, PatternTypes, circuit_probe, pattern_accumulators
from probe.patterns.circuits import CircuitProbe, CircuitScores, SinkShares
from probe.runs.analysis import analyze, run
from probe.text.inputs import Text, iter_batches

ONE_STACK = [HeadDistances, PatternTypes, HealthProbe, CorefAccumulator, SyntaxAccumulator]
DECODER_ONLY = [CircuitScores, SinkShares, CircuitProbe]
EVERY_MODEL = [HeadStatistics, ExampleMaps, TokenCounts]
MODELS = {"bert": "encoder", "gpt2": "decoder", "bart": "encoder-decoder", "t5": "encoder-decoder"}
PAIRS = [Text("The cat sat on the mat.", target="Le chat est assis."), Text("A dog ran.", target="Un chien.")]

_LMS: dict = {}


def _lm(kind):
    if kind not in _LMS:
        _LMS[kind] = tiny_model(kind)
    return _LMS[kind]


def _an(kind: str) -> str:
    return "an" if kind[0] in "aeiou" else "a"


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("cls", ONE_STACK + DECODER_ONLY + EVERY_MODEL, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_each_accumulators_rule_on_each_kind_of_model(cls, kind):
    lm = _lm(kind)
    assert lm.kind == MODELS[kind]
    covers = ("encoder", "decoder") if cls in ONE_STACK else ("decoder",) if cls in DECODER_ONLY else \
        ("encoder", "decoder", "encoder-decoder")
    assert cls.model_kinds == covers
    if lm.kind in covers:
        assert cls.refusal(lm) is None
    else:
        assert cls.refusal(lm) == (f"{cls.title} is for {' and '.join(covers)} models; {lm.name} is "
                                   f"{_an(lm.kind)} {lm.kind} model")


def test_analyze_refuses_pattern_accumulators_on_t5_in_one_line_before_running():
    lm = _lm("t5")
    accs = pattern_accumulators(lm)
    calls = []
    with Hooks() as hooks:  # the model must not even run
        hooks.forward(lm.model, lambda *a: calls.append(1))
        with pytest.raises(UnsupportedAnalysisError) as err:
            analyze(lm, PAIRS, accumulators=accs)
    assert str(err.value) == f"head distances is for encoder and decoder models; {lm.name} is an encoder-decoder model"
    assert isinstance(err.value, ProbeError) and "\n" not in str(err.value) and calls == []
    with pytest.raises(UnsupportedAnalysisError, match="^Kovaleva pattern types is for encoder and decoder"):
        run(lm, iter_batches(lm, PAIRS), accs[1:])
    with pytest.raises(UnsupportedAnalysisError, match="^the induction / duplicate-token probe is for decoder"):
        circuit_probe(lm)
    # what the rule allows runs: every statistic of the three site kinds
    heads = analyze(lm, PAIRS).heads
    assert set(zip(heads["stack"], heads["kind"])) == {("encoder", "self"), ("decoder", "self"), ("decoder", "cross")}


def test_finished_accumulators_are_checked_too():
    with pytest.raises(UnsupportedAnalysisError, match="is for decoder models; .* is an encoder model"):
        analyze(_lm("bert"), ["A short text."], finished=[CircuitProbe(None)])


class _SelfOnly(Accumulator):
    """Every kind of model, but only self-attention sites."""

    title = "a self-attention count"
    site_kinds = ("self",)

    def __init__(self) -> None:
        self.seen = 0

    def update(self, site, probs, batch) -> None:
        self.seen += 1


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_a_site_kind_rule_refuses_models_with_other_site_kinds(kind):
    lm = _lm(kind)
    assert _SelfOnly.refusal(lm) == (f"a self-attention count is for self-attention sites; {lm.name} has "
                                     "cross-attention sites")
    with pytest.raises(UnsupportedAnalysisError, match="has cross-attention sites$"):
        check_supported(lm, [_SelfOnly()])
    decoder = _lm("gpt2")
    acc = _SelfOnly()
    with torch.no_grad():
        run(decoder, iter_batches(decoder, [Text("Hello there.")]), [acc])
    assert acc.seen == len(decoder.sites)


def test_the_cli_reads_the_rule(tmp_path):
    from probe.cli import main

    t5 = save_tiny("t5", tmp_path / "t5")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("A cat sat.\tUn chat.\nThe dog ran home.\tLe chien.\n", encoding="utf-8")
    runner = CliRunner()
    res = runner.invoke(main, ["analyze", "--model", str(t5), "--pairs", str(pairs), "--out", str(tmp_path / "r"),
                               "--no-progress"])
    assert res.exit_code == 0, res.output
    name = str(t5)
    # one cause said once for the three analyses it stops
    assert (f"note: not run: head distances, Kovaleva pattern types and the padding health check are for encoder "
            f"and decoder models; {name} is an encoder-decoder model\n" in res.output)
    conllu = tmp_path / "tree.conllu"
    conllu.write_text("# text = The cat sat.\n1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_\n"
                      "2\tcat\tcat\tNOUN\t_\t_\t3\tnsubj\t_\t_\n3\tsat\tsit\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No\n"
                      "4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_\n\n", encoding="utf-8")
    res = runner.invoke(main, ["analyze", "--model", str(t5), "--syntax", str(conllu), "--out", str(tmp_path / "s"),
                               "--no-progress"])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert res.output.strip().splitlines()[-1] == (f"Error: syntax scoring is for encoder and decoder models; {name} "
                                                   "is an encoder-decoder model")
    assert not (tmp_path / "s" / "index.html").exists()
