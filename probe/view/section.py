"""The report's interactive head view (a section builder, :data:`probe.report.sections.BUILDERS`).

The view shows the first example as the analysis kept it: maps cropped to ``example_tokens``
(default 64) tokens, every layer and head (within :data:`probe.view.data.MAX_VALUES` numbers),
probabilities rounded to 3 decimals. Nothing larger is kept for the view, so the analysis' memory
stays bounded by what is shown (never whole long maps); ``probe.show(lm, text)`` shows whole texts
(512 tokens and more) from Python. The section also writes ``examples.npz`` (every kept example,
float16) so that :func:`probe.compare.load_run` can show and compare the examples later.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..compare.runs import EXAMPLES_FILE, examples_bytes
from ..report.page import choose_heads
from ..report.sections import Section
from ..report.sections import render_fragment as render_template
from ..tokens import display_tokens
from .data import MAX_VALUES, SCALE, choose_layers
from .html import HeadView, render_fragment


def head_view_section(result, tokenizer):
    """The "Interactive head view" section of the report, or None without examples. An
    encoder-decoder model's view holds its encoder, decoder and cross-attention sites, each with
    its own query and key tokens, and each head's label is its own site's."""
    if not result.examples:
        return None
    labels = [ex.labels or display_tokens(tokenizer, ex.text, ex.ids, ex.offsets, ex.special)
              for ex in result.examples]
    targets = [_target_labels(ex, tokenizer) for ex in result.examples]
    ex = result.examples[0]
    n_heads, n = ex.probs.shape[1], ex.probs.shape[-1]
    n_sites = ex.probs.shape[0] + len(ex.decoder or {})
    longest = max([n] + [max(np.shape(p)[-2:]) for p in (ex.decoder or {}).values()])
    layers = choose_layers(n_sites, n_heads, longest, MAX_VALUES)
    chosen = [(lay, h) for lay, h, *_ in choose_heads(result) if lay in layers]  # encoder heads: site = layer
    layer, head = chosen[0] if chosen else (layers[0], 0)
    if ex.decoder and targets[0] is not None:
        ex = replace(ex, target={**ex.target, "labels": targets[0]})
    view = HeadView.from_example(ex if ex.labels else replace(ex, labels=labels[0]), heads_table=result.heads,
                                 causal=bool(result.model.get("causal")), layer=layer, heads=[head])
    fragment = render_fragment(view.data, "probe-hv-report")
    html = render_template("section_view.html.j2", n=n, n_tokens=ex.n_tokens, precision=1 / SCALE,
                           threshold=view.data["threshold"], view=fragment,
                           words=view.data["units"] is not None)
    record = {"example": ex.index, "tokens": n, "of_tokens": ex.n_tokens, "layers": view.data["layers"],
              "values": view.data["values"], "precision": 1 / SCALE, "line_threshold": view.data["threshold"],
              "html_bytes": len(fragment.encode("utf-8"))}
    files = {EXAMPLES_FILE: examples_bytes(result.examples, labels, targets)}
    return Section("head-view", "Interactive head view", html, files=files, record=record, order=5)


def _target_labels(ex, tokenizer) -> list[str] | None:
    """An encoder-decoder example's target token labels (None for other models)."""
    t = ex.target
    if not ex.decoder or t is None:
        return None
    if t.get("labels") is not None:
        return list(t["labels"])
    return display_tokens(tokenizer, t["text"], t["ids"], [tuple(o) for o in t["offsets"]], t["special"])


def _labelled(ex, labels):
    return replace(ex, labels=labels)
