"""The "Cross-attention" section of an encoder-decoder model's report.

Which source words does each target word read? For the most aligned cross-attention heads
(``aligned``, :mod:`probe.measures.stats`) and the most focused one (``max_weight``), the section draws
each example's map with the source tokens (keys) along the x-axis and the target tokens (queries,
the decoder start token first) along the y-axis, and lists every cross-attention head's
``aligned``, ``distance`` and ``first`` values in a table (also in ``cross.csv``). A speech model's
panels show each kept clip whole, its frames summed by time to at most :data:`MAX_COLUMNS` columns.
"""

from __future__ import annotations

import numpy as np

from ..sites import Site, head_name
from ..text.tokens import display_tokens
from .sections import Section, render_fragment, section_builder

#: Heads drawn: this many by ``aligned``, then the most focused other head.
ALIGNED_HEADS = 2
#: Tokens per axis drawn at most.
MAX_TOKENS = 48
#: Time columns of a speech clip's panel at most (its frames are summed by time to fit).
MAX_COLUMNS = 100


def chosen_cross_heads(heads) -> list[tuple[int, int, str]]:
    """(layer, head, reason) of the cross-attention heads to draw: the :data:`ALIGNED_HEADS` most
    aligned, then the highest ``max_weight`` among the rest."""
    cross = heads[heads["kind"] == "cross"]
    out = [(int(r.layer), int(r.head), f"aligned = {r.aligned:.2f}")
           for r in cross.sort_values("aligned", ascending=False).head(ALIGNED_HEADS).itertuples()]
    rest = cross[~cross.set_index(["layer", "head"]).index.isin([(layer, head) for layer, head, _ in out])]
    if not rest.empty:
        r = rest.sort_values("max_weight", ascending=False).iloc[0]
        out.append((int(r["layer"]), int(r["head"]), f"max_weight = {r['max_weight']:.2f}"))
    return out


def cross_figure(ex, tokenizer, layer: int, head: int, title: str) -> dict:
    """Canvas data of one example's cross-attention map of one head: rows = target tokens (queries),
    columns = source tokens (keys), each cropped to :data:`MAX_TOKENS`."""
    t = ex.target
    probs = ex.decoder[f"decoder.{layer}.cross"][head]  # [target, source]
    nq, nk = min(probs.shape[0], MAX_TOKENS), min(probs.shape[1], MAX_TOKENS)
    source = (getattr(ex, "labels", None) or display_tokens(tokenizer, ex.text, ex.ids, ex.offsets, ex.special))[:nk]
    target = (t.get("labels") or display_tokens(tokenizer, t["text"], t["ids"], [tuple(o) for o in t["offsets"]],
                                                t["special"]))[:nq]
    cut = [f"first {n} of {total} {what}" for n, total, what in ((nq, probs.shape[0], "target tokens"),
                                                                  (nk, probs.shape[1], "source positions"))
           if n < total]
    return {
        "rows": nq, "cols": nk, "scale": 1000, "vmin": 0.0, "vmax": 1.0, "cmap": "blues",
        "title": title + "".join(f", {c}" for c in cut),  # a cropped map says so
        "values": np.rint(probs[:nq, :nk] * 1000).astype(int).ravel().tolist(),
        "rowLabels": target, "colLabels": source,
        "xLabel": "source token (key)", "yLabel": "target token (query)",
    }


