"""Attention against annotated text: word-level attention, coreference heads and syntactic heads
(definitions in docs/statistics.md: word-level attention, coreference, syntax;
Clark et al. 2019, "What Does BERT Look At?", sec. 4-5).

Modules: :mod:`.words` (token -> word attention, alignment), :mod:`.conllu` and :mod:`.gap`
(readers), :mod:`.coref` and :mod:`.syntax` (accumulators of probe's analysis loop),
:mod:`.intervals` (Wilson intervals), :mod:`.api` (functions returning DataFrames),
:mod:`.report` (report sections).
"""

from .api import AnnotatedInput, annotated_input, coref_heads, syntax_heads
from .conllu import Sentence, Treebank, parse_conllu, read_conllu
from .coref import CorefAccumulator, CorefResult
from .gap import CorefExample, CorefSet, builtin_examples, parse_gap, read_coref, read_gap
from .syntax import SyntaxAccumulator, SyntaxResult
from .words import align_row, batch_words, word_attention, word_matrix

__all__ = [
    "AnnotatedInput", "CorefAccumulator", "CorefExample", "CorefResult", "CorefSet", "Sentence",
    "SyntaxAccumulator", "SyntaxResult", "Treebank", "align_row", "annotated_input", "batch_words",
    "builtin_examples", "coref_heads", "parse_conllu", "parse_gap", "read_conllu", "read_coref", "read_gap",
    "syntax_heads", "word_attention", "word_matrix",
]
