"""The head view as HTML: a fragment (notebook output, report section) or a whole offline page.

A fragment is one ``<div class="probe-hv" id="probe-hv-...">`` holding its style, its data (a JSON
script element, escaped so that no token can close it) and the view's script
(``static/headview.js``), which mounts the view it sits in: several views on one page (a notebook)
each work, and none defines a page-level global. The script needs no network, no eval and no
library; the policy it needs is :data:`VIEW_CSP` (the report's own policy, which also allows
``img-src data:``, is stricter than nothing and includes it).
"""

from __future__ import annotations

import html
import uuid
from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path

import torch

from ..analysis import AnalysisResult
from ..capture import attention_hooks, encode, forward
from ..core import LoadedModel
from ..errors import InputError
from ..inputs import Text
from ..report.page import _json_for_script
from ..tokens import display_tokens
from .data import LINE_THRESHOLD, MAX_VALUES, budget_note, choose_layers, view_data

#: The Content-Security-Policy the view works under (no network, inline script and style only).
VIEW_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"


@cache
def view_static(name: str) -> str:
    """A file of ``probe/view/static`` (inlined into every view)."""
    text = resources.files("probe").joinpath(f"view/static/{name}").read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():
        raise RuntimeError(f"{name} must not contain a closing script/style tag")
    return text


def render_fragment(data: dict, view_id: str | None = None) -> str:
    """The view as an HTML fragment (a notebook output or a report section).

    Args:
        data: :func:`probe.view.data.view_data`'s dict.
        view_id: the element id (default: a new unique ``probe-hv-<hex>``).
    """
    view_id = view_id or f"probe-hv-{uuid.uuid4().hex[:12]}"
    return (f'<div class="probe-hv" id="{html.escape(view_id)}"><style>{view_static("headview.css")}</style>'
            f'<div class="hv-fallback">probe head view: its script has not run (in Jupyter, run the cell or trust '
            f'the notebook).</div>'
            f'<script type="application/json" class="probe-hv-data">{_json_for_script(data)}</script>'
            f'<script>{view_static("headview.js")}</script></div>')


