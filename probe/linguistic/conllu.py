"""Reading CoNLL-U (Universal Dependencies) for the syntax analysis, with the ``conllu`` package.

Each sentence becomes its text, the character spans of its *surface* tokens in that text, and per
syntactic word: its surface token, its gold head and its relation.

Decisions (the definition of syntactic heads, docs/statistics.md, leaves them to the implementation):

- Text: the ``# text = ...`` comment; without one, the forms joined with a space except where
  MISC says ``SpaceAfter=No``.
- Surface tokens: a multiword token (an id range such as ``3-4``, "don't" = do + n't) is one surface
  token; words outside a range are their own surface token. Word character spans are found by
  walking the text: each surface form must appear at the next non-space position. A sentence whose
  forms cannot be found that way is counted as unaligned (``text mismatch``) and left out.
- Multiword tokens: both syntactic words map to the surface token's span (attention to "didn't" is
  attention to "did" and to "n't"). A dependency between two words of one surface token (n't -> did)
  cannot be told apart by word-level attention; such pairs are counted and left out by the scorer.
- Empty nodes (ids such as ``8.1``, enhanced dependencies) are skipped; HEAD and DEPREL are the basic
  tree's.
- Relations are UD DEPRELs without their subtype (``nmod:poss`` -> ``nmod``, ``obl:tmod`` -> ``obl``),
  as Clark et al. 2019 used one label per relation type.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import conllu

from ..errors import InputError
from ..text.corpus import iter_lines, split_lines
from ..text.inputs import Text


@dataclass
class Sentence:
    """One CoNLL-U sentence, aligned to its text.

    Attributes:
        text: the sentence text.
        spans: character ``(start, end)`` of each surface token in ``text``.
        surface: per syntactic word (in id order), the index of its surface token in ``spans``.
        heads: per syntactic word, the index (0-based, into the syntactic words) of its gold head, or
            -1 for the root.
        relations: per syntactic word, its DEPREL without subtype.
        forms: per syntactic word, its form.
        sent_id: the ``# sent_id`` comment, or the sentence's position (1-based) as text.
    """

    text: str
    spans: list[tuple[int, int]]
    surface: list[int]
    heads: list[int]
    relations: list[str]
    forms: list[str]
    sent_id: str = ""

    def to_text(self) -> Text:
        """A :class:`probe.text.inputs.Text` whose words are the surface tokens and whose ``meta["syntax"]``
        holds what :class:`probe.linguistic.syntax.SyntaxAccumulator` scores."""
        return Text(self.text, words=list(self.spans), meta={"syntax": {
            "surface": list(self.surface), "heads": list(self.heads), "relations": list(self.relations),
            "sent_id": self.sent_id}})


@dataclass
class Treebank:
    """The sentences of a CoNLL-U file and what could not be used.

    Attributes:
        sentences: aligned sentences, in file order.
        total: sentences in the file (within the limit).
        mismatched: ids of sentences whose forms could not be found in their text (left out).
        empty_nodes: empty nodes skipped.
        multiword_tokens: multiword tokens seen.
    """

    sentences: list[Sentence]
    total: int
    mismatched: list[str] = field(default_factory=list)
    empty_nodes: int = 0
    multiword_tokens: int = 0

    def texts(self) -> list[Text]:
        """The aligned sentences as :class:`~probe.text.inputs.Text` (words and gold trees in meta)."""
        return [s.to_text() for s in self.sentences]


def base_relation(deprel: str) -> str:
    """A UD DEPREL without its subtype: ``"nmod:poss"`` -> ``"nmod"``."""
    return deprel.split(":", 1)[0]


def _surface_tokens(tokens) -> tuple[list[tuple[str, list[int], bool]], int, int]:
    """(form, word ids, space after) per surface token; counts of empty nodes and multiword tokens."""
    out, covered, empty, mwt = [], set(), 0, 0
    for tok in tokens:
        tid = tok["id"]
        misc = tok.get("misc") or {}
        space = misc.get("SpaceAfter") != "No"
        if isinstance(tid, tuple) and len(tid) == 3 and tid[1] == ".":
            empty += 1
        elif isinstance(tid, tuple) and len(tid) == 3 and tid[1] == "-":
            ids = list(range(tid[0], tid[2] + 1))
            covered.update(ids)
            out.append((tok["form"], ids, space))
            mwt += 1
        elif isinstance(tid, int) and tid not in covered:
            out.append((tok["form"], [tid], space))
    return out, empty, mwt


def _spans(text: str, forms: list[str]) -> list[tuple[int, int]] | None:
    """Character spans of ``forms`` found one after the other in ``text`` (None if one is missing)."""
    spans, pos = [], 0
    for form in forms:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if not form or not text.startswith(form, pos):
            return None
        spans.append((pos, pos + len(form)))
        pos += len(form)
    return spans


def _sentence(tokens, index: int) -> tuple[Sentence | None, int, int]:
    """One parsed ``conllu.TokenList`` as a :class:`Sentence` (None: forms not found in the text)."""
    surface_tokens, empty, mwt = _surface_tokens(tokens)
    words = [t for t in tokens if isinstance(t["id"], int)]
    meta = tokens.metadata or {}
    sent_id = str(meta.get("sent_id") or index + 1)
    text = meta.get("text")
    if text is None:
        text = "".join(form + (" " if space else "") for form, _, space in surface_tokens).rstrip()
    spans = _spans(text, [form for form, _, _ in surface_tokens])
    if spans is None or not words:
        return None, empty, mwt
    where = {wid: s for s, (_, ids, _) in enumerate(surface_tokens) for wid in ids}
    position = {t["id"]: i for i, t in enumerate(words)}
    heads = []
    for t in words:
        h = t["head"]
        heads.append(-1 if not h else position.get(h, -1))
    return Sentence(
        text=text, spans=spans, surface=[where[t["id"]] for t in words], heads=heads,
        relations=[base_relation(str(t["deprel"])) for t in words], forms=[t["form"] for t in words],
        sent_id=sent_id,
    ), empty, mwt


def _token_lists(lines: Iterable[str], source: str) -> Iterator:
    """``conllu.TokenList`` per sentence, parsed one sentence at a time from ``lines`` (line ends
    removed) by ``conllu.parse_incr``; a malformed line is an :class:`InputError`."""
    class _Lines:  # the text file parse_incr expects: it iterates over lines ending in "\n"
        def read(self, size: int = -1) -> str:
            return "".join(self)

        def __iter__(self):
            return (line + "\n" for line in lines)

    parsed = iter(conllu.parse_incr(_Lines()))
    while True:
        try:
            tokens = next(parsed)
        except StopIteration:
            return
        except InputError:
            raise
        except Exception as exc:  # conllu raises ParseException and ValueError subclasses
            raise InputError(f"{source} is not valid CoNLL-U: {str(exc).splitlines()[0]}") from None
        yield tokens


def _treebank(lines: Iterable[str], limit: int | None, source: str) -> Treebank:
    """The first ``limit`` sentences with words of ``lines`` (all without a limit): reading stops
    there, so a limit bounds the time and memory whatever the file's size."""
    bank = Treebank(sentences=[], total=0)
    for tokens in _token_lists(lines, source):
        if not any(isinstance(t.get("id"), int) for t in tokens):
            continue
        short = next((t for t in tokens if isinstance(t.get("id"), int) and not {"head", "deprel"} <= set(t.keys())),
                     None)
        if short is not None:
            raise InputError(f"{source} is not valid CoNLL-U: word {short.get('id')} ({short.get('form')!r}) has "
                             "no HEAD/DEPREL column (expected 10 tab-separated columns)")
        sent, empty, mwt = _sentence(tokens, bank.total)
        bank.empty_nodes += empty
        bank.multiword_tokens += mwt
        if sent is None:
            bank.mismatched.append(str((tokens.metadata or {}).get("sent_id") or bank.total + 1))
        else:
            bank.sentences.append(sent)
        bank.total += 1
        if limit and bank.total >= limit:
            break
    if not bank.total:
        raise InputError(f"{source} has no CoNLL-U sentence (expected lines of 10 tab-separated columns)")
    return bank


def parse_conllu(data: str, limit: int | None = None, source: str = "CoNLL-U input") -> Treebank:
    """Parse CoNLL-U text into a :class:`Treebank`.

    Args:
        data: the file's text.
        limit: keep at most this many sentences (the first ones; the text after them is not parsed).
        source: name used in error messages.

    Raises:
        InputError: the text is not CoNLL-U (a malformed line) or holds no sentence with words.
    """
    return _treebank(split_lines(data), limit, source)


def read_conllu(path: str | Path, limit: int | None = None) -> Treebank:
    """Read a CoNLL-U file (UTF-8) into a :class:`Treebank`, a sentence at a time: with a
    ``limit``, reading stops after that many sentences (:func:`probe.text.corpus.iter_lines`).

    Raises:
        InputError: missing, unreadable or non-UTF-8 file, not CoNLL-U, or no sentence.
    """
    return _treebank(iter_lines(path, "CoNLL-U file"), limit, source=str(path))
