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
from pathlib import Path

import numpy as np
import torch

from ..analysis import AnalysisResult
from ..capture import attention_hooks, encode, forward
from ..core import LoadedModel
from ..errors import InputError
from ..images.view import STYLE as IMAGE_STYLE
from ..images.view import image_html
from ..inputs import Text
from ..report.page import choose_heads, json_for_script
from ..runfolder import replace_file
from ..seq2seq import sides
from ..sites import Site
from ..steps import head_steps
from ..tokens import display_tokens
from ..util import plural
from .assets import VIEW_CSP, view_static
from .data import LINE_THRESHOLD, MAX_VALUES, budget_note, check_budget, choose_layers, view_data
from .rollout import RolloutView, render_rollout, rollout_view
from .stepview import STEP_MAX_TOKENS, render_step_view, step_view_data


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
            f'<script type="application/json" class="probe-hv-data">{json_for_script(data)}</script>'
            f'<script>{view_static("headview.js")}</script></div>')


def render_views(data: dict, steps: dict | None = None) -> str:
    """The head view's fragment, followed by its step view (``steps``: :func:`probe.view.stepview.step_view_data`'s
    dict) wired to it: pinning a query token of the steps' site opens it in the step view."""
    if steps is None:
        return render_fragment(data)
    view_id = f"probe-hv-{uuid.uuid4().hex[:12]}"
    return render_fragment(data, view_id) + render_step_view({**steps, "source": view_id})


