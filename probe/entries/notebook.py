"""The notebook's views of a model and a text: run the model, then hand the view what it draws.

``probe.show``, ``probe.model_view`` and ``probe.rollout_view`` are these functions. The views in
:mod:`probe.view` only draw (maps, tokens, records they are handed); the forward passes are here and
in the library functions this module calls (:func:`probe.measures.steps.head_steps`,
:func:`probe.measures.rollout_examples.text_rollout`). An analysis result is drawn as it is, nothing run.
"""

from __future__ import annotations

import torch

from ..capture.maps import attention_hooks, encode, forward
from ..core import LoadedModel
from ..errors import InputError
from ..loading.seq2seq import sides
from ..measures.flow import MAX_FLOW_TOKENS
from ..measures.rollout_examples import text_rollout
from ..measures.steps import head_steps, steps_refusal
from ..records import AnalysisResult
from ..text.inputs import Batch, Text
from ..text.tokens import display_tokens
from ..util import plural
from ..view.data import LINE_THRESHOLD, MAX_VALUES, budget_note, check_budget, choose_layers
from ..view.html import HeadView, add_steps, initial_head, result_view, text_view
from ..view.modelview import THUMB_CELLS, ModelView, build_model_view, result_model_view
from ..view.rollout import RolloutView
from ..view.stepview import STEP_MAX_TOKENS, step_view_data


def show(source, text=None, *, tokenizer=None, example: int = 0, layers=None, layer: int | None = None,
         heads=None, max_length: int | None = None, max_values: int = MAX_VALUES,
         threshold: float = LINE_THRESHOLD, words: bool = True, steps=None, rollout: bool = False) -> HeadView:
    """An interactive head view (bertviz's head view, offline), for Jupyter or a page.

    ``show(lm, "The cat sat.")`` runs the model on one text and keeps only the layers shown;
    ``show(result)`` shows an analysis example (:class:`probe.records.AnalysisResult`, also one
    read back by :func:`probe.compare.load_run`; :func:`probe.view.html.result_view`); an analysis
    of images adds the example image's attention pictures (:mod:`probe.images.view`).

    Args:
        source: a :class:`~probe.loading.models.LoadedModel` (with ``text``) or an analysis result.
        text: the text to run (a string or :class:`probe.text.inputs.Text`).
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
            :data:`~probe.view.stepview.STEP_MAX_TOKENS` tokens (on a capture-only model, whose own attention
            code computes the scores, the steps read from its projections and maps, :mod:`probe.measures.steps`;
            none where its site's projections cannot be read, :func:`probe.measures.steps.steps_refusal`);
            ``False``: none.
        rollout: a model and a text only: add the weights | attention rollout | attention flow view
            of the text below (:func:`rollout_view`; Abnar & Zuidema 2020).

    Returns:
        A :class:`~probe.view.html.HeadView` (displayed by Jupyter; ``.save(path)`` writes a page).

    Raises:
        InputError: no text for a model, an example that was not kept, bad layers or heads.
        TypeError: ``source`` neither a loaded model nor an analysis result.
    """
    if isinstance(source, AnalysisResult):
        return result_view(source, tokenizer=tokenizer, example=example, layers=layers, layer=layer, heads=heads,
                           max_values=max_values, threshold=threshold, words=words)
    if not isinstance(source, LoadedModel):
        raise TypeError(f"show() takes a loaded model and a text, or an analysis result; got {type(source).__name__}")
    if text is None or not isinstance(text, (str, Text)):
        raise InputError("show(lm, text) needs one text (a string)")
    batch = encode(source, [text], max_length)
    layers, note = _included_layers(source, batch, layers, max_values)
    maps = _maps(source, batch, layers)
    first, target = batch_sides(source, batch, words)
    view = text_view(maps, source.sites, first, target, layers=layers, title=_title(source, batch, first, target),
                     causal=source.kind != "encoder", note=note, layer=layer, heads=heads, threshold=threshold)
    if rollout:
        view.rollout = rollout_view(source, text, max_length=max_length)
    if steps is False or (steps is None and view.data["n"] > STEP_MAX_TOKENS):
        return view
    site, head = steps if steps is not None else initial_head(view)
    if steps is None and steps_refusal(source, site) is not None:
        return view  # a capture-only model's site whose projections probe cannot read (Reformer's LSH layers)
    st = head_steps(source, text, site, int(head), max_length)
    where = source.sites.index(st["site"])
    data = step_view_data(st, encoder_decoder=source.kind == "encoder-decoder", site_index=where)
    return add_steps(view, data, where, int(head), open_on=heads is None and layer is None)


