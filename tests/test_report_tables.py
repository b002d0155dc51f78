"""Heads in the report's HTML tables are named as everywhere else (``L4H5``), while the CSVs keep
separate integer columns; the effects section's label grid shows whole labels (its key and each
cell's tooltip); the head map's layer legend names every layer in the colour of its points."""

from __future__ import annotations

import html as html_lib
import io
import re

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import save_tiny, tiny_model
from probe.cli import main
from probe.patterns import circuit_probe, pattern_accumulators
from probe.patterns.report import groups_section, viridis
from probe.report import LABEL_COLORS, LABEL_SHORT, label_family, write_run
from probe.runs.analysis import analyze
from probe.sites import head_name
from probe.text.inputs import Text

TEXTS = ["The cat sat on the mat, and then it slept.", "Short one.", "Birds sing in the morning; they fly away.",
         "Why?", "It rained all day, so we stayed in."]
LAYERS = 6


def _cells(row_html: str, tag: str = "t[dh]") -> list[str]:
    return [html_lib.unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(rf"<{tag}[^>]*>(.*?)</{tag[:1]}[^>]*>", row_html, re.S)]


def _tables(page: str) -> list[list[list[str]]]:
    """Every <table> of a page as rows of cell texts."""
    return [[_cells(tr) for tr in re.findall(r"<tr>(.*?)</tr>", t, re.S)]
            for t in re.findall(r"<table[^>]*>(.*?)</table>", page, re.S)]


def _section(page: str, sid: str) -> str:
    start = page.index(f'<h2 id="{sid}">')
    end = page.find("<h2", start + 5)
    return page[start:end if end > 0 else len(page)]


@pytest.fixture(scope="module")
def deep_decoder_run(tmp_path_factory):
    lm = tiny_model("llama", layers=LAYERS)
    res = analyze(lm, TEXTS, batch_size=3, n_examples=1, accumulators=pattern_accumulators(lm),
                  finished=[circuit_probe(lm, sink_texts=TEXTS)])
    return write_run(res, lm.tokenizer, tmp_path_factory.mktemp("tables") / "run"), res


def test_circuit_tables_name_heads_like_L4H5(deep_decoder_run):
    path, res = deep_decoder_run
    section = _section((path / "index.html").read_text(encoding="utf-8"), "circuits")
    tables = _tables(section)
    assert len(tables) == 2
    scores = res.results["circuits"].scores
    for table, column in zip(tables, ("induction", "duplicate")):
        assert table[0] == ["head", "induction", "duplicate", "prev_random"]
        top = scores.sort_values(column, ascending=False).head(10)
        assert [r[0] for r in table[1:]] == [head_name(int(r.layer), int(r.head)) for r in top.itertuples()]
        assert float(table[1][1]) == pytest.approx(float(top.iloc[0]["induction"]), abs=5e-4)


def test_all_heads_table_names_heads_and_the_csv_keeps_integer_columns(deep_decoder_run):
    path, res = deep_decoder_run
    page = (path / "index.html").read_text(encoding="utf-8")
    table = _tables(page[page.index("<h2>All heads</h2>"):])[0]
    assert table[0][0] == "head" and "layer" not in table[0]
    assert [r[0] for r in table[1:]] == [f"L{int(r.layer)}H{int(r.head)}" for r in res.heads.itertuples()]
    assert table[0][1:] == [c for c in res.heads.columns if c not in ("layer", "head")]
    csv = pd.read_csv(io.StringIO((path / "heads.csv").read_text(encoding="utf-8")))
    assert list(csv.columns[:2]) == ["layer", "head"] and csv["layer"].dtype.kind == "i"
    # no HTML table of the page lists a head as a layer column beside a head column
    for t in _tables(page):
        for row in t:
            assert not any(a == "layer" and b == "head" for a, b in zip(row, row[1:])), row


def test_encoder_decoder_heads_table_names_the_site_kind(tmp_path):
    lm = tiny_model("bart")
    res = analyze(lm, [Text("A short source.", target="Une cible.")], n_examples=0)
    page = (write_run(res, lm.tokenizer, tmp_path / "run") / "index.html").read_text(encoding="utf-8")
    table = _tables(page[page.index("<h2>All heads</h2>"):])[0]
    assert table[0][0] == "head" and not {"stack", "kind", "layer"} & set(table[0])
    assert [r[0] for r in table[1:]] == [head_name(r, r["head"]) for r in res.heads.to_dict("records")]
    assert {r[0].split()[0] for r in table[1:]} == {"enc", "dec", "cross"}


def test_head_map_legend_lists_every_layer_in_its_colour(deep_decoder_run):
    path, res = deep_decoder_run
    fig = groups_section(res, None).figures["map-layer"]
    assert fig["legend"] == [[f"L{i}", viridis(i / (LAYERS - 1))] for i in range(LAYERS)]
    colour = dict(fig["legend"])
    layers = res.heads["layer"].to_numpy()[res.heads["group"].to_numpy() >= 0]
    assert [colour[f"L{layer}"] for layer in layers] == [viridis(v) for v in fig["values"]]


def test_effects_label_grid_shows_whole_labels(tmp_path):
    """A label cut to 4 characters is ambiguous (``prev``ious-token / ``prev``...): each cell holds the
    label's grid abbreviation in its colour, its tooltip the head and the whole label, and the key
    below the grid gives every abbreviation's whole labels."""
    model = save_tiny("llama", tmp_path / "model")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS * 2), encoding="utf-8")
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["effects", "--model", str(model), "--corpus", str(corpus), "--seeds", "5",
                                    "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    heads = pd.read_csv(out / "heads.csv")
    section = _section((out / "index.html").read_text(encoding="utf-8"), "effects")
    grid = re.search(r'<table class="grid">(.*?)</table>\s*<figcaption>(.*?)</figcaption>', section, re.S)
    cells = re.findall(r'<td style="background: ([^"]+)" title="([^"]+)">([^<]*)</td>', grid.group(1))
    assert len(cells) == len(heads)
    for (color, title, text), row in zip(cells, heads.itertuples()):
        label = str(row.label)
        assert html_lib.unescape(title) == f"{head_name(row.layer, row.head)}: {label}"
        assert html_lib.unescape(text) == LABEL_SHORT[label_family(label)]
        assert color == LABEL_COLORS[label_family(label)]
    key = html_lib.unescape(re.sub(r"<[^>]+>", "", grid.group(2)))
    for label in set(heads["label"]):
        short = LABEL_SHORT[label_family(label)] or "blank"
        assert re.search(rf"(^|; |Key: ){re.escape(short)} [^;]*\b{re.escape(label)}\b", key), (label, key)