def render_page(data: dict, title: str = "probe head view", steps: dict | None = None) -> str:
    """A whole offline page with one view (and its step view; under :data:`VIEW_CSP`)."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{VIEW_CSP}">'
            f'<title>{html.escape(title)}</title></head>'
            f'<body style="font-family: sans-serif; margin: 1rem">{render_views(data, steps)}</body></html>\n')


class HeadView:
    """An interactive head view of one example; shows itself in Jupyter (``_repr_html_``).

    Attributes:
        data: what the page receives (:func:`probe.view.data.view_data`): probabilities rounded
            to 3 decimals (integers in thousandths).
    """

    def __init__(self, data: dict, steps: dict | None = None, rollout: RolloutView | None = None,
                 images: str | None = None) -> None:
        self.data, self.steps, self.rollout, self.images = data, steps, rollout, images

    def _repr_html_(self) -> str:
        return self.to_html()

    def to_html(self) -> str:
        """A fragment with a new element id (and the step view and the rollout view, where there are)."""
        extra = render_rollout(self.rollout.data) if self.rollout is not None else ""
        pictures = IMAGE_STYLE + self.images if self.images is not None else ""
        return render_views(self.data, self.steps) + extra + pictures

    def save(self, path: str | Path) -> Path:
        """Write a whole offline page with this view; return its path."""
        title = html.escape(self.data.get("title") or "probe head view")
        body = self.to_html()
        return replace_file(path, (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                                   f'<meta http-equiv="Content-Security-Policy" content="{VIEW_CSP}">'
                                   f'<title>{title}</title></head>'
                                   f'<body style="font-family: sans-serif; margin: 1rem">{body}</body></html>\n'))

    def __repr__(self) -> str:
        d = self.data
        return f"HeadView({d['n']} tokens, layers {d['layers']}, {d['heads']} heads, {d['values']:,} values)"

    @classmethod
    def from_example(cls, example, tokenizer=None, *, heads_table=None, causal: bool = False, **kw) -> HeadView:
        """The view of an analysis example (:class:`probe.accumulators.Example`), as far as its maps
        were kept (``analyze(..., example_tokens=...)``). An encoder-decoder model's example adds
        its decoder sites: decoder self-attention drawn on the target's tokens (the decoder start
        token first), cross-attention with target queries and source keys.

        Args:
            tokenizer: the model's tokenizer (for token labels; not needed when the example
                carries its labels, as examples of a loaded run folder do).
            heads_table: the run's heads DataFrame: each head's primary label is shown beside it,
                looked up by its site (stack, layer, kind), never by (layer, head) alone.
            **kw: passed to :func:`probe.view.data.view_data` (layers, layer, heads shown ...).

        Raises:
            InputError: no tokenizer and no stored labels.
        """
        n = example.probs.shape[-1]
        labels = _labels(example.labels, tokenizer, example.text, example.ids, example.offsets, example.special)
        title = f"Example {example.index + 1}: " + (f"first {n} of {example.n_tokens} tokens" if n < example.n_tokens
                                                    else plural(n, "token"))
        probs, sites = example_maps(example, causal)
        seq = dict(axes=None, sides=None, prefixed=False)
        if example.decoder:
            names = list(example.decoder)
            t = example.target
            nq = max(np.shape(example.decoder[name])[-2] for name in names)
            target = _labels(t.get("labels"), tokenizer, t["text"], t["ids"], [tuple(o) for o in t["offsets"]],
                             t["special"])[:nq]
            seq = dict(sides=[{"tokens": target, "name": "target"}], prefixed=True,
                       axes=[side_axes(site) for site in sites])
            title = (f"Example {example.index + 1}: {plural(n, 'source token')}, {plural(len(target), 'target token')}"
                     + (" (cropped)" if n < example.n_tokens or len(target) < len(t["ids"]) else ""))
        kw.setdefault("title", title)
        kw.setdefault("layer_names", [site.name for site in sites])
        return cls(view_data(probs, labels[:n], word_ids=(example.word_ids or [])[:n] or None,
                             text=example.text, offsets=example.offsets[:n],
                             head_labels=site_labels(heads_table, sites), sites=sites,
                             causal=causal, **seq, **kw))


def example_maps(example, causal: bool = False) -> tuple[list, list[Site]]:
    """An analysis example's maps, one [heads, query, key] per site, and their sites: the encoder's
    (or a one-stack model's) layers, then an encoder-decoder model's decoder sites."""
    probs = list(example.probs)
    stack = "encoder" if example.decoder or not causal else "decoder"
    sites = [Site(stack, x) for x in range(len(probs))]
    for name in example.decoder or {}:
        probs.append(example.decoder[name])
        sites.append(_site(name))
    return probs, sites


def _labels(stored, tokenizer, text, ids, offsets, special) -> list[str]:
    if stored is not None:
        return list(stored)
    if tokenizer is None:
        raise InputError("a tokenizer is needed to label this example's tokens")
    return display_tokens(tokenizer, text, ids, offsets, special)


def _site(name: str) -> Site:
    stack, layer, kind = name.split(".")
    return Site(stack, int(layer), kind)


def side_axes(site: Site) -> tuple[int, int]:
    """(query side, key side) of an encoder-decoder model's site in a view: 0 = source, 1 = target
    (as :func:`probe.seq2seq.sides`)."""
    if site.stack == "encoder":
        return 0, 0
    return (1, 0) if site.kind == "cross" else (1, 1)


def site_labels(heads_table, sites) -> dict[tuple[int, int], str]:
    """(position of the site in ``sites``, head) -> primary label (``mixed`` left out), each head
    looked up by its own site: (stack, layer, kind) in an encoder-decoder model's table (which has
    those columns), the layer in a one-stack model's."""
    if heads_table is None:
        return {}
    if "stack" in heads_table:
        where = {(s.stack, s.layer, s.kind): x for x, s in enumerate(sites)}
        key = lambda r: (r["stack"], int(r["layer"]), r["kind"])  # noqa: E731
    else:
        where = {s.layer: x for x, s in enumerate(sites)}
        key = lambda r: int(r["layer"])  # noqa: E731
    return {(where[key(r)], int(r["head"])): str(r["label"]) for r in heads_table.to_dict("records")
            if r["label"] != "mixed" and key(r) in where}


