"""Attention flow: the maximum flow from each input token to each position through a stack.

Rollout (:mod:`probe.measures.rollout`) adds up every path through the layers; attention flow (Abnar &
Zuidema 2020, "Quantifying Attention Flow in Transformers", ACL, sec. 3) treats the same
residual-mixed maps ``A~_l`` as capacities and asks how much can flow at once:

- the layered graph has a node (l, t) for every layer boundary l = 0..L and real token t, and
  an edge (l, i) -> (l-1, j) of capacity ``A~_l[i, j]`` wherever that is > 0;
- ``F[i, j]`` is the value of the maximum flow from (L, i) to (0, j) (unique, whichever
  algorithm finds it); at most 1, the source's capacity. Each (i, j) is its own problem, solved by
  scipy's compiled Dinic with an exact refinement (:mod:`probe.measures.maxflow`: within 1e-15 + 1e-12 F of
  the exact value; networkx's preflow-push agrees to about 2e-14);
- the reported matrix normalises each row, ``F[i, j] / sum_j F[i, j]`` (their ``compute_flows``);
  the raw ``F`` is kept.

Pairs with no path (above the diagonal of a causal stack) have flow exactly 0 and are not solved.
Padding, encoder-decoder models (encoder stack only) and removed heads are handled as rollout.

Cost: one max-flow per (row, input token), T^2 for the whole matrix, on a graph of (L + 1) T
nodes and up to L T^2 edges, built once per sequence. Measured on minilm (6 layers; one thread, a
2-core machine shared with other jobs, load about 2.7; ``benchmarks/bench_flow.py --old``), whole
matrix / reported row only: 16 tokens 0.14 s / 0.02 s, 32 tokens 0.87 s / 0.04 s, 64 tokens
9.3 s / 0.25 s (the previous networkx solver, same run: reported row 0.05 s, 0.34 s, 5.2 s; its
whole matrix at 64 tokens took 780 s). Rollout: 0.01 to 0.02 s. Hence the default limit of
:data:`MAX_FLOW_TOKENS` tokens and ``rows="reported"`` for many texts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import validate
from ..errors import InputError
from ..loading.models import LoadedModel
from ..text.inputs import Text
from .maxflow import LayeredGraph
from .rollout import Attribution, encode_for_stack, stack_maps

#: Longest sequence (real tokens) :func:`attention_flow` accepts unless told otherwise.
MAX_FLOW_TOKENS = 64

ROWS = ("all", "reported")


def flow_values(tilde: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray:
    """Raw attention flow ``F[i, j]`` = max-flow value from (L, i) to (0, j) on the layered graph.

    The graph is built once per sequence (:class:`~probe.measures.maxflow.LayeredGraph`); each (i, j) is its
    own maximum-flow problem (flows to different sinks are not parts of one flow: a super-sink would
    give ``max_flow((L, i), all inputs)``, at most 1, not each ``F[i, j]``), solved by scipy's compiled
    Dinic with exact refinement, to within 1e-15 + 1e-12 * F[i, j] of the exact value.

    Args:
        tilde: [L, T, T] ``A~`` maps, layer 1 first.
        rows: the output positions i to solve (default: all); other rows are NaN.

    Returns:
        [T, T] float64; exactly 0 where no path leads from (L, i) to (0, j).
    """
    graph = LayeredGraph(tilde)
    L, T = graph.L, graph.T
    out = np.full((T, T), np.nan)
    for i in range(T) if rows is None else rows:
        source = graph.node(L, i)
        reached = graph.reach(source, graph.cap)
        out[i] = 0.0
        for j in range(T):
            if reached[graph.node(0, j)]:
                out[i, j] = graph.max_flow(source, graph.node(0, j))
    return out


def normalise_rows(raw: np.ndarray) -> np.ndarray:
    """``F[i, j] / sum_j F[i, j]`` per row (NaN rows stay NaN)."""
    return raw / raw.sum(axis=-1, keepdims=True)


def attention_flow(lm: LoadedModel, text: str | Text | Sequence[str | Text], *, max_length: int | None = None,
                   max_tokens: int = MAX_FLOW_TOKENS, rows: str = "all") -> Attribution | list[Attribution]:
    """Attention flow of a text (or of each text of a list, run as one padded batch).

    The maximum flow from every input token to every position through the layered graph of
    ``A~_l = 0.5 * mean_h(A_l) + 0.5 * I`` (rows renormalised), over the encoder's layers
    (encoders, encoder-decoder models) or the decoder's (decoder-only models), each row divided
    by its sum; Abnar & Zuidema 2020, sec. 3. Expensive: T max-flows per row, T^2 in all (minilm,
    one busy core: whole matrix 0.14 s at 16 tokens, 0.9 s at 32, 9.3 s at 64; the reported row
    alone 0.02 s, 0.04 s, 0.25 s; see the module's docstring).

    Args:
        lm: a loaded model.
        text: a string or :class:`~probe.text.inputs.Text`, or a list of them.
        max_length: token limit per text (the text is cut to it; default: the model's limit).
        max_tokens: longest sequence accepted, in real tokens (default :data:`MAX_FLOW_TOKENS`).
        rows: ``"all"`` (the whole [T, T] matrix) or ``"reported"`` (only the reported row: T
            max-flows instead of T^2; the other rows are NaN).

    Returns:
        An :class:`~probe.measures.rollout.Attribution` with ``method="flow"`` (a list for a list of texts):
        ``.matrix`` the row-normalised flow, ``.raw`` the flow values, ``.row`` the reported row.

    Raises:
        InputError: a text longer than ``max_tokens`` tokens (nothing is computed), a bad
            ``rows``, an empty text, max_length below 2. CaptureError: no attention probabilities.
    """
    validate.positive_int("max_tokens", max_tokens)
    if rows not in ROWS:
        raise InputError(f"rows must be one of {', '.join(ROWS)}; got {rows!r}")
    single = isinstance(text, (str, Text))
    batch = encode_for_stack(lm, [text] if single else list(text), max_length)
    for r, n in enumerate(batch.lengths.tolist()):
        if n > max_tokens:
            which = "the text" if single else f"text {r + 1}"
            raise InputError(f"attention flow: {which} has {n} tokens, above the limit of {max_tokens} "
                             f"(flow costs T max-flows per row); pass max_tokens={n} to raise it, or "
                             f"max_length={max_tokens} to cut the text")
    out = []
    for m in stack_maps(lm, batch):
        raw = flow_values(m.tilde, None if rows == "all" else [m.row_index])
        out.append(m.attribution("flow", normalise_rows(raw), raw))
    return out[0] if single else out
