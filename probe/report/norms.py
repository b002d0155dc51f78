"""The "Value-weighted attention" section: which stripes shrink, which grow, when each key's weight
is multiplied by the norm of what it carries (Kobayashi et al. 2020, sec. 4; :mod:`probe.capture.values`).

Per layer (per site kind and layer for an encoder-decoder model), the mean over heads of the
weight share of the first-token, sep and punctuation stripes (``first``, ``sep``, ``punct``) next
to their share of the value-weighted map (``first_by_norm`` ...), as grouped bars and a table; and
the heads whose stripe shrinks or grows the most.
"""

from __future__ import annotations

import math

import pandas as pd

from ..measures.stats import NORM_MASS, by_norm
from ..sites import head_name, site_prefix
from .sections import Section, render_fragment, section_builder

#: The stripes compared, with their names on the page.
STRIPES = {"first": "first token", "sep": "sep token", "punct": "punctuation"}
#: Heads listed per stripe and direction.
SHOWN = 5
#: A head is listed only when its stripe moves at least this much (share of the row).
MOVED = 0.01
#: Bar colours: weight share, norm share (Okabe-Ito blue and orange).
COLORS = ("#0072B2", "#E69F00")


def _num(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def _clean(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 5)


def per_layer(heads: pd.DataFrame) -> pd.DataFrame:
    """Mean over the heads of each layer (removed heads left out) of each stripe's weight and norm
    share and of ``norm_mass``: one row per layer, with ``site`` ("L3"; "enc L3", "cross L3" for an
    encoder-decoder model)."""
    keys = [c for c in ("stack", "kind") if c in heads] + ["layer"]
    cols = [c for s in STRIPES for c in (s, by_norm(s))] + [NORM_MASS]
    means = heads.groupby(keys, sort=False)[cols].mean().reset_index()
    if "stack" in means:
        means.insert(0, "site", [f"{site_prefix(r.stack, r.kind)} L{int(r.layer)}" for r in means.itertuples()])
    else:
        means.insert(0, "site", [f"L{int(v)}" for v in means["layer"]])
    return means


def _moved(heads: pd.DataFrame, stripe: str) -> list[list[str]]:
    """Rows (head, direction, weight share, norm share) of the heads whose stripe shrinks most and
    grows most from weight to norm (by at least :data:`MOVED`)."""
    change = (heads[by_norm(stripe)] - heads[stripe]).dropna()
    rows = []
    for direction, index in (("shrinks", change.nsmallest(SHOWN).index), ("grows", change.nlargest(SHOWN).index)):
        for i in index:
            r = heads.loc[i]
            if (change[i] < 0) == (direction == "shrinks") and abs(change[i]) >= MOVED:
                rows.append([STRIPES[stripe], head_name(r, r["head"]), direction, _num(r[stripe]),
                             _num(r[by_norm(stripe)])])
    return rows


@section_builder
def value_weighted_section(result, tokenizer) -> Section | None:
    """The section, or None for a run without value-weighted statistics (``--no-norm``)."""
    heads = result.heads
    if by_norm("first") not in heads:
        return None
    layers = per_layer(heads)
    stripes = [s for s in STRIPES if layers[s].notna().any()]  # sep: only where the tokenizer has one
    figures, blocks = {}, []
    for s in stripes:
        fid = f"norm-{s}"
        title = f"{STRIPES[s]}: weight share vs share of the value-weighted map (mean over heads)"
        figures[fid] = {"kind": "bars", "mode": "group", "title": title, "categories": layers["site"].tolist(),
                        "vmax": 1.0, "xLabel": "layer", "yLabel": "share of the row",
                        "series": [{"name": name, "color": color, "values": [_clean(v) for v in layers[col]]}
                                   for name, color, col in zip(("weight", "norm"), COLORS, (s, by_norm(s)))]}
        blocks.append({"id": fid, "title": title, "caption": ""})
    columns = ["layer", *(c for s in stripes for c in (s, by_norm(s))), NORM_MASS]
    rows = [[r["site"], *(_num(r[c]) for c in columns[1:])] for _, r in layers.iterrows()]
    moved = [row for s in stripes for row in _moved(heads, s)]
    caption = ("Share of each query row that goes to a stripe, by attention weight (A) and by the value-weighted "
               "map N~ (A[i, j] ||f(x_j)|| renormalized per row: the norm of what key j's value carries through "
               "the head's output projection). A stripe that shrinks is read heavily but moves little "
               "(Kobayashi et al. 2020). norm_mass: mean norm of the head's output (hidden-state units).")
    html = render_fragment("section_table.html.j2", caption=caption, figures=blocks, columns=columns, rows=rows)
    if moved:
        caption = f"Heads whose stripe moves most (at most {SHOWN} each way, by {MOVED} or more)."
        html += render_fragment("section_table.html.j2", caption=caption, figures=[], rows=moved,
                                columns=["stripe", "head", "from weight to norm", "weight", "norm"])
    record = {"per_layer": [{k: (_clean(v) if isinstance(v, float) else v) for k, v in row.items()}
                            for row in layers.to_dict("records")]}
    return Section("value-weighted", "Value-weighted attention: what the stripes carry", html, figures=figures,
                   record=record, order=25)
