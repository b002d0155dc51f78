"""The rollout and flow of an analysis's examples, computed for the report and for notebooks: one
example's weights, attention rollout (:func:`probe.measures.rollout.rollout_matrix`) and the reported row's
attention flow (:func:`probe.measures.flow.flow_values`) in one forward pass (:func:`rollout_example`), and
the first examples a run kept (:func:`run_rollout`), one text (:func:`text_rollout`). The views in
:mod:`probe.view.rollout` draw what these return; they run no model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..core import LoadedModel
from ..errors import InputError
from ..text.inputs import Text
from ..util import plural
from .flow import MAX_FLOW_TOKENS, flow_values, normalise_rows
from .rollout import Attribution, encode_for_stack, rollout_matrix, stack_maps

#: Examples of a run shown in the report's section (the first ones kept).
MAX_EXAMPLES = 3
#: Most head-mean weights (layers x T^2) kept per example; more layers are thinned evenly, the last kept.
WEIGHT_VALUES = 60_000

@dataclass
class RolloutExample:
    """One example's weights, rollout and (reported row) flow.

    Attributes:
        index: the text's position in the corpus (0 for a notebook text).
        rollout: :class:`~probe.measures.rollout.Attribution` (whole [T, T] matrix).
        flow: the flow Attribution with only the reported row solved, or None above the limit.
        weights: [layers kept, T, T] ``mean_h A_l`` of the layers in ``layers``.
        layers: 0-based layer numbers of ``weights``.
    """

    index: int
    rollout: Attribution
    flow: Attribution | None
    weights: np.ndarray
    layers: list[int]


@dataclass
class RolloutRecord:
    """What the section shows: the examples, the notes (examples left out, flow not computed) and the
    seconds it took (forward passes included)."""

    examples: list[RolloutExample]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    flow_tokens: int = MAX_FLOW_TOKENS


def kept_layers(n_layers: int, T: int, budget: int = WEIGHT_VALUES) -> list[int]:
    """Layers whose weights fit in ``budget`` numbers: all, or evenly spaced ones ending with the last."""
    fit = max(1, budget // max(1, T * T))
    if fit >= n_layers:
        return list(range(n_layers))
    return sorted({int(round(x)) for x in np.linspace(n_layers - 1, 0, fit)})


def rollout_example(lm: LoadedModel, text: Text, index: int = 0, *, max_length: int | None = None,
                    max_flow_tokens: int = MAX_FLOW_TOKENS, ids: list[int] | None = None) -> RolloutExample:
    """Weights, rollout and the reported row's flow of one text (one forward pass).

    Args:
        ids: the token ids the text had when analysed; the text is re-encoded and must give them.

    Raises:
        InputError: an empty text; ``ids`` given and the re-encoded tokens differ (a sentence pair
            whose second segment was not kept, another tokenization).
    """
    batch = encode_for_stack(lm, [text], max_length)
    n = int(batch.lengths[0])
    if ids is not None and batch.input_ids[0, :n].tolist() != list(ids):
        raise InputError("the text's tokens differ from the analysed ones")
    m = stack_maps(lm, batch)[0]
    flow = None
    if n <= max_flow_tokens:
        raw = flow_values(m.tilde, [m.row_index])
        flow = m.attribution("flow", normalise_rows(raw), raw)
    layers = kept_layers(len(m.sites), n)
    return RolloutExample(index, m.attribution("rollout", rollout_matrix(m.tilde)), flow, m.weights[layers], layers)


def text_rollout(lm: LoadedModel, text: str | Text, *, max_length: int | None = None,
                 max_flow_tokens: int = MAX_FLOW_TOKENS) -> RolloutRecord:
    """Weights, rollout and the reported row's flow of one text as a record (one forward pass); flow left
    out, and said, above ``max_flow_tokens`` tokens. :func:`probe.entries.notebook.rollout_view` draws it.

    Raises:
        InputError: an empty text, max_length below 2.
    """
    t = Text(text) if isinstance(text, str) else text
    record = RolloutRecord([], flow_tokens=max_flow_tokens)
    start = time.perf_counter()
    record.examples.append(rollout_example(lm, t, 0, max_length=max_length, max_flow_tokens=max_flow_tokens))
    if record.examples[0].flow is None:
        record.notes.append(f"flow not computed: {len(record.examples[0].rollout.tokens)} tokens, above the limit "
                            f"of {max_flow_tokens} (pass max_flow_tokens to raise it)")
    record.seconds = time.perf_counter() - start
    return record


def run_rollout(lm: LoadedModel, result, *, max_examples: int = MAX_EXAMPLES,
                max_flow_tokens: int = MAX_FLOW_TOKENS) -> RolloutRecord:
    """The section's data for the first ``max_examples`` examples an analysis kept (``result.examples``),
    each re-run whole (rollout needs every layer's whole map, not the cropped ones the analysis keeps)."""
    start = time.perf_counter()
    out, notes = [], []
    for ex in result.examples[:max_examples]:
        try:
            out.append(rollout_example(lm, ex.as_text(), ex.index, max_length=len(ex.ids),
                                       max_flow_tokens=max_flow_tokens, ids=ex.ids))
        except InputError as err:
            notes.append(f"example {ex.index + 1} left out: {err}")
    above = [e for e in out if e.flow is None]
    if above:
        notes.append(f"flow not computed for {plural(len(above), 'example')} longer than {max_flow_tokens} tokens "
                     f"(examples {', '.join(str(e.index + 1) for e in above)}): it costs T max-flows per row")
    if len(result.examples) > max_examples:
        notes.append(f"{plural(len(result.examples) - max_examples, 'more example')} kept by the run not shown")
    return RolloutRecord(out, notes, time.perf_counter() - start, max_flow_tokens)