def show(source, text=None, *, tokenizer=None, example: int = 0, layers=None, layer: int | None = None,
         heads=None, max_length: int | None = None, max_values: int = MAX_VALUES,
         threshold: float = LINE_THRESHOLD, words: bool = True, steps=None, rollout: bool = False) -> HeadView:
    """An interactive head view (bertviz's head view, offline), for Jupyter or a page.

    ``show(lm, "The cat sat.")`` runs the model on one text and keeps only the layers shown;
    ``show(result)`` shows an analysis example (:class:`probe.analysis.AnalysisResult`, also one
    read back by :func:`probe.compare.load_run`); an analysis of images adds the example image's
    attention pictures (:mod:`probe.images.view`).

    Args:
        source: a :class:`~probe.models.LoadedModel` (with ``text``) or an analysis result.
        text: the text to run (a string or :class:`probe.inputs.Text`).
        tokenizer: for a result without stored token labels.
        example: which example of a result.
        layers: layers to include (default: all that fit in ``max_values`` numbers).
        layer, heads: the initial selection (default: one head, the step view's where there is one,
            else head 0 of the initial layer; a result: the report's first chosen head).
        max_length: token limit (default: the model's limit).
        max_values: most numbers (layers x heads x tokens^2) the view holds.
        threshold: lines are drawn for attention probabilities at or above this.
        words: offer the word-level mode (where the tokens have word ids).
        steps: a model and a text only: ``(site, head)`` adds the attention-step view of that head
            (:mod:`probe.view.stepview`; a pinned query token of that site opens there); default the
            initial layer's first selected head for texts of at most
            :data:`~probe.view.stepview.STEP_MAX_TOKENS` tokens; ``False``: none.
        rollout: a model and a text only: add the weights | attention rollout | attention flow view
            of the text below (:func:`probe.view.rollout.rollout_view`; Abnar & Zuidema 2020).

    Returns:
        A :class:`HeadView` (displayed by Jupyter; ``.save(path)`` writes a page).

    Raises:
        InputError: no text for a model, an example that was not kept, bad layers or heads.
        TypeError: ``source`` neither a loaded model nor an analysis result.
    """
    kw = dict(layer=layer, heads=heads, threshold=threshold)
    if isinstance(source, AnalysisResult):
        if not 0 <= example < len(source.examples):
            raise InputError(f"example {example} was not kept: the run kept {plural(len(source.examples), 'example')}")
        ex = source.examples[example]
        if not words:
            ex = _without_words(ex)
        view = HeadView.from_example(ex, tokenizer, heads_table=source.heads, causal=bool(source.model.get("causal")),
                                     layers=layers, max_values=max_values, **kw)
        if heads is None:
            shown = view.data["layers"]
            _open_on(view, *next(((lay, h) for lay, h, *_ in choose_heads(source) if lay in shown),
                                 (shown[view.data["initial"]["layer"]], 0)))
        pictures = source.results.get("image_maps") or []  # an analysis of images: its pictures below
        if example < len(pictures):
            view.images = image_html(pictures[example])
        return view
    if not isinstance(source, LoadedModel):
        raise TypeError(f"show() takes a loaded model and a text, or an analysis result; got {type(source).__name__}")
    view = _show_text(source, text, layers, max_length, max_values, words, kw)
    if heads is None:
        _open_on(view, view.data["layers"][view.data["initial"]["layer"]], 0)
    if rollout:
        view.rollout = rollout_view(source, text, max_length=max_length)
    if steps is False or (steps is None and view.data["n"] > STEP_MAX_TOKENS):
        return view
    site, head = steps if steps is not None else (view.data["layers"][view.data["initial"]["layer"]],
                                                  (view.data["initial"]["heads"] or [0])[0])
    st = head_steps(source, text, site, int(head), max_length)
    where = source.sites.index(st["site"])
    view.steps = step_view_data(st, encoder_decoder=source.kind == "encoder-decoder", site_index=where)
    if heads is None and layer is None and where in view.data["layers"]:
        _open_on(view, where, int(head))  # the head view opens on the step view's head
    return view


def _open_on(view: HeadView, layer: int, head: int) -> None:
    """Open ``view`` on one head (``layer``: an included layer, as an index of the sites), not on every
    head of a layer (at once a hairball of every line); the reader adds heads by clicking."""
    layers = view.data["layers"]
    if layer in layers:
        removed = view.data["removed"][layers.index(layer)]
        present = [h for h in range(len(removed)) if not removed[h]]
        chosen = int(head) if int(head) in present else present[:1]
        view.data["initial"] = {"layer": layers.index(layer), "heads": [chosen] if isinstance(chosen, int) else chosen}


