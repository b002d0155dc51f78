"""The report's interactive head view (a section builder, :data:`probe.report.sections.BUILDERS`).

The view shows the first example as the analysis kept it: maps cropped to ``example_tokens``
(default 64) tokens, every layer and head (within :data:`probe.view.data.MAX_VALUES` numbers),
probabilities rounded to 3 decimals. Nothing larger is kept for the view, so the analysis' memory
stays bounded by what is shown (shared/CASES.md F20); ``probe.show(lm, text)`` shows whole texts
(512 tokens and more) from Python. The section also writes ``examples.npz`` (every kept example,
float16) so that :func:`probe.compare.load_run` can show and compare the examples later.
"""

from __future__ import annotations

from dataclasses import replace

from ..compare.runs import EXAMPLES_FILE, examples_bytes
from ..report.page import choose_heads
from ..report.sections import Section
from ..report.sections import render_fragment as render_template
from ..tokens import display_tokens
from .data import MAX_VALUES, SCALE, choose_layers
from .html import HeadView, render_fragment


def head_view_section(result, tokenizer):
    """The "Interactive head view" section of the report, or None without examples."""
    if not result.examples:
        return None
    labels = [ex.labels or display_tokens(tokenizer, ex.text, ex.ids, ex.offsets, ex.special)
              for ex in result.examples]
    ex = result.examples[0]
    n_layers, n_heads, n = ex.probs.shape[0], ex.probs.shape[1], ex.probs.shape[-1]
    layers = choose_layers(n_layers, n_heads, n, MAX_VALUES)
    chosen = [(lay, h) for lay, h, *_ in choose_heads(result) if lay in layers]
    layer, head = chosen[0] if chosen else (layers[0], 0)
    view = HeadView.from_example(ex if ex.labels else _labelled(ex, labels[0]), heads_table=result.heads,
                                 causal=bool(result.model.get("causal")), layer=layer, heads=[head])
    fragment = render_fragment(view.data, "probe-hv-report")
    html = render_template("section_view.html.j2", n=n, n_tokens=ex.n_tokens, precision=1 / SCALE,
                           threshold=view.data["threshold"], view=fragment,
                           words=view.data["units"] is not None)
    record = {"example": ex.index, "tokens": n, "of_tokens": ex.n_tokens, "layers": view.data["layers"],
              "values": view.data["values"], "precision": 1 / SCALE, "line_threshold": view.data["threshold"],
              "html_bytes": len(fragment.encode("utf-8"))}
    return Section("head-view", "Interactive head view", html, files={EXAMPLES_FILE: examples_bytes(result.examples,
                                                                                                    labels)},
                   record=record, order=5)


def _labelled(ex, labels):
    return replace(ex, labels=labels)
