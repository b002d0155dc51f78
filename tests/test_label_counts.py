"""Counts that say what they count (the report legend, the circuits section, run.json, the CLI).

The trigger: the legend said "induction: 1" (heads whose primary label is induction) while the
circuits section said 8 heads reach the induction threshold (every head holding the label). Both
are right and both are now named: "N primary, M hold it" in the legend, "M heads hold it, N as their
primary label" in the circuits section, ``primary_label_counts`` / ``heads_with_label`` in
run.json, "heads by primary label" in the CLI summary.
"""

from __future__ import annotations

import html as htmllib
import json
import re

import pytest

from conftest import tiny_model
from probe.errors import InputError
from probe.patterns import circuit_probe
from probe.report import write_run
from probe.runs.analysis import analyze

TEXTS = ["The cat sat on the mat because it was warm.", "Birds sing in the morning and fly away."]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    lm = tiny_model("gpt2")
    res = analyze(lm, TEXTS, n_examples=0, finished=[circuit_probe(lm, n=8, batch_size=4)],
                  thresholds={"induction": 0.08, "first-token": 0.1})  # heads hold both: one is not primary
    folder = write_run(res, lm.tokenizer, tmp_path_factory.mktemp("run") / "r")
    return res, folder


def independent_counts(heads, label):
    """(heads whose primary label is ``label``, heads holding it), from the table's strings."""
    primary = sum(1 for x in heads["label"] if x == label)
    held = sum(1 for x in heads["labels"] if label in str(x).split(";"))
    return primary, held


def test_legend_and_circuits_section_name_what_they_count(run):
    res, folder = run
    primary, held = independent_counts(res.heads, "induction")
    assert held > primary >= 0  # the trigger: the two counts differ
    page = htmllib.unescape((folder / "index.html").read_text(encoding="utf-8"))
    legend = re.search(r'<div class="legend">(.*?)</div>', page, re.S).group(1)
    spans = dict(re.findall(r">([a-z-]+): ([^<]+)</span>", legend))
    assert spans["induction"] == f"{primary} primary, {held} hold it"
    mixed_primary, mixed_held = independent_counts(res.heads, "mixed")
    assert mixed_primary == mixed_held and spans["mixed"] == f"{mixed_primary} primary"  # one number where equal
    assert "Counts in the legend: heads whose <em>primary</em> label it is" in page
    assert f"induction \u2265 0.08 ({held} heads hold it, {primary} as their primary label)" in page


def test_run_json_names_both_counts(run):
    res, folder = run
    rec = json.loads((folder / "run.json").read_text())
    assert "label_counts" not in rec
    assert sum(rec["primary_label_counts"].values()) == len(res.heads)
    for label in set(rec["heads_with_label"]) | set(rec["primary_label_counts"]):
        primary, held = independent_counts(res.heads, label)
        assert rec["primary_label_counts"].get(label, 0) == primary and rec["heads_with_label"].get(label, 0) == held
    primary, held = independent_counts(res.heads, "induction")
    assert rec["circuits"]["labelled"]["induction"] == held and rec["circuits"]["primary"]["induction"] == primary


def test_label_counts_rejects_other_kinds(run):
    with pytest.raises(InputError, match="'primary' or 'all'"):
        run[0].label_counts("some")


def test_cli_summary_says_primary(tmp_path):
    from click.testing import CliRunner

    from conftest import save_tiny
    from probe.cli import main

    folder = save_tiny("bert", tmp_path / "m")
    res = CliRunner().invoke(main, ["analyze", "--model", str(folder), "--out", str(tmp_path / "run"),
                                    "--no-progress", "--no-distance", "--text", TEXTS[0]])
    assert res.exit_code == 0, res.output
    rec = json.loads((tmp_path / "run" / "run.json").read_text())
    counts = ", ".join(f"{n} {label}" for label, n in rec["primary_label_counts"].items())
    assert res.stdout.splitlines()[0].startswith(f"8 heads by primary label ({counts}) from 1 sequence,")
