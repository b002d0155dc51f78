"""Weights, rollout and flow side by side: the report's section and a notebook view.

For a chosen output position i of one example the view draws three bars per input token j: the
attention weight ``mean_h A_l[i, j]`` of a chosen layer, the rollout ``R[i, j]``
(:func:`probe.attention_rollout`) and the attention flow ``F[i, j] / sum_j F[i, j]``
(:func:`probe.attention_flow`). Rollout and weights are kept for every row (clicking a token picks
its row); flow only for the reported row ([CLS] for encoders, the last token for decoders), and
only for texts of at most ``max_flow_tokens`` tokens (the others are counted and said). The values
come from the same functions as the API (:func:`probe.measures.rollout.stack_maps`,
:func:`probe.measures.rollout.rollout_matrix`, :func:`probe.measures.flow.flow_values`), rounded to :data:`DIGITS`
decimals for the page. The view runs no model: :mod:`probe.measures.rollout_examples` computes the record it
draws (:func:`probe.entries.notebook.rollout_view` runs it on one text and draws it). The page's script is
``static/rollout.js``: plain JavaScript, tokens set as text, never markup, no network.
"""

from __future__ import annotations

import html
import uuid
from pathlib import Path

import numpy as np

from ..report.page import json_for_script
from ..report.sections import Section, section_builder
from ..report.sections import render_fragment as render_template
from ..runfolder import replace_file
from ..util import plural
from .assets import view_page, view_static

#: Decimals of every value on the page.
DIGITS = 4


def _rounded(a) -> list:
    a = np.round(np.asarray(a, dtype=np.float64), DIGITS)
    return np.where(np.isnan(a), None, a).tolist()


def rollout_data(record) -> dict:
    """The page's data of a :class:`~probe.measures.rollout_examples.RolloutRecord` (JSON-ready): per example the
    tokens, the reported row, the weights of the kept layers, the whole rollout matrix and the reported
    row's flow (or None), and the notes."""
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
            f'<script type="application/json" class="probe-rv-data">{json_for_script(data)}</script>'
            f'<script>{view_static("rollout.js")}</script></div>')


class RolloutView:
    """Weights | rollout | flow of one or more examples; shows itself in Jupyter (``_repr_html_``).

    Attributes:
        record: the :class:`~probe.measures.rollout_examples.RolloutRecord` (full-precision values).
        data: what the page receives (:func:`rollout_data`).
    """

    def __init__(self, record) -> None:
        self.record = record
        self.data = rollout_data(record)

    def _repr_html_(self) -> str:
        return render_rollout(self.data)

    def save(self, path: str | Path) -> Path:
        """Write a whole offline page with this view (under the view's Content-Security-Policy)."""
        return replace_file(path, view_page(render_rollout(self.data), "probe rollout view"))

    def __repr__(self) -> str:
        ex = self.record.examples
        return f"RolloutView({plural(len(ex), 'example')}, {', '.join(str(len(e.rollout.tokens)) for e in ex)} tokens)"


@section_builder
def rollout_section(result, tokenizer=None):
    """The report's "Attention rollout and flow" section, or None where it did not run
    (``result.results["rollout"]``, a :class:`~probe.measures.rollout_examples.RolloutRecord` the CLI adds;
    ``--no-rollout`` leaves it out)."""
    record = result.results.get("rollout")
    if record is None:
        return None
    data = rollout_data(record)
    html_ = render_template("section_rollout.html.j2", record=record, view=render_rollout(data, "probe-rv-report"),
                            digits=DIGITS)
    summary = {"examples": [{"example": e.index, "tokens": len(e.rollout.tokens), "row": e.rollout.row_index,
                             "stack": e.rollout.stack, "flow": e.flow is not None,
                             "top_rollout": e.rollout.top(3), "top_flow": e.flow.top(3) if e.flow else None}
                            for e in record.examples],
               "notes": list(record.notes), "seconds": round(record.seconds, 3), "flow_tokens": record.flow_tokens}
    return Section("rollout", "Attention rollout and flow", html_, record=summary, order=7)
