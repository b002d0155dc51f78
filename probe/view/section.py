"""The report's interactive head view (section builders registered with :func:`probe.report.sections.section_builder`).

The view shows the first example as the analysis kept it: maps cropped to ``example_tokens``
(default 64) tokens, every layer and head (within :data:`probe.view.data.MAX_VALUES` numbers),
probabilities rounded to 3 decimals. Nothing larger is kept for the view, so the analysis' memory
stays bounded by what is shown (never whole long maps); ``probe.show(lm, text)`` shows whole texts
(512 tokens and more) from Python. The section also writes ``examples.npz`` (every kept example,
float16) so that :func:`probe.compare.load_run` can show and compare the examples later.
"""

from __future__ import annotations

from dataclasses import replace
from html import escape

import numpy as np
from markupsafe import Markup

from ..compare.runs import EXAMPLES_FILE, examples_bytes
from ..report.page import choose_heads
from ..report.sections import Section, section_builder
from ..report.sections import render_fragment as render_template
from ..text.tokens import display_tokens
from ..util import plural
from .data import MAX_VALUES, SCALE, choose_layers
from .html import HeadView, example_maps, render_fragment, site_labels
from .modelview import THUMB_CELLS, model_view_data, render_model_view
from .stepview import STEPS_KEY, render_step_view, step_view_assets

#: The element id of the report's head view (the model view and the step views open heads there).
REPORT_HEAD_VIEW = "probe-hv-report"


@section_builder
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
    n = ex.probs.shape[-1]
    layers = report_layers(ex)
    chosen = [(lay, h) for lay, h, *_ in choose_heads(result) if lay in layers]  # encoder heads: site = layer
    layer, head = chosen[0] if chosen else (layers[0], 0)
    if ex.decoder and targets[0] is not None:
        ex = replace(ex, target={**ex.target, "labels": targets[0]})
    view = HeadView.from_example(ex if ex.labels else replace(ex, labels=labels[0]), heads_table=result.heads,
                                 causal=bool(result.model.get("causal")), layer=layer, heads=[head])
    fragment = render_fragment(view.data, REPORT_HEAD_VIEW)
    html = render_template("section_view.html.j2", n=n, n_tokens=ex.n_tokens, precision=1 / SCALE,
                           threshold=view.data["threshold"], view=fragment,
                           words=view.data["units"] is not None)
    record = {"example": ex.index, "tokens": n, "of_tokens": ex.n_tokens, "layers": view.data["layers"],
              "values": view.data["values"], "precision": 1 / SCALE, "line_threshold": view.data["threshold"],
              "html_bytes": len(fragment.encode("utf-8"))}
    files = {EXAMPLES_FILE: examples_bytes(result.examples, labels, targets)}
    return Section("head-view", "Interactive head view", html, files=files, record=record, order=5)


def report_layers(ex) -> list[int]:
    """The sites (positions in :func:`probe.view.html.example_maps`' order) the report's head view
    holds for example ``ex``: as many as fit in :data:`probe.view.data.MAX_VALUES` numbers."""
    n_heads, n = ex.probs.shape[1], ex.probs.shape[-1]
    n_sites = ex.probs.shape[0] + len(ex.decoder or {})
    longest = max([n] + [max(np.shape(p)[-2:]) for p in (ex.decoder or {}).values()])
    return choose_layers(n_sites, n_heads, longest, MAX_VALUES)


@section_builder
def model_view_section(result, tokenizer):
    """The "Model view" section: every head of the first example as a thumbnail (clicking one opens
    it in the report's head view), or None without examples."""
    if not result.examples:
        return None
    ex = result.examples[0]
    maps, sites = example_maps(ex, bool(result.model.get("causal")))
    data = model_view_data(maps, sites, head_labels=site_labels(result.heads, sites), target=REPORT_HEAD_VIEW,
                           shown=report_layers(ex), title="")
    fragment = render_model_view(data, "probe-mv-report")
    n = sum(len(x["heads"]) for x in data["sites"])
    html = (f'<p class="muted">Example 1: every head\'s map as a thumbnail ({plural(n, "head")}; rows: queries, '
            f'columns: keys; a cell holds the largest probability of its block of tokens). The border is the head\'s '
            f'primary label; click a thumbnail to open it in the head view below.</p>{fragment}')
    record = {"example": ex.index, "heads": n, "cells": THUMB_CELLS, "html_bytes": len(fragment.encode("utf-8"))}
    return Section("model-view", "Model view", Markup(html), record=record, order=4)


@section_builder
def steps_section(result, tokenizer):
    """The "Attention steps" section: the step view of the strongest head of each label on the first
    example (:func:`probe.entries.analyze.report_steps` put them in ``result.results``), or None."""
    steps = result.results.get(STEPS_KEY)
    if not steps:
        return None
    parts = []
    for st in steps:  # the views' style and script once, after them (step_view_assets, below)
        parts.append(f'<h3>{escape(st["name"])}: {escape(st["label"])} ({escape(st["reason"])})</h3>'
                     + render_step_view({**st, "source": REPORT_HEAD_VIEW}, assets=False))
    parts.append(step_view_assets())
    if any(st.get("note") for st in steps):  # a capture-only type: q, k, v from its projections, no from-scratch run
        source = ('q, k and v read from the model\'s own projections and the probabilities it returns (its attention '
                  'is its own code: the line under each rule says whether the softmax of the scaled scores is its '
                  'probabilities, or what term it adds)')
    else:
        source = ('the from-scratch attention on the model\'s own projections (its probabilities equal the model\'s '
                  'to 1e-5)')
    html = ('<p class="muted">For the strongest head of each label, on example 1: every key\'s q&middot;k, the '
            'architecture\'s scale, bias and cap, the mask, the softmax and the value-weighted contribution, from '
            f'{source}. Pin a query token of the same layer in the head view to open it here.</p>' + "".join(parts))
    record = {"heads": [st["name"] for st in steps]}
    return Section("attention-steps", "Attention steps", Markup(html), record=record, order=6)


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
