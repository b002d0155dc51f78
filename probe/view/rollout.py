"""Weights, rollout and flow side by side: the report's section and a notebook view.

For a chosen output position i of one example the view draws three bars per input token j: the
attention weight ``mean_h A_l[i, j]`` of a chosen layer, the rollout ``R[i, j]``
(:func:`probe.attention_rollout`) and the attention flow ``F[i, j] / sum_j F[i, j]``
(:func:`probe.attention_flow`). Rollout and weights are kept for every row (clicking a token picks
its row); flow only for the reported row ([CLS] for encoders, the last token for decoders), and
only for texts of at most ``max_flow_tokens`` tokens (the others are counted and said). The values
come from the same functions as the API (:func:`probe.rollout.stack_maps`,
:func:`probe.rollout.rollout_matrix`, :func:`probe.flow.flow_values`), rounded to :data:`DIGITS`
decimals for the page. The page's script is ``static/rollout.js``: plain JavaScript, tokens set as
text, never markup, no network.
"""

from __future__ import annotations

import html
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core import LoadedModel
from ..errors import InputError
from ..flow import MAX_FLOW_TOKENS, flow_values, normalise_rows
from ..inputs import Text
from ..report.page import _json_for_script
from ..report.sections import Section
from ..report.sections import render_fragment as render_template
from ..rollout import Attribution, encode_for_stack, rollout_matrix, stack_maps
from ..runfolder import replace_file
from ..util import plural
from .assets import VIEW_CSP, view_static

#: Examples of a run shown in the report's section (the first ones kept).
MAX_EXAMPLES = 3
#: Most head-mean weights (layers x T^2) kept per example; more layers are thinned evenly, the last kept.
WEIGHT_VALUES = 60_000
#: Decimals of every value on the page.
DIGITS = 4


@dataclass
class RolloutExample:
    """One example's weights, rollout and (reported row) flow.

    Attributes:
        index: the text's position in the corpus (0 for a notebook text).
        rollout: :class:`~probe.rollout.Attribution` (whole [T, T] matrix).
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


def _rounded(a) -> list:
    a = np.round(np.asarray(a, dtype=np.float64), DIGITS)
    return np.where(np.isnan(a), None, a).tolist()


def rollout_data(record: RolloutRecord) -> dict:
    """The page's data (JSON-ready): per example the tokens, the reported row, the weights of the kept
    layers, the whole rollout matrix and the reported row's flow (or None), and the notes."""
    examples = []
    for e in record.examples:
        r = e.rollout
        examples.append({
            "index": e.index, "tokens": list(r.tokens), "row": r.row_index, "stack": r.stack,
            "layers": e.layers, "n_layers": len(r.sites), "weights": _rounded(e.weights),
            "rollout": _rounded(r.matrix), "flow": None if e.flow is None else _rounded(e.flow.row),
            "notes": list(r.notes),
        })
    return {"examples": examples, "digits": DIGITS, "flow_tokens": record.flow_tokens, "notes": list(record.notes)}


def render_rollout(data: dict, view_id: str | None = None) -> str:
    """The view as an HTML fragment: its style, data (escaped JSON) and script (``static/rollout.js``)."""
    view_id = view_id or f"probe-rv-{uuid.uuid4().hex[:12]}"
    return (f'<div class="probe-rv" id="{html.escape(view_id)}"><style>{view_static("rollout.css")}</style>'
            f'<div class="rv-fallback">probe rollout view: its script has not run (in Jupyter, run the cell or '
            f'trust the notebook).</div>'
            f'<script type="application/json" class="probe-rv-data">{_json_for_script(data)}</script>'
            f'<script>{view_static("rollout.js")}</script></div>')


class RolloutView:
    """Weights | rollout | flow of one or more examples; shows itself in Jupyter (``_repr_html_``).

    Attributes:
        record: the :class:`RolloutRecord` (full-precision values).
        data: what the page receives (:func:`rollout_data`).
    """

    def __init__(self, record: RolloutRecord) -> None:
        self.record = record
        self.data = rollout_data(record)

    def _repr_html_(self) -> str:
        return render_rollout(self.data)

    def save(self, path: str | Path) -> Path:
        """Write a whole offline page with this view (under the view's Content-Security-Policy)."""
        page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                f'<meta http-equiv="Content-Security-Policy" content="{VIEW_CSP}">'
                f'<title>probe rollout view</title></head><body style="font-family: sans-serif; margin: 1rem">'
                f'{render_rollout(self.data)}</body></html>\n')
        return replace_file(path, page)

    def __repr__(self) -> str:
        ex = self.record.examples
        return f"RolloutView({plural(len(ex), 'example')}, {', '.join(str(len(e.rollout.tokens)) for e in ex)} tokens)"


def rollout_view(lm: LoadedModel, text: str | Text, *, max_length: int | None = None,
                 max_flow_tokens: int = MAX_FLOW_TOKENS) -> RolloutView:
    """Weights, attention rollout and attention flow of one text side by side (Jupyter; ``.save(path)``).

    Click a token to see its row; the weights are the mean over heads of the chosen layer. Flow is
    solved for the reported row only ([CLS] / the last token), and only up to ``max_flow_tokens``.

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
    return RolloutView(record)


def rollout_section(result, tokenizer=None):
    """The report's "Attention rollout and flow" section, or None where it did not run
    (``result.results["rollout"]``, a :class:`RolloutRecord` the CLI adds; ``--no-rollout`` leaves it out)."""
    record = result.results.get("rollout")
    if not isinstance(record, RolloutRecord):
        return None
    data = rollout_data(record)
    html_ = render_template("section_rollout.html.j2", record=record, view=render_rollout(data, "probe-rv-report"),
                            digits=DIGITS)
    summary = {"examples": [{"example": e.index, "tokens": len(e.rollout.tokens), "row": e.rollout.row_index,
                             "stack": e.rollout.stack, "flow": e.flow is not None,
                             "top_rollout": e.rollout.top(3), "top_flow": e.flow.top(3) if e.flow else None}
                            for e in record.examples],
               "notes": list(record.notes), "seconds": round(record.seconds, 3), "flow_tokens": record.flow_tokens}
    return Section("rollout", "Attention rollout and flow", html_, record=summary, order=6)
