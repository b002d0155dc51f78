"""Reading CoNLL-U for the syntax analysis (probe.linguistic.conllu): multiword tokens, empty
nodes, SpaceAfter=No, text reconstruction, relation subtypes, clear errors; the real UD EWT dev
file when it is there."""

from __future__ import annotations

import re

import pytest

from conftest import SHARED_DATA, conllu
from probe.errors import InputError
from probe.linguistic.conllu import base_relation, parse_conllu, read_conllu

SAMPLE = "# sent_id = s1\n" + conllu("didnt") + """# sent_id = s2
1	The	the	DET	DT	_	2	det	_	_
2	report	report	NOUN	NN	_	0	root	_	_
2.1	said	say	VERB	VBD	_	_	_	2:conj	_
3	said	say	VERB	VBD	_	2	acl:relcl	_	SpaceAfter=No
4	.	.	PUNCT	.	_	2	punct	_	_

# sent_id = s3
# text = Hello world
1	Hello	hello	INTJ	UH	_	0	root	_	_
2	there	there	ADV	RB	_	1	advmod	_	_

"""

UD_DEV = SHARED_DATA / "ud-ewt" / "en_ewt-ud-dev.conllu"


def test_sentences_words_and_trees():
    bank = parse_conllu(SAMPLE)
    assert bank.total == 3 and bank.mismatched == ["s3"]  # "there" is not in "Hello world"
    assert bank.multiword_tokens == 1 and bank.empty_nodes == 1
    s1, s2 = bank.sentences
    assert s1.text == "I didn't go." and s1.sent_id == "s1"
    assert [s1.text[a:b] for a, b in s1.spans] == ["I", "didn't", "go", "."]
    assert s1.forms == ["I", "did", "n't", "go", "."]
    assert s1.surface == [0, 1, 1, 2, 3]  # both words of "didn't" map to the surface token
    assert s1.heads == [3, 3, 3, -1, 3]  # 0-based word indices, -1 for the root
    assert s1.relations == ["nsubj", "aux", "advmod", "root", "punct"]
    # no "# text": rebuilt from the forms and SpaceAfter=No; the empty node 2.1 is skipped
    assert s2.text == "The report said." and s2.spans == [(0, 3), (4, 10), (11, 15), (15, 16)]
    assert s2.relations == ["det", "root", "acl", "punct"] and s2.heads == [1, -1, 1, 1]


def test_to_text_carries_surface_words_and_the_tree():
    s1 = parse_conllu(SAMPLE).sentences[0]
    text = s1.to_text()
    assert text.words == s1.spans and text.word_spans() == s1.spans
    assert text.meta["syntax"] == {"surface": [0, 1, 1, 2, 3], "heads": [3, 3, 3, -1, 3],
                                   "relations": ["nsubj", "aux", "advmod", "root", "punct"], "sent_id": "s1"}


def test_limit_and_subtypes():
    assert parse_conllu(SAMPLE, limit=1).total == 1
    assert base_relation("nmod:poss") == "nmod" and base_relation("obl:tmod") == "obl" and base_relation("det") == "det"


@pytest.mark.parametrize("data, fragment", [
    ("", "no CoNLL-U sentence"),
    ("just some prose\nand more\n", "not valid CoNLL-U"),
    ("1\tI\n\n", "no HEAD/DEPREL column"),
])
def test_bad_input_is_one_clear_error(data, fragment):
    with pytest.raises(InputError, match=fragment):
        parse_conllu(data, source="x.conllu")


def test_file_errors(tmp_path):
    with pytest.raises(InputError, match="CoNLL-U file not found"):
        read_conllu(tmp_path / "missing.conllu")
    bad = tmp_path / "latin1.conllu"
    bad.write_bytes(b"# text = caf\xe9\n")
    with pytest.raises(InputError, match="line 1 is not valid UTF-8"):
        read_conllu(bad)


@pytest.mark.skipif(not UD_DEV.exists(), reason=f"shared UD EWT data not found at {UD_DEV}")
def test_ud_ewt_dev_reads_whole():
    raw = UD_DEV.read_text(encoding="utf-8")
    bank = read_conllu(UD_DEV)
    # counted independently from the file's lines
    assert bank.total == len(re.findall(r"^# sent_id = ", raw, re.M)) == len(bank.sentences)
    assert bank.mismatched == []
    assert bank.multiword_tokens == len(re.findall(r"^\d+-\d+\t", raw, re.M))
    assert bank.empty_nodes == len(re.findall(r"^\d+\.\d+\t", raw, re.M))
    assert sum(len(s.forms) for s in bank.sentences) == len(re.findall(r"^\d+\t", raw, re.M))
    for s in bank.sentences:  # every surface span holds its form; every word has a head or is a root
        assert all(s.text[a:b].strip() == s.text[a:b] != "" for a, b in s.spans)
        assert s.heads.count(-1) >= 1 and all(-1 <= h < len(s.forms) for h in s.heads)


def test_a_limit_stops_reading(tmp_path):
    """With a limit the file is read a sentence at a time and no further: bytes after the limit's
    last sentence (here not UTF-8) are never decoded; without a limit they are an error."""
    path = tmp_path / "long.conllu"
    path.write_bytes(SAMPLE.encode("utf-8") + b"# text = caf\xe9\n1\tcaf\xe9\t_\t_\t_\t_\t0\troot\t_\t_\n")
    bank = read_conllu(path, limit=2)
    assert bank.total == 2 and [s.sent_id for s in bank.sentences] == ["s1", "s2"]
    with pytest.raises(InputError, match="line 22 is not valid UTF-8"):
        read_conllu(path)
    assert parse_conllu(SAMPLE + "1\tbroken\n", limit=3).total == 3  # the malformed line after s3 is not parsed
    with pytest.raises(InputError, match="no HEAD/DEPREL column"):
        parse_conllu(SAMPLE + "1\tbroken\n")
