"""Reading corpora: plain text and CoNLL-U, line ends (only \\n, \\r\\n and \\r end a line), clear errors."""

from __future__ import annotations

import pytest

from conftest import conllu
from probe.errors import InputError
from probe.text.corpus import (
    check_texts,
    iter_lines,
    read_corpus,
    read_pairs,
    read_text_file,
    sample_texts,
    split_lines,
)

CONLLU = conllu("corpus")


def test_read_conllu(tmp_path):
    path = tmp_path / "tiny.conllu"
    path.write_text(CONLLU, encoding="utf-8")
    assert read_corpus(path) == ["I don't know.", "Vámonos al mar.", "Third = last."]
    assert read_corpus(path, limit=2) == ["I don't know.", "Vámonos al mar."]


def test_read_conllu_detected_by_content(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("\ufeff" + CONLLU, encoding="utf-8")  # with a byte-order mark
    assert read_corpus(path) == ["I don't know.", "Vámonos al mar.", "Third = last."]


def test_read_plain_text(tmp_path):
    path = tmp_path / "plain.txt"
    path.write_text("First sentence.\n\n   \n  Second one, indented.  \r\nThird # not a comment\n",
                    encoding="utf-8")
    assert read_corpus(path) == ["First sentence.", "Second one, indented.", "Third # not a comment"]
    assert read_corpus(path, limit=1) == ["First sentence."]
    with pytest.raises(InputError, match="at least 1"):
        read_corpus(path, limit=0)
    with pytest.raises(InputError, match="folder"):
        read_corpus(tmp_path)


def test_check_texts_and_sample():
    assert check_texts(["a", "b", "c"], limit=2) == ["a", "b"]
    with pytest.raises(InputError):
        check_texts([])
    texts = sample_texts()
    assert len(texts) == 20 and all(t.strip() == t and t for t in texts)


def test_only_newline_carriage_return_and_crlf_end_a_line(tmp_path):
    """U+2028, U+2029, U+0085, form feed and vertical tab stay inside their line."""
    path = tmp_path / "seps.txt"
    text = ("First line with a\u2028line separator inside.\n"
            "Second\x0cwith a form feed, a\x0bvertical tab, a\u0085next line and a\u2029paragraph separator.\r\n"
            "Third line.\r")
    path.write_text(text, encoding="utf-8", newline="")
    got = read_corpus(path)
    assert len(got) == 3
    assert got[0] == "First line with a\u2028line separator inside."
    assert got[1] == ("Second\x0cwith a form feed, a\x0bvertical tab, a\u0085next line and a\u2029paragraph "
                      "separator.")
    assert got[2] == "Third line."
    assert len(text.splitlines()) == 8  # what str.splitlines() would have made of it
    assert split_lines("a\rb\r\nc\nd") == ["a", "b", "c", "d"]
    assert split_lines("a\n") == ["a"] and split_lines("") == []


def test_conllu_text_lines_keep_unicode_separators(tmp_path):
    path = tmp_path / "s.conllu"
    path.write_text("# text = One\u2028two.\n1\tOne\t_\t_\t_\t_\t0\troot\t_\t_\n\n", encoding="utf-8")
    assert read_corpus(path) == ["One\u2028two."]


def test_conllu_without_text_lines_says_so(tmp_path):
    path = tmp_path / "notext.conllu"
    path.write_text("# sent_id = 1\n1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"no '# text =' line found in CoNLL-U file .*notext\.conllu"):
        read_corpus(path)
    plain = tmp_path / "blank.txt"
    plain.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(InputError, match="corpus file has no text"):
        read_corpus(plain)


def test_read_text_file_and_iter_lines(tmp_path):
    """The whole-file and line readers the annotated-file readers use: a byte-order mark dropped,
    only \\n, \\r\\n and \\r end a line, errors name the kind of file (and the line for bad bytes)."""
    path = tmp_path / "x.tsv"
    path.write_bytes("\ufeffa\tb\r\nc\u2028d\re\n".encode("utf-8"))
    assert list(iter_lines(path, "GAP file")) == ["a\tb", "c\u2028d", "e"]
    assert read_text_file(path) == "a\tb\nc\u2028d\ne\n"
    with pytest.raises(InputError, match="GAP file not found"):
        iter_lines(tmp_path / "missing.tsv", "GAP file")  # at once, before any line is asked for
    with pytest.raises(InputError, match="CoNLL-U file is a folder"):
        read_text_file(tmp_path, "CoNLL-U file")
    path.write_bytes(b"fine\nbad \xff\n")
    with pytest.raises(InputError, match=r"line 2 is not valid UTF-8 \(byte 0xff at offset 9\)"):
        read_text_file(path)


def test_read_pairs(tmp_path):
    f = tmp_path / "pairs.tsv"
    f.write_bytes("\ufeffIs it raining?\tNo.\r\n\r\n  Who called? \tNobody\u2028did.\rLast\tone\n".encode("utf-8"))
    pairs = read_pairs(f)
    assert [(p.text, p.pair) for p in pairs] == [("Is it raining?", "No."), ("Who called?", "Nobody\u2028did."),
                                                 ("Last", "one")]
    assert [p.text for p in read_pairs(f, limit=2)] == ["Is it raining?", "Who called?"]
    for content, fragment in (("a\tb\tc\n", "line 1"), ("a\tb\nno tab\n", "line 2"), ("\tb\n", "line 1"),
                              ("\n \n", "no pair")):
        f.write_text(content, encoding="utf-8")
        with pytest.raises(InputError, match=fragment):
            read_pairs(f)
    with pytest.raises(InputError, match="not found"):
        read_pairs(tmp_path / "missing.tsv")
