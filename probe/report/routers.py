"""The "Mixture-of-experts routers" section: per MoE layer, each expert's load (its share of the token x k
slots) and mean weight, as a layer x expert heatmap and a table beside the layer's heads (their mean entropy
and primary labels); ``routers.csv`` lists every example token's experts and weights per layer
(:mod:`probe.measures.routers`)."""

from __future__ import annotations

import math

from .sections import Section, render_fragment, section_builder


def _heads_beside(heads, stack: str, layer: int) -> tuple[str, str]:
    """(mean entropy of the layer's heads, its heads' primary labels with counts) from the heads table."""
    rows = heads[heads["layer"] == layer]
    if "stack" in heads:
        rows = rows[rows["stack"] == stack]
    entropy = rows["entropy"].mean() if "entropy" in rows else float("nan")
    labels = rows["label"].value_counts().to_dict() if "label" in rows else {}
    return ("" if math.isnan(entropy) else f"{entropy:.3f}"), ", ".join(f"{k} x{v}" for k, v in labels.items())


@section_builder
def routers_section(result, tokenizer) -> Section | None:
    """The section, or None: the model has no MoE router."""
    routers = result.results.get("routers")
    if routers is None or not routers.layers:
        return None
    load = routers.load()
    E = routers.n_experts
    values = [None if v != v else int(round(v * 1000)) for v in load["load"]]
    fig = {"rows": len(routers.layers), "cols": E, "scale": 1000, "vmin": 0.0, "vmax": 1.0, "cmap": "blues",
           "title": "share of the token slots routed to each expert", "values": values,
           "rowLabels": [f"L{layer}" for _, layer in routers.layers], "colLabels": [str(e) for e in range(E)],
           "xLabel": "expert", "yLabel": "layer", "cellName": "load"}
    rule = ("weights renormalised over the top k" if routers.renormalised
            else "weights as the softmax over every expert gave them (not renormalised)")
    rec = routers.record()
    rows = []
    for x, (stack, layer) in enumerate(routers.layers):
        entropy, labels = _heads_beside(result.heads, stack, layer)
        lay = rec["layers"][x]
        top = max(range(E), key=lambda e: lay["load"][e])
        rows.append([f"L{layer}", f"{top} ({lay['load'][top]:.3f})", f"{lay['imbalance']:.2f}",
                     f"{lay['mean_weight_total']:.3f}", entropy, labels])
    caption = (f"{routers.tokens} tokens, {E} experts, top {routers.top_k} per token; {rule}"
               + (f", times {routers.scaling}" if routers.scaling not in (None, 1, 1.0) else "")
               + ". The experts and weights are the model's own router's (routers.csv: every example token's, per "
               "layer). Imbalance: the largest load x the number of experts (1 = balanced).")
    html = render_fragment("section_table.html.j2", caption=caption,
                           figures=[{"id": "routers-load", "title": fig["title"], "caption": ""}], rows=rows,
                           columns=["layer", "busiest expert (load)", "imbalance", "weight per token",
                                    "heads' mean entropy", "heads' labels"])
    files = {"routers.csv": routers.tokens_frame.to_csv(index=False, float_format="%.6g")} \
        if not routers.tokens_frame.empty else {}
    return Section("routers", "Mixture-of-experts routers", html, figures={"routers-load": fig}, files=files,
                   record=rec, order=28)