def model_view(source, text=None, *, tokenizer=None, example: int = 0, heads_table=None,
               max_length: int | None = None, cells: int = THUMB_CELLS) -> ModelView:
    """Every head of every site as a thumbnail of one text's (or one analysis example's) map, with a
    head view that a click on a thumbnail opens the head in (:mod:`probe.view.modelview`).

    Args:
        source: a :class:`~probe.loading.models.LoadedModel` (with ``text``: a string, or
            :class:`probe.text.inputs.Text` with ``target`` for an encoder-decoder model) or an analysis result.
        tokenizer: for a result without stored token labels. example: which example of a result.
        heads_table: a heads DataFrame whose primary labels colour the borders (a result's own by
            default; none for a model and a text).
        max_length: token limit (default: the model's limit). cells: most cells per thumbnail side.

    Returns:
        A :class:`~probe.view.modelview.ModelView` (displayed by Jupyter; ``.save(path)`` writes a page).

    Raises:
        InputError: no text for a model, an example that was not kept.
        TypeError: another kind of source.
    """
    if isinstance(source, AnalysisResult):
        return result_model_view(source, tokenizer=tokenizer, example=example, heads_table=heads_table, cells=cells)
    if not isinstance(source, LoadedModel):
        raise TypeError(f"model_view() takes a loaded model and a text, or an analysis result; "
                        f"got {type(source).__name__}")
    if not isinstance(text, (str, Text)):
        raise InputError("model_view(lm, text) needs one text (a string or probe.Text)")
    batch = encode(source, [text], max_length)
    maps = _maps(source, batch, range(len(source.sites)))
    return build_model_view(maps, source.sites, show(source, text, max_length=max_length), heads_table=heads_table,
                            cells=cells)


def rollout_view(lm: LoadedModel, text: str | Text, *, max_length: int | None = None,
                 max_flow_tokens: int = MAX_FLOW_TOKENS) -> RolloutView:
    """Weights, attention rollout and attention flow of one text side by side (Jupyter; ``.save(path)``):
    :func:`probe.measures.rollout_examples.text_rollout` drawn by :class:`probe.view.rollout.RolloutView`.

    Click a token to see its row; the weights are the mean over heads of the chosen layer. Flow is
    solved for the reported row only ([CLS] / the last token), and only up to ``max_flow_tokens``.

    Raises:
        InputError: an empty text, max_length below 2.
    """
    return RolloutView(text_rollout(lm, text, max_length=max_length, max_flow_tokens=max_flow_tokens))


def _sizes(lm: LoadedModel, batch: Batch) -> list[tuple[int, int]]:
    """(query tokens, key tokens) of the first row at each site (:func:`probe.loading.seq2seq.sides`)."""
    return [tuple(int(b.lengths[0]) for b in sides(site, batch)) for site in lm.sites]


def _included_layers(lm: LoadedModel, batch: Batch, layers, max_values: int) -> tuple[list[int], str]:
    """The sites a head view includes (all that fit in ``max_values`` numbers by default) and the note
    saying which were left out.

    Raises:
        InputError: a layer that is not a site, or chosen layers above ``max_values`` numbers.
    """
    sites, n_heads, size = lm.sites, lm.geometry.n_heads, _sizes(lm, batch)
    n = max(max(qk) for qk in size)
    if layers is None:
        layers = choose_layers(len(sites), n_heads, n, max_values)
        return layers, budget_note(layers, len(sites), n_heads, n, max_values) if len(layers) < len(sites) else ""
    layers = [int(x) for x in layers]
    bad = [x for x in layers if not 0 <= x < len(sites)]
    if bad:
        raise InputError(f"no layer {bad[0]}: {lm.name} has layers 0-{len(sites) - 1}"
                         + (" (sites in lm.sites order)" if lm.kind == "encoder-decoder" else ""))
    check_budget(layers, sum(n_heads * size[x][0] * size[x][1] for x in layers), max_values)
    return layers, ""


def _maps(lm: LoadedModel, batch: Batch, layers) -> list:
    """One forward pass of the batch's first row, keeping only the included sites' maps (float32,
    [heads, query, key] each, cropped to the row's tokens; None for the others)."""
    size, sites = _sizes(lm, batch), lm.sites
    wanted = {sites[x]: x for x in layers}
    maps: list = [None] * len(sites)

    def keep(site, probs):
        if site in wanted:
            nq, nk = size[wanted[site]]
            maps[wanted[site]] = probs[0, :, :nq, :nk].float().cpu().numpy()

    with torch.no_grad(), attention_hooks(lm, keep):
        forward(lm, batch)
    return maps


def _title(lm: LoadedModel, batch: Batch, source: dict, target: dict | None) -> str:
    trunc = " (truncated)" if batch.truncated[0] else ""
    what = plural(len(source["tokens"]), "token") if target is None else (
        f"{plural(len(source['tokens']), 'source token')}, {plural(len(target['tokens']), 'target token')}")
    return f"{lm.name}: {what}{trunc}"


def batch_sides(lm: LoadedModel, batch: Batch, words: bool = True) -> tuple[dict, dict | None]:
    """The first row's sides as :func:`probe.view.data.view_data` takes them: the input (a one-stack
    model's sentence or pair; an encoder-decoder model's source) and, for an encoder-decoder model,
    the decoder's input (its start token and the target), else None.

    Args:
        lm: the model whose tokenizer labels the tokens. batch: the encoded text.
        words: keep the word ids (the view's word-level mode).
    """
    def side(b, text, name):
        m = int(b.lengths[0])
        ids, offsets = b.input_ids[0, :m].tolist(), [tuple(o) for o in b.offsets[0, :m].tolist()]
        return {"tokens": display_tokens(lm.tokenizer, text, ids, offsets, b.special[0, :m].tolist()),
                "word_ids": b.word_ids[0, :m].tolist() if words else None, "text": text, "offsets": offsets,
                "name": name}

    t = batch.texts[0]
    if batch.target is None:
        return side(batch, t.text if t.pair is None else t.text + " " + t.pair, ""), None
    return side(batch, t.text, "source"), side(batch.target, batch.target.texts[0].text, "target")
