"""The "Attention sinks by position" section: per layer, the share of each query row that goes to
the first token (and to the first four), in power-of-two bins of the query position
(:mod:`probe.measures.sinks`; Xiao et al. 2023, StreamingLLM, sec. 3.1). Shown when the analysed text has at
least :data:`SHOWN_FROM` tokens: shorter texts fill only the first few bins, and the decoder-circuit
section already compares sinks with and without BOS on short inputs.
"""

from __future__ import annotations

import math

import numpy as np

from .sections import Section, render_fragment, section_builder

#: The section appears when the longest analysed sequence has at least this many tokens.
SHOWN_FROM = 256


def _clean(v: float):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 5)


def _grid(frame, column: str, title: str) -> dict:
    """A layer x position-bin heatmap of ``column`` (a mean share, 0..1) of ``frame``
    (:meth:`probe.measures.sinks.SinkProfileResult.frame`)."""
    sites = list(dict.fromkeys(frame["site"]))
    bins = sorted(set(zip(frame["start"], frame["end"])))
    grid = np.full((len(sites), len(bins)), np.nan)
    for r in frame.itertuples():
        grid[sites.index(r.site), bins.index((r.start, r.end))] = getattr(r, column)
    return {
        "rows": len(sites), "cols": len(bins), "scale": 1000, "vmin": 0.0, "vmax": 1.0, "cmap": "blues",
        "title": title, "values": [None if math.isnan(v) else int(round(v * 1000)) for v in grid.ravel()],
        "rowLabels": sites, "colLabels": [f"{a}-{b - 1}" if b - a > 1 else str(a) for a, b in bins],
        "xLabel": "query position", "yLabel": "layer", "cellName": "share of the row",
    }


@section_builder
def sink_profile_section(result, tokenizer) -> Section | None:
    """The section, or None: no profile measured, or no sequence of :data:`SHOWN_FROM` tokens."""
    profile = result.results.get("sink_profile")
    if profile is None or profile.longest < SHOWN_FROM or not profile.sites:
        return None
    frame = profile.frame()
    figures = {"sinks-first": _grid(frame, "first", "A[i, 0]: weight on the first token (mean over heads)"),
               "sinks-first4": _grid(frame, "first4", "weight on the first 4 tokens (mean over heads)")}
    blocks = [{"id": fid, "title": fig["title"], "caption": ""} for fid, fig in figures.items()]
    caption = (f"Share of each query row i that goes to the first token (A[i, 0]) and to the first four tokens, "
               f"by query position (bins [2^k, 2^(k+1))), mean over each layer's heads and the real rows of every "
               f"sequence; longest sequence {profile.longest} tokens. A sink keeps its weight far from the start "
               "(Xiao et al. 2023). Rows 0-3 see only the first tokens in a decoder, so their first-4 share is 1.")
    rows = [[r.site, f"{r.start}-{r.end - 1}", r.rows, f"{r.first:.3f}", f"{r.first4:.3f}"]
            for r in frame.itertuples()]
    html = render_fragment("section_table.html.j2", caption=caption, figures=blocks, rows=rows,
                           columns=["layer", "query positions", "rows", "first token", "first 4 tokens"])
    record = {"longest": profile.longest,
              "per_layer": [{k: (_clean(v) if isinstance(v, float) else v) for k, v in row.items()}
                            for row in frame.to_dict("records")]}
    return Section("sinks-by-position", "Attention sinks by position", html, figures=figures, record=record,
                   order=27)
