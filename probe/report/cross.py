"""The "Cross-attention" section of an encoder-decoder model's report.

Which source words does each target word read? For the most aligned cross-attention heads
(``aligned``, :mod:`probe.measures.stats`) and the most focused one (``max_weight``), the section draws
each example's map with the source tokens (keys) along the x-axis and the target tokens (queries,
the decoder start token first) along the y-axis, and lists every cross-attention head's
``aligned``, ``distance`` and ``first`` values in a table (also in ``cross.csv``).
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


@section_builder
def cross_attention_section(result, tokenizer) -> Section | None:
    """The section, or None for a model without cross-attention (or a run without examples)."""
    heads = result.heads
    if "kind" not in heads or not (heads["kind"] == "cross").any():
        return None
    examples = [ex for ex in result.examples if ex.decoder][:2]
    figures, blocks = {}, []
    for layer, head, reason in chosen_cross_heads(heads):
        for i, ex in enumerate(examples):
            fid = f"cross-{layer}-{head}-{i}"
            title = f"{head_name(Site('decoder', layer, 'cross'), head)}, example {i + 1}"
            figures[fid] = cross_figure(ex, tokenizer, layer, head, title)
            blocks.append({"id": fid, "title": title, "caption": f"{title}: {reason}"})
    cross = heads[heads["kind"] == "cross"]
    stats = ["aligned", "distance", "first", "sep", "entropy", "max_weight", "label"]
    columns = ["stack", "kind", "layer", "head", *stats]  # cross.csv; the page names each head
    rows = [[head_name(r, r["head"]), *(f"{r[c]:.3f}" if isinstance(r[c], float) else r[c] for c in stats)]
            for r in cross.to_dict("records")]
    caption = ("Decoder queries (target tokens, rows) reading encoder keys (source tokens, columns). aligned = "
               "attention within one source position of the diagonal round(i (S-1)/(T-1)); distance = "
               "expected |i S/T - j| in source tokens.")
    html = render_fragment("section_table.html.j2", caption=caption, figures=blocks, columns=["head", *stats],
                           rows=rows)
    record = {"heads_drawn": [{"stack": "decoder", "kind": "cross", "layer": layer, "head": head, "reason": reason}
                              for layer, head, reason in chosen_cross_heads(heads)]}
    return Section("cross-attention", "Cross-attention: which source tokens each target token reads", html,
                   figures=figures, files={"cross.csv": cross[columns].to_csv(index=False, float_format="%.6g")},
                   record=record, order=20)
