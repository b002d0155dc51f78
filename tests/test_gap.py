"""Coreference examples (probe.linguistic.gap): GAP TSV with pandas, the word split, probe's
markup and the built-in probe set (>= 60 sentences, license stated), clear errors; the real GAP
development file when it is there."""

from __future__ import annotations

from importlib import resources

import pytest

from conftest import SHARED_DATA
from probe.errors import InputError
from probe.linguistic.gap import (
    GAP_COLUMNS,
    builtin_examples,
    overlapping,
    parse_gap,
    parse_marked,
    read_coref,
    read_gap,
    split_words,
)

HEADER = "\t".join(GAP_COLUMNS) + "\tURL"
ROWS = [
    # Text, Pronoun, offset, A, offset, A-coref, B, offset, B-coref
    ('Anna Berg met "Clara," and she smiled.', "she", 27, "Anna Berg", 0, "TRUE", "Clara", 15, "FALSE"),
    ("Tom saw Eric. He waved.", "He", 14, "Tom", 0, "false", "Eric", 8, "True"),
    ("Bad offsets here, she said.", "she", 0, "Bad", 0, "TRUE", "here", 12, "FALSE"),
]


def _tsv(rows=ROWS, header=HEADER) -> str:
    lines = [header] + ["\t".join([f"dev-{i}", *map(str, r), "http://x"]) for i, r in enumerate(rows, 1)]
    return "\n".join(lines) + "\n"


def test_split_words_splits_outer_punctuation_and_clitics():
    text = '"Cassidy," said (U.S.) well-known don\'t — x Lily\'s she’d'
    words = [text[s:e] for s, e in split_words(text)]
    assert words == ['"', "Cassidy", ',"', "said", "(", "U.S", ".)", "well-known", "don't", "—", "x",
                     "Lily", "'s", "she", "’d"]


def test_parse_gap_offsets_booleans_and_words():
    gap = parse_gap(_tsv(), source="t.tsv")
    assert gap.total == 3 and gap.mismatched == ["dev-3"]  # "she" is not at offset 0
    first, second = gap.examples
    assert first.mention("a") == "Anna Berg" and first.mention("b") == "Clara" and first.mention("pronoun") == "she"
    assert (first.a_coref, first.b_coref, second.a_coref, second.b_coref) == (True, False, False, True)
    meta = first.to_text().meta["coref"]
    words = [first.text[s:e] for s, e in split_words(first.text)]
    assert [words[i] for i in meta["a"]] == ["Anna", "Berg"]  # a two-word name: both words
    assert [words[i] for i in meta["b"]] == ["Clara"] and [words[i] for i in meta["pronoun"]] == ["she"]
    assert parse_gap(_tsv(), limit=1).total == 1


@pytest.mark.parametrize("data, fragment", [
    ("ID\tText\tPronoun\n1\tx\ty\n", "missing column(s) Pronoun-offset, A, A-offset"),
    (HEADER + "\n", "has no examples"),
    ("", "is not a GAP TSV file"),
    (_tsv([("Tom ran.", "he", "x", "Tom", 0, "TRUE", "ran", 4, "FALSE")]), "Pronoun-offset must be a character offset"),
    (_tsv([("Tom ran.", "he", 0, "Tom", 0, "yes", "ran", 4, "FALSE")]), "A-coref must be TRUE or FALSE"),
])
def test_bad_gap_is_one_clear_error(data, fragment):
    with pytest.raises(InputError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_gap(data, source="t.tsv")


def test_file_errors(tmp_path):
    with pytest.raises(InputError, match="GAP file not found"):
        read_gap(tmp_path / "nope.tsv")
    with pytest.raises(InputError, match="is a folder"):
        read_coref(tmp_path)


def test_marked_examples():
    ex = parse_marked("[A Anna] thanked [B Clara] because [P she] left.", "B", "x")
    assert ex.text == "Anna thanked Clara because she left."
    assert (ex.mention("a"), ex.mention("b"), ex.mention("pronoun")) == ("Anna", "Clara", "she")
    assert not ex.a_coref and ex.b_coref
    for bad, answer in (("[A Anna] met [P she]", "A"), ("[A x] [B y] [P z]", "C"), ("[A x] [A y] [B z] [P w]", "A")):
        with pytest.raises(ValueError):
            parse_marked(bad, answer, "bad")


def test_builtin_set_is_at_least_60_licensed_examples():
    raw = resources.files("probe").joinpath("linguistic/data/coref_builtin.tsv").read_text(encoding="utf-8")
    assert "License: CC0-1.0" in raw
    readme = resources.files("probe").joinpath("linguistic/data/README.md").read_text(encoding="utf-8")
    assert "CC0-1.0" in readme
    s = read_coref("builtin")
    assert s.source == "built-in probe set" and s.mismatched == [] and len(s.examples) >= 60
    assert len({ex.text for ex in s.examples}) == len(s.examples)
    pronouns = {"he", "she", "his", "her", "him"}
    for ex in s.examples:
        assert ex.a_coref != ex.b_coref
        assert ex.mention("pronoun") in pronouns
        assert ex.a[1] <= ex.b[0] < ex.b[1] <= ex.pronoun[0]  # A, then B, then the pronoun (decoders see both)
        meta = ex.to_text().meta["coref"]
        assert meta["a"] and meta["b"] and len(meta["pronoun"]) == 1
    n_a = sum(ex.a_coref for ex in s.examples)
    assert abs(n_a - (len(s.examples) - n_a)) <= 1  # as many A as B answers: no baseline is handed the set
    assert len(builtin_examples(limit=5).examples) == 5


GAP_DEV = SHARED_DATA / "gap" / "gap-development.tsv"


@pytest.mark.skipif(not GAP_DEV.exists(), reason=f"shared GAP data not found at {GAP_DEV}")
def test_gap_development_reads_whole():
    lines = GAP_DEV.read_text(encoding="utf-8").splitlines()
    gap = read_gap(GAP_DEV)
    assert gap.total == len(lines) - 1 == len(gap.examples) and gap.mismatched == []
    exact = 0
    for ex in gap.examples:
        spans = split_words(ex.text)
        for which in ("pronoun", "a", "b"):
            start, end = getattr(ex, which)
            idx = overlapping(spans, (start, end))
            assert idx and spans[idx[0]][0] <= start and end <= spans[idx[-1]][1]
            exact += (spans[idx[0]][0], spans[idx[-1]][1]) == (start, end)
    # the mentions' words are the mentions ("Lily" in "Lily's", "she" in "she'd"), but for a few
    # joined by "--" or GAP's "*" for non-ASCII letters ("Beyonc*,")
    assert exact >= 0.99 * 3 * len(gap.examples)


def test_a_limit_stops_reading(tmp_path):
    """read_gap reads the header and ``limit`` rows (blank lines not counted) and no further."""
    path = tmp_path / "gap.tsv"
    text = _tsv().replace("\n", "\n\n", 1)  # a blank line after the header
    path.write_bytes(text.encode("utf-8") + b"dev-9\tcaf\xe9\n")
    gap = read_gap(path, limit=3)
    assert gap.total == 3 and [ex.id for ex in gap.examples] == ["dev-1", "dev-2"] and gap.mismatched == ["dev-3"]
    assert read_gap(path, limit=1).total == 1
    with pytest.raises(InputError, match="line 6 is not valid UTF-8"):
        read_gap(path)
