"""Report sections of the coreference and syntax analyses (probe.linguistic.report): figure data
equal the results, the CSV files are the tables, run.json records them, the page draws in Chromium."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from test_report import _data

from conftest import CHROMIUM_ARGS, conllu, tiny_model
from probe.linguistic import annotated_input
from probe.linguistic.report import choose_view, summary_lines
from probe.report import write_run
from probe.runs.analysis import analyze

CONLLU = conllu("didnt")


@pytest.fixture(scope="module", params=["bert", "llama"])
def run_dir(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"ling-{request.param}")
    conllu = folder / "one.conllu"
    conllu.write_text(CONLLU * 100)  # 100 copies: 100 dependencies of each relation, the bar to be reported
    lm = tiny_model(request.param)
    source = annotated_input("builtin", str(conllu), limit=None)
    res = analyze(lm, source.texts, accumulators=source.accumulators(lm), n_examples=1)
    return write_run(res, lm.tokenizer, folder / "run"), res


def test_csv_files_are_the_tables(run_dir):
    path, res = run_dir
    coref, syntax = res.results["coreference"], res.results["syntax"]
    for name, table in (("coref.csv", coref.table), ("syntax.csv", syntax.table)):
        written = pd.read_csv(path / name)
        assert list(written.columns) == list(table.columns) and len(written) == len(table)
        np.testing.assert_allclose(written["accuracy"], table["accuracy"].astype(float), rtol=1e-5)
    assert set(syntax.table["relation"]) == {"all", "nsubj", "aux", "advmod", "punct"}
    assert coref.counts["scored"] == 67 and len(coref.table) == 2 * 4 + 2  # tiny model: 2 layers x 4 heads


def test_figures_equal_the_results(run_dir):
    path, res = run_dir
    coref = res.results["coreference"]
    figures = _data((path / "index.html").read_text())["figures"]
    grid = figures["coref-accuracy"]
    assert (grid["rows"], grid["cols"]) == (2, 4)
    np.testing.assert_allclose(np.array(grid["values"]) / grid["scale"], coref.heads["accuracy"], atol=1e-4)
    top = coref.best(1).iloc[0]
    pos = int(coref.best(1).index[0])
    view = choose_view(coref, pos // 4, int(top["head"]))
    example = figures["coref-example"]
    words = [label.split(" (")[0] for label in example["colLabels"]]
    start = view.words.index(words[0])
    row = view.rows[pos // 4, int(top["head"]), start:start + len(words)]
    np.testing.assert_allclose(np.array(example["values"]) / example["scale"], row, atol=1e-3)
    assert any(label.endswith("(P)") for label in example["colLabels"])
    pooled = figures["syntax-all"]
    t = res.results["syntax"].table
    want = t[(t["relation"] == "all") & (t["direction"] == "dep->head") & (t["kind"] == "head")]["accuracy"]
    np.testing.assert_allclose(np.array(pooled["values"]) / pooled["scale"], want, atol=1e-4)


def test_sections_and_record(run_dir):
    path, res = run_dir
    html = (path / "index.html").read_text()
    assert '<h2 id="coreference">Coreference heads</h2>' in html and '<h2 id="syntax">Syntactic heads</h2>' in html
    causal = res.model["causal"]
    assert ("examples with a name at or after the pronoun are left out" in html) == causal
    assert ("reachable" in html) == causal
    table = re.search(r'<h2 id="syntax">.*?<table>(.*?)</table>', html, re.S).group(1)
    intro = re.search(r'<h2 id="syntax">(.*?)<table>', html, re.S).group(1)
    assert re.findall(r"L\d+H\d+", intro) == []  # issue 27 item 5: the intro names no head as if it were the best
    assert "a head is named L&lt;layer&gt;H&lt;head&gt;" in intro
    assert table.count("<tr>") == 2 + 5  # two header rows, then all, nsubj, aux, advmod, punct
    record = json.loads((path / "run.json").read_text())
    assert record["coreference"]["counts"] == res.results["coreference"].counts
    assert record["syntax"]["counts"]["dependencies"] == 400
    assert len(record["syntax"]["best"]) == 10  # 5 relations x 2 directions
    lines = summary_lines(res)
    assert lines[0].startswith("coreference: 67 of 67 examples scored; best head")
    assert lines[1].startswith("syntax: 100 of 100 sentences aligned; 400 dependencies;")


def test_coref_summary_says_what_each_number_counts(run_dir):
    """The command line's coreference line and the section's counts: each number with what it counts
    (examples read / scored, % of the scored ones a head or a baseline gets right, the interval, heads
    labelled out of all heads)."""
    path, res = run_dir
    coref = res.results["coreference"]
    c, top = coref.counts, coref.best(1).iloc[0]
    pct = lambda v: f"{100 * v:.1f}"  # noqa: E731
    nearest, first = coref.baselines.loc["nearest"], coref.baselines.loc["first"]
    left = c["examples"] - c["scored"]
    assert summary_lines(res)[0] == (
        f"coreference: {c['scored']} of {c['examples']} examples scored"
        + (f" ({left} left out: " + ", ".join(f"{n} {k}" for k, n in {**c["unaligned"], **c["skipped"]}.items())
           + ")" if left else "")
        + f"; best head L{int(top['layer'])}H{int(top['head'])} right on {pct(top['accuracy'])}% of them "
        f"(95% interval {pct(top['ci_low'])}-{pct(top['ci_high'])}%); baselines on the same examples: "
        f"the nearer name {pct(nearest['accuracy'])}% ({pct(nearest['ci_low'])}-{pct(nearest['ci_high'])}%), "
        f"the first name {pct(first['accuracy'])}% ({pct(first['ci_low'])}-{pct(first['ci_high'])}%); "
        f"heads labelled coreference: {len(coref.labelled())} of {len(coref.heads)}")
    section = (path / "index.html").read_text().split('<h2 id="coreference">')[1].split("<h2")[0]
    assert f"<p>{c['examples']} examples read: {c['scored']} scored" in section
    assert ("<tr><th>head / baseline</th><th>examples scored</th><th>right (% of them)</th>"
            "<th>95% interval (%)</th></tr>") in section
    assert f"<td>{c['scored']}</td><td>{pct(top['accuracy'])}</td>" in section


def test_labels_in_heads_csv_follow_the_rules(run_dir):
    """coreference: interval's lower end above the best baseline; syntactic:<rel>: 10 points above
    the baseline in either direction; no other head gets either."""
    path, res = run_dir
    heads = pd.read_csv(path / "heads.csv").set_index(["layer", "head"])
    coref = res.results["coreference"]
    expected: dict = {}
    for r in coref.heads.itertuples():
        if r.ci_low > coref.best_baseline():
            expected.setdefault((int(r.layer), int(r.head)), set()).add("coreference")
    t = res.results["syntax"].table
    base = t[t["kind"] == "baseline"].set_index(["relation", "direction"])["accuracy"]
    for r in t[(t["kind"] == "head") & (t["relation"] != "all")].itertuples():
        if r.accuracy - base[(r.relation, r.direction)] >= 0.1 - 1e-9:
            expected.setdefault((int(r.layer), int(r.head)), set()).add(f"syntactic:{r.relation}")
    for key, row in heads.iterrows():
        got = {lab for lab in row["labels"].split(";") if lab == "coreference" or lab.startswith("syntactic:")}
        assert got == expected.get(key, set()), key
    assert "coref_accuracy" in heads and "syntax_gain" in heads and "syntax_relation" in heads


def test_page_with_sections_draws_every_figure_in_chromium(run_dir, chromium):
    sync_api, executable = chromium
    path, _ = run_dir
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            messages = []
            page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
            page.goto((path / "index.html").as_uri())
            page.wait_for_function("document.body.getAttribute('data-figures-drawn') !== null")
            n = int(page.evaluate("document.body.getAttribute('data-figures-drawn')"))
            figures = _data((path / "index.html").read_text())["figures"]
            assert {"coref-accuracy", "coref-example", "syntax-all"} <= set(figures)
            assert n == len(figures)
            assert page.evaluate("document.querySelectorAll('canvas[data-drawn]').length") == n
            assert messages == []
        finally:
            browser.close()


def test_sections_when_nothing_could_be_scored(tmp_path):
    """A decoder on an example whose name follows the pronoun, and no CoNLL-U sentence: the
    sections say so; nothing is NaN in run.json."""
    from probe.linguistic import CorefAccumulator, SyntaxAccumulator
    from probe.linguistic.gap import parse_marked

    lm = tiny_model("llama")
    ex = parse_marked("[A Anna] said [P she] saw [B Clara] there.", "A", "after")
    res = analyze(lm, [ex.to_text(), "Plain text here."],
                  accumulators=[CorefAccumulator(lm.sites, 4), SyntaxAccumulator(lm.sites, 4)])
    path = write_run(res, lm.tokenizer, tmp_path / "run")
    record = json.loads((path / "run.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in run.json"))
    assert record["coreference"]["best_heads"] == [] and record["coreference"]["baselines"]["first"]["accuracy"] is None
    assert record["syntax"]["best"] == [] and record["syntax"]["counts"]["dependencies"] == 0
    html = (path / "index.html").read_text()
    assert "1 left out: candidate after the pronoun" in html
    assert summary_lines(res) == [
        "coreference: 0 of 1 example scored (1 left out: 1 candidate after the pronoun)",
        "syntax: 0 of 0 sentences aligned; 0 dependencies; relations with a syntactic head: none"]