def render_page(data: dict, title: str = "probe head view") -> str:
    """A whole offline page with one view (under :data:`VIEW_CSP`)."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{VIEW_CSP}">'
            f'<title>{html.escape(title)}</title></head>'
            f'<body style="font-family: sans-serif; margin: 1rem">{render_fragment(data)}</body></html>\n')


class HeadView:
    """An interactive head view of one example; shows itself in Jupyter (``_repr_html_``).

    Attributes:
        data: what the page receives (:func:`probe.view.data.view_data`): probabilities rounded
            to 3 decimals (integers in thousandths).
    """

    def __init__(self, data: dict) -> None:
        self.data = data

    def _repr_html_(self) -> str:
        return render_fragment(self.data)

    def to_html(self) -> str:
        """A fragment with a new element id."""
        return render_fragment(self.data)

    def save(self, path: str | Path) -> Path:
        """Write a whole offline page with this view; return its path."""
        path = Path(path)
        path.write_text(render_page(self.data, self.data.get("title") or "probe head view"), encoding="utf-8")
        return path

    def __repr__(self) -> str:
        d = self.data
        return f"HeadView({d['n']} tokens, layers {d['layers']}, {d['heads']} heads, {d['values']:,} values)"

    @classmethod
    def from_example(cls, example, tokenizer=None, *, heads_table=None, causal: bool = False, **kw) -> HeadView:
        """The view of an analysis example (:class:`probe.accumulators.Example`), as far as its maps
        were kept (``analyze(..., example_tokens=...)``).

        Args:
            tokenizer: the model's tokenizer (for token labels; not needed when the example
                carries its labels, as examples of a loaded run folder do).
            heads_table: the run's heads DataFrame: each head's primary label is shown beside it.
            **kw: passed to :func:`probe.view.data.view_data` (layers, layer, heads shown ...).

        Raises:
            InputError: no tokenizer and no stored labels.
        """
        n = example.probs.shape[-1]
        labels = example.labels
        if labels is None:
            if tokenizer is None:
                raise InputError("a tokenizer is needed to label this example's tokens")
            labels = display_tokens(tokenizer, example.text, example.ids, example.offsets, example.special)
        title = f"Example {example.index + 1}: " + (f"first {n} of {example.n_tokens} tokens" if n < example.n_tokens
                                                    else f"{n} tokens")
        head_labels = None
        if heads_table is not None:
            head_labels = {(int(r["layer"]), int(r["head"])): str(r["label"]) for r in heads_table.to_dict("records")
                           if r["label"] != "mixed"}
        kw.setdefault("title", title)
        return cls(view_data(example.probs, labels[:n], word_ids=(example.word_ids or [])[:n] or None,
                             text=example.text, offsets=example.offsets[:n], head_labels=head_labels,
                             causal=causal, **kw))


def show(source, text=None, *, tokenizer=None, example: int = 0, layers=None, layer: int | None = None,
         heads=None, max_length: int | None = None, max_values: int = MAX_VALUES,
         threshold: float = LINE_THRESHOLD, words: bool = True) -> HeadView:
    """An interactive head view (bertviz's head view, offline), for Jupyter or a page.

    ``show(lm, "The cat sat.")`` runs the model on one text and keeps only the layers shown;
    ``show(result)`` shows an analysis example (:class:`probe.analysis.AnalysisResult`, also one
    read back by :func:`probe.compare.load_run`).

    Args:
        source: a :class:`~probe.models.LoadedModel` (with ``text``) or an analysis result.
        text: the text to run (a string or :class:`probe.inputs.Text`).
        tokenizer: for a result without stored token labels.
        example: which example of a result.
        layers: layers to include (default: all that fit in ``max_values`` numbers).
        layer, heads: the initial selection (default: the first included layer, all its heads).
        max_length: token limit (default: the model's limit).
        max_values: most numbers (layers x heads x tokens^2) the view holds.
        threshold: lines are drawn for attention probabilities at or above this.
        words: offer the word-level mode (where the tokens have word ids).

    Returns:
        A :class:`HeadView` (displayed by Jupyter; ``.save(path)`` writes a page).

    Raises:
        InputError: no text for a model, an example that was not kept, bad layers or heads.
    """
    kw = dict(layer=layer, heads=heads, threshold=threshold)
    if isinstance(source, AnalysisResult):
        if not 0 <= example < len(source.examples):
            raise InputError(f"example {example} was not kept: the run kept {len(source.examples)} example(s)")
        ex = source.examples[example]
        if not words:
            ex = _without_words(ex)
        return HeadView.from_example(ex, tokenizer, heads_table=source.heads, causal=bool(source.model.get("causal")),
                                     layers=layers, max_values=max_values, **kw)
    if not isinstance(source, LoadedModel):
        raise InputError(f"show() takes a loaded model and a text, or an analysis result; got {type(source).__name__}")
    return _show_text(source, text, layers, max_length, max_values, words, kw)


def _without_words(ex):
    return replace(ex, word_ids=None)


def _show_text(lm, text, layers, max_length, max_values, words, kw) -> HeadView:
    """Run one text, keeping only the included layers' maps (float32, [heads, n, n] each)."""

    if text is None or not isinstance(text, (str, Text)):
        raise InputError("show(lm, text) needs one text (a string)")
    batch = encode(lm, [text], max_length)
    n = int(batch.lengths[0])
    sites = lm.sites
    note = ""
    if layers is None:
        layers = choose_layers(len(sites), lm.geometry.n_heads, n, max_values)
        if len(layers) < len(sites):
            note = budget_note(layers, len(sites), lm.geometry.n_heads, n, max_values)
    wanted = {sites[x]: x for x in layers if 0 <= int(x) < len(sites)}
    maps: list = [None] * len(sites)

    def keep(site, probs):
        if site in wanted:
            maps[wanted[site]] = probs[0].float().cpu().numpy()

    with torch.no_grad(), attention_hooks(lm, keep):
        forward(lm, batch)
    t = batch.texts[0]
    full = t.text if t.pair is None else t.text + " " + t.pair
    ids, offsets = batch.input_ids[0, :n].tolist(), [tuple(o) for o in batch.offsets[0, :n].tolist()]
    labels = display_tokens(lm.tokenizer, full, ids, offsets, batch.special[0, :n].tolist())
    word_ids = batch.word_ids[0, :n].tolist() if words else None
    trunc = " (truncated)" if batch.truncated[0] else ""
    data = view_data(maps, labels, word_ids=word_ids, text=full, offsets=offsets, layers=list(layers),
                     layer_names=[s.name for s in sites], causal=lm.kind != "encoder", note=note,
                     title=f"{lm.name}: {n} tokens{trunc}", **kw)
    return HeadView(data)
