"""One display name per head (``L4H5``; ``enc L4H5`` / ``dec L4H5`` / ``cross L4H5`` for an
encoder-decoder model's sites), counted nouns in the right number, and a grep over what probe
writes (pages, CSV headers, command-line messages) and over its sources for the forms it used
before: ``L0 H2``, ``4-5``, ``layer 4 head 5``, ``3.5`` in pruning.csv, ``1 sequences``."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import save_tiny
from probe.cli import main
from probe.sites import Site, head_name, site_prefix
from probe.util import plural

ROOT = Path(__file__).resolve().parents[1]

SENTENCES = ["The cat sat on the mat.", "A dog barked at the moon.", "Birds sing in the morning.",
             "It rained all day long.", "She read the old letter twice.", "We walked home after the game.",
             "The train was late again.", "He painted the fence blue.", "They laughed at the joke.",
             "Snow covered the quiet town."]

#: Head names in the forms probe used before (and a count with a plural noun after "1").
OLD_FORMS = {
    "L0 H2": re.compile(r"\bL\d+ H\d+\b"),
    "layer 4 head 5": re.compile(r"\blayer \d+,? head \d+\b"),
    "head 5 of layer 4": re.compile(r"\bhead \d+ of layer \d+\b"),
    "best head 4-5": re.compile(r"\bhead \d+-\d+\b"),
    "1 sequences": re.compile(r"(?<![\d.,])1 (sequences|steps|tokens|heads|examples|layers|batches|labels)\b"),
}


def test_head_name_of_a_layer_a_site_and_a_table_row():
    assert head_name(4, 5) == "L4H5" and head_name(0, 11) == "L0H11"
    assert head_name(Site("encoder", 4), 5) == "enc L4H5"
    assert head_name(Site("decoder", 4, "self"), 5) == "dec L4H5"
    assert head_name(Site("decoder", 4, "cross"), 5) == "cross L4H5"
    rows = pd.DataFrame({"stack": ["encoder", "decoder"], "kind": ["self", "cross"], "layer": [1, 2], "head": [3, 0]})
    assert [head_name(r, r["head"]) for r in rows.to_dict("records")] == ["enc L1H3", "cross L2H0"]
    assert [head_name(r, r.head) for r in rows.itertuples()] == ["enc L1H3", "cross L2H0"]
    assert head_name(rows.iloc[1], 0) == "cross L2H0"
    one_stack = pd.DataFrame({"layer": [3], "head": [7]})
    assert head_name(one_stack.iloc[0], 7) == "L3H7" and head_name(next(one_stack.itertuples()), 7) == "L3H7"
    assert site_prefix(None) == site_prefix(float("nan")) == "" and site_prefix("decoder", "cross") == "cross"
    with pytest.raises(ValueError, match="bad site"):
        site_prefix("encoder", "cross")


def test_plural_is_right_for_one_and_for_many():
    assert plural(1, "sequence") == "1 sequence" and plural(2, "sequence") == "2 sequences"
    assert plural(0, "step") == "0 steps" and plural(1024, "token") == "1,024 tokens"
    assert plural(3, "query", "queries") == "3 queries" and plural(1, "query", "queries") == "1 query"
    import numpy as np

    assert plural(np.int64(1), "head") == "1 head" and plural(np.int64(12), "head") == "12 heads"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """What probe writes for one-stack and encoder-decoder models: analyze (with its pattern
    sections), prune (one step), compare; every page, CSV and message."""
    root = tmp_path_factory.mktemp("names")
    bert, t5 = save_tiny("bert", root / "bert"), save_tiny("t5", root / "t5")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    pairs = root / "pairs.tsv"
    pairs.write_text("The cat sat.\tLe chat.\nA dog ran home.\tUn chien.\n", encoding="utf-8")
    results = [
        run("analyze", "--model", bert, "--text", "One short sentence here.", "--out", root / "one", "--no-progress"),
        run("analyze", "--model", bert, "--corpus", corpus, "--out", root / "many", "--no-progress"),
        run("analyze", "--model", t5, "--pairs", pairs, "--out", root / "t5run", "--no-progress"),
        run("prune", "--model", bert, "--corpus", corpus, "--steps", 1, "--fraction", 0.25, "--out", root / "pruned",
            "--no-progress"),
        run("compare", root / "one", root / "many", "--out", root / "cmp"),
    ]
    for r in results:
        assert r.exit_code == 0, r.output
    return root, results


def test_every_page_csv_and_message_names_heads_one_way(outputs):
    root, results = outputs
    texts = {f"{r.stdout}\n{r.stderr}": "messages" for r in results}
    for path in root.rglob("*"):
        if path.suffix in (".html", ".json") or path.name.endswith(".csv"):
            text = path.read_text(encoding="utf-8")
            texts[text if path.suffix != ".csv" else text.splitlines()[0]] = str(path.relative_to(root))
    assert len(texts) > 12
    for text, where in texts.items():
        for form, pattern in OLD_FORMS.items():
            assert not pattern.search(text), f"{where}: {form!r} form: {pattern.search(text).group(0)!r}"
    page = (root / "many" / "index.html").read_text(encoding="utf-8")
    assert re.search(r"\bL\d+H\d+: ", page)  # the grid's tips
    assert re.search(r"\benc L\dH\d\b", (root / "t5run" / "index.html").read_text(encoding="utf-8"))
    assert re.search(r"\bcross L\dH\d\b", (root / "t5run" / "index.html").read_text(encoding="utf-8"))
    assert "from 1 sequence," in results[0].stdout and "Analyzing 1 sequence (--text)" in results[0].stderr
    assert "1 step to 25%" in results[3].stderr


def test_pruning_csv_has_layer_and_head_columns(outputs):
    root, _ = outputs
    with open(root / "pruned" / "pruning.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["order", "step", "fraction", "n_pruned", "value", "std", "layer", "head"]
    pruned = [r for r in rows if r["order"] == "importance" and r["step"] == "1"]
    assert len(pruned) == 2 and all(re.fullmatch(r"\d+", r["layer"]) and re.fullmatch(r"\d+", r["head"])
                                    for r in pruned)  # 25% of 2 x 4 heads, each its own row of integers
    t5_cross = pd.read_csv(root / "t5run" / "cross.csv")
    assert list(t5_cross.columns[:4]) == ["stack", "kind", "layer", "head"] and set(t5_cross["kind"]) == {"cross"}


def test_sources_build_no_head_name_of_their_own():
    """Every display of a head goes through head_name: no f-string or script builds one (element ids
    such as ``attn-{layer}-{head}`` are not displays)."""
    forms = [re.compile(p) for p in (r"L\{[^}]*\} ?H\{", r"layer \{[^}]*\},? head \{",
                                     r"(?<![-\w}])\{[^}]*layer[^}]*\}[-.]\{[^}]*(head|\bh\b)",
                                     r"[\"']head [\"'] *\+", r"[\"']h[\"'] *\+", r"layer \{\{[^}]*\}\},? head \{\{")]
    files = [p for p in (ROOT / "probe").rglob("*") if p.suffix in (".py", ".js", ".j2") and p.name != "sites.py"]
    files += list((ROOT / "notebooks").glob("*.ipynb"))
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files for f in forms
             for m in f.finditer(p.read_text(encoding="utf-8"))]
    assert found == []