def time_columns(frames: int, limit: int | None = None) -> tuple[int, np.ndarray]:
    """How a clip of ``frames`` encoder frames is thinned by time to at most ``limit`` columns
    (default :data:`MAX_COLUMNS`): ``(k, starts)``, each column the sum of ``k`` consecutive frames
    (the last the rest), ``starts`` [columns] the first frame of each."""
    k = max(1, -(-frames // (limit or MAX_COLUMNS)))
    return k, np.arange(0, frames, k)


def speech_cross_figure(clip, layer: int, head: int, title: str) -> dict:
    """Canvas data of one clip's cross-attention of one head over the whole clip: rows = the rows
    that place the transcript's tokens (the last: the end), columns = time, each the sum of ``k``
    consecutive frames of the clip (:func:`time_columns`), so that a row's mass over the clip is kept
    and every frame of the clip is drawn; the title says how it was thinned."""
    w = np.asarray(clip.cross[layer, head], dtype=np.float64)  # [n + 1, frames of the clip]
    rows, frames = w.shape
    k, starts = time_columns(frames)
    binned = np.add.reduceat(w, starts, axis=1) if frames else w
    seconds = frames * clip.frame_s
    thinned = (f", {frames} frames of {clip.frame_s * 1000:g} ms in {len(starts)} columns of {k} frames "
               f"({k * clip.frame_s:.2f} s) each, weights summed" if k > 1 else f", {frames} frames")
    when = clip.offset_s
    return {
        "rows": rows, "cols": len(starts), "scale": 1000, "vmin": 0.0, "vmax": 1.0, "cmap": "blues",
        "title": f"{title}, the whole clip ({when:.2f}-{when + seconds:.2f} s){thinned}",
        "values": np.rint(binned * 1000).astype(int).ravel().tolist(),
        "rowLabels": [*clip.tokens, "(end)"][:rows], "colLabels": [f"{when + j * clip.frame_s:.2f} s" for j in starts],
        "xLabel": "time (s): frames of the clip" + (f", {k} a column" if k > 1 else ""),
        "yLabel": "transcript token (query)",
    }


@section_builder
def cross_attention_section(result, tokenizer) -> Section | None:
    """The section, or None for a model without cross-attention (or a run without examples). A speech
    model's panels are drawn from its kept clips, over each whole clip (:func:`speech_cross_figure`)."""
    heads = result.heads
    if "kind" not in heads or not (heads["kind"] == "cross").any():
        return None
    clips = [c for c in (result.results.get("speech") or []) if getattr(c, "cross", None) is not None]
    examples = clips[:2] if clips else [ex for ex in result.examples if ex.decoder][:2]
    figures, blocks = {}, []
    for layer, head, reason in chosen_cross_heads(heads):
        for i, ex in enumerate(examples):
            fid = f"cross-{layer}-{head}-{i}"
            title = f"{head_name(Site('decoder', layer, 'cross'), head)}, {'clip' if clips else 'example'} {i + 1}"
            figures[fid] = (speech_cross_figure(ex, layer, head, title) if clips else
                            cross_figure(ex, tokenizer, layer, head, title))
            blocks.append({"id": fid, "title": title, "caption": f"{title}: {reason}"})
    cross = heads[heads["kind"] == "cross"]
    stats = ["aligned", "distance", "first", "sep", "entropy", "max_weight", "label"]
    columns = ["stack", "kind", "layer", "head", *stats]  # cross.csv; the page names each head
    rows = [[head_name(r, r["head"]), *(f"{r[c]:.3f}" if isinstance(r[c], float) else r[c] for c in stats)]
            for r in cross.to_dict("records")]
    caption = ("Decoder queries (target tokens, rows) reading encoder keys (source tokens, columns). aligned = "
               "attention within one source position of the diagonal round(i (S-1)/(T-1)); distance = "
               "expected |i S/T - j| in source tokens.")
    if clips:
        caption = ("Decoder queries (the rows that place the transcript's tokens, the last its end) reading the "
                   "encoder's frames over the whole clip, time across: where a clip has more frames than "
                   f"{MAX_COLUMNS} columns, each column sums consecutive frames (the title says how many). "
                   "aligned and distance as for text, over the encoder's S frames: attention within one frame of "
                   "the diagonal round(i (S-1)/(T-1)); expected |i S/T - j| in frames.")
    html = render_fragment("section_table.html.j2", caption=caption, figures=blocks, columns=["head", *stats],
                           rows=rows)
    record = {"heads_drawn": [{"stack": "decoder", "kind": "cross", "layer": layer, "head": head, "reason": reason}
                              for layer, head, reason in chosen_cross_heads(heads)]}
    title = ("Cross-attention: which frames of the clip each transcript token reads" if clips else
             "Cross-attention: which source tokens each target token reads")
    return Section("cross-attention", title, html,
                   figures=figures, files={"cross.csv": cross[columns].to_csv(index=False, float_format="%.6g")},
                   record=record, order=20)
