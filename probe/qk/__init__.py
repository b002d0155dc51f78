"""Why a head attends where it does: its attention scores split by the sources of its query and key
(:func:`why`; the stream walk in :mod:`probe.qk.stream`), and averaged over the rows of a corpus
that fit the head's label (:func:`why_corpus`)."""

from .corpus import CorpusWhy, why_corpus
from .score import Why, why

__all__ = ["CorpusWhy", "Why", "why", "why_corpus"]
