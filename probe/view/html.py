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
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..report.page import choose_heads, json_for_script
from ..runfolder import replace_file
from ..sites import Site
from ..text.tokens import display_tokens
from ..util import plural
from .assets import view_page, view_static
from .data import LINE_THRESHOLD, MAX_VALUES, Alignment, Display, view_data
from .rollout import RolloutView, render_rollout
from .stepview import render_step_view


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
    return view_page(render_views(data, steps), title)


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
        pictures = ""
        if self.images is not None:
            from ..images.view import STYLE as IMAGE_STYLE  # deferred: a text view imports no image stack

            pictures = IMAGE_STYLE + self.images
        return render_views(self.data, self.steps) + extra + pictures

    def save(self, path: str | Path) -> Path:
        """Write a whole offline page with this view; return its path."""
        return replace_file(path, view_page(self.to_html(), self.data.get("title") or "probe head view"))

    def __repr__(self) -> str:
        d = self.data
        return f"HeadView({d['n']} tokens, layers {d['layers']}, {d['heads']} heads, {d['values']:,} values)"

    @classmethod
    def from_example(cls, example, tokenizer=None, *, heads_table=None, causal: bool = False, **kw) -> HeadView:
        """The view of an analysis example (:class:`probe.measures.accumulators.Example`), as far as its maps
        were kept (``analyze(..., example_tokens=...)``). An encoder-decoder model's example adds
        its decoder sites: decoder self-attention drawn on the target's tokens (the decoder start
        token first), cross-attention with target queries and source keys.

        Args:
            tokenizer: the model's tokenizer (for token labels; not needed when the example
                carries its labels, as examples of a loaded run folder do).
            heads_table: the run's heads DataFrame: each head's primary label is shown beside it,
                looked up by its site (stack, layer, kind), never by (layer, head) alone.
            **kw: passed to :func:`probe.view.data.view_data` (layers, layer, heads shown ...); the fields of
                :class:`probe.view.data.Display` (max_values, threshold, title, note, layer_names, head_labels)
                among them make its ``display``.

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
        kw.setdefault("head_labels", site_labels(heads_table, sites))
        shown = {f.name: kw.pop(f.name) for f in fields(Display) if f.name in kw}
        alignment = Alignment((example.word_ids or [])[:n] or None, example.text, example.offsets[:n])
        return cls(view_data(probs, labels[:n], alignment=alignment, sites=sites, causal=causal,
                             display=Display(**shown), **seq, **kw))


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
    (as :func:`probe.loading.seq2seq.sides`)."""
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
        keys = zip(heads_table["stack"], (int(v) for v in heads_table["layer"]), heads_table["kind"])
    else:
        where = {s.layer: x for x, s in enumerate(sites)}
        keys = (int(v) for v in heads_table["layer"])
    # the three columns read as such (not the table's rows: a heads table has dozens of columns)
    return {(where[key], int(h)): str(label) for key, h, label in zip(keys, heads_table["head"], heads_table["label"])
            if label != "mixed" and key in where}


def result_view(result, *, tokenizer=None, example: int = 0, layers=None, layer: int | None = None, heads=None,
                max_values: int = MAX_VALUES, threshold: float = LINE_THRESHOLD, words: bool = True) -> HeadView:
    """The head view of an analysis example (:class:`probe.records.AnalysisResult`, also one read
    back by :func:`probe.compare.load_run`): it draws the maps the analysis kept and runs nothing.
    An analysis of images adds the example image's attention pictures (:mod:`probe.images.view`).

    Args:
        result: the analysis result.
        tokenizer: for a result without stored token labels.
        example: which example of the result.
        layers: layers to include (default: all that fit in ``max_values`` numbers).
        layer, heads: the initial selection (default: the report's first chosen head).
        max_values: most numbers (layers x heads x tokens^2) the view holds.
        threshold: lines are drawn for attention probabilities at or above this.
        words: offer the word-level mode (where the tokens have word ids).

    Returns:
        A :class:`HeadView` (displayed by Jupyter; ``.save(path)`` writes a page).

    Raises:
        InputError: an example that was not kept, bad layers or heads.
    """
    if not 0 <= example < len(result.examples):
        raise InputError(f"example {example} was not kept: the run kept {plural(len(result.examples), 'example')}")
    ex = result.examples[example]
    if not words:
        ex = _without_words(ex)
    view = HeadView.from_example(ex, tokenizer, heads_table=result.heads, causal=bool(result.model.get("causal")),
                                 layers=layers, max_values=max_values, layer=layer, heads=heads, threshold=threshold)
    if heads is None:
        shown = view.data["layers"]
        _open_on(view, *next(((lay, h) for lay, h, *_ in choose_heads(result) if lay in shown),
                             (shown[view.data["initial"]["layer"]], 0)))
    pictures = result.results.get("image_maps") or []  # an analysis of images: its pictures below
    if example < len(pictures):
        from ..images.view import image_html  # deferred: a text view imports no image stack

        view.images = image_html(pictures[example])
    return view


def text_view(maps, sites, source: dict, target: dict | None = None, *, layers, title: str, causal: bool,
              note: str = "", layer: int | None = None, heads=None, threshold: float = LINE_THRESHOLD) -> HeadView:
    """The head view of one text's maps, as a run of the model handed them (:func:`probe.entries.notebook.show`).

    Args:
        maps: per site, [heads, query, key] probabilities (None for a site not included).
        sites: the :class:`~probe.sites.Site` of each map, in forward order.
        source: the input's tokens as :func:`probe.view.data.view_data` takes a side (``tokens``,
            ``word_ids``, ``text``, ``offsets``, ``name``); an encoder-decoder model's source.
        target: an encoder-decoder model's decoder input (its start token and the target), else None.
        layers: the included sites (indices of ``sites``).
        title, note: shown above the view. causal: a causal model's view.
        layer, heads: the initial selection (default: head 0 of the initial layer).
        threshold: lines are drawn for attention probabilities at or above this.

    Raises:
        InputError: bad layers or heads.
    """
    seq2seq = {} if target is None else dict(sides=[target], axes=[side_axes(s) for s in sites], prefixed=True)
    data = view_data(maps, source["tokens"], alignment=Alignment(source["word_ids"], source["text"], source["offsets"]),
                     layers=list(layers), causal=causal, sites=sites, layer=layer, heads=heads,
                     display=Display(threshold=threshold, title=title, note=note,
                                     layer_names=[s.name for s in sites]), **seq2seq)
    view = HeadView(data)
    if heads is None:
        _open_on(view, data["layers"][data["initial"]["layer"]], 0)
    return view


def initial_head(view: HeadView) -> tuple[int, int]:
    """(site index, head) the view opens on: its initial layer's first selected head."""
    d = view.data
    return d["layers"][d["initial"]["layer"]], (d["initial"]["heads"] or [0])[0]


def add_steps(view: HeadView, steps: dict, site_index: int, head: int, *, open_on: bool = True) -> HeadView:
    """Put a step view (:func:`probe.view.stepview.step_view_data`'s dict, of head ``head`` of the site
    at ``site_index``) below the head view; with ``open_on``, the head view opens on that head where
    it includes the site. Returns ``view``."""
    view.steps = steps
    if open_on and site_index in view.data["layers"]:
        _open_on(view, site_index, int(head))  # the head view opens on the step view's head
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