def _without_words(ex):
    return replace(ex, word_ids=None)


def _show_text(lm, text, layers, max_length, max_values, words, kw) -> HeadView:
    """Run one text, keeping only the included layers' maps (float32, [heads, query, key] each).
    An encoder-decoder model's text is a :class:`probe.inputs.Text` with the target as ``target``:
    each site is drawn with its own query and key tokens (:func:`probe.seq2seq.sides`)."""

    if text is None or not isinstance(text, (str, Text)):
        raise InputError("show(lm, text) needs one text (a string)")
    batch = encode(lm, [text], max_length)
    sites, n_heads = lm.sites, lm.geometry.n_heads
    size = [tuple(int(b.lengths[0]) for b in sides(site, batch)) for site in sites]  # (query, key) per site
    n = max(max(qk) for qk in size)
    note = ""
    if layers is None:
        layers = choose_layers(len(sites), n_heads, n, max_values)
        if len(layers) < len(sites):
            note = budget_note(layers, len(sites), n_heads, n, max_values)
    else:
        layers = [int(x) for x in layers]
        bad = [x for x in layers if not 0 <= x < len(sites)]
        if bad:
            raise InputError(f"no layer {bad[0]}: {lm.name} has layers 0-{len(sites) - 1}"
                             + (" (sites in lm.sites order)" if lm.kind == "encoder-decoder" else ""))
        if all(0 <= x < len(sites) for x in layers):  # view_data says which layers exist otherwise
            check_budget(layers, sum(n_heads * size[x][0] * size[x][1] for x in layers), max_values)
    wanted = {sites[x]: x for x in layers if 0 <= int(x) < len(sites)}
    maps: list = [None] * len(sites)

    def keep(site, probs):
        if site in wanted:
            nq, nk = size[wanted[site]]
            maps[wanted[site]] = probs[0, :, :nq, :nk].float().cpu().numpy()

    with torch.no_grad(), attention_hooks(lm, keep):
        forward(lm, batch)
    source, target = _batch_tokens(lm, batch, words, pair_is_target=batch.target is not None)
    seq2seq = {} if target is None else dict(sides=[target], axes=[side_axes(s) for s in sites], prefixed=True)
    trunc = " (truncated)" if batch.truncated[0] else ""
    what = plural(len(source["tokens"]), "token") if target is None else (
        f"{plural(len(source['tokens']), 'source token')}, {plural(len(target['tokens']), 'target token')}")
    data = view_data(maps, source["tokens"], word_ids=source["word_ids"], text=source["text"],
                     offsets=source["offsets"], layers=list(layers), layer_names=[s.name for s in sites],
                     causal=lm.kind != "encoder", note=note, title=f"{lm.name}: {what}{trunc}", sites=sites,
                     **seq2seq, **kw)
    return HeadView(data)


def _batch_tokens(lm, batch, words: bool, pair_is_target: bool) -> tuple[dict, dict | None]:
    """The first row's sides as :func:`view_data` takes them: the input (a one-stack model's
    sentence or pair; an encoder-decoder model's source) and, for an encoder-decoder model, the
    decoder's input (its start token and the target)."""
    def side(b, text, name):
        m = int(b.lengths[0])
        ids, offsets = b.input_ids[0, :m].tolist(), [tuple(o) for o in b.offsets[0, :m].tolist()]
        return {"tokens": display_tokens(lm.tokenizer, text, ids, offsets, b.special[0, :m].tolist()),
                "word_ids": b.word_ids[0, :m].tolist() if words else None, "text": text, "offsets": offsets,
                "name": name}

    t = batch.texts[0]
    if not pair_is_target:
        return side(batch, t.text if t.pair is None else t.text + " " + t.pair, ""), None
    return side(batch, t.text, "source"), side(batch.target, batch.target.texts[0].text, "target")
