"""The attention-step view: for one site and head, pick a query token and see every key's way to its
weight, q . k, times the scale, plus the bias (capped where the model caps), the mask, the softmax,
and the value-weighted contribution ||alpha_ij f_h(x_j)||, with the elementwise products q_d k_d
that make each score drawn as a heat strip. The numbers are :func:`probe.measures.steps.head_steps`' (read
from the model's own attention call; on a capture-only type, from its projections and its maps, with
the term of its score that probe cannot see, implied by its probabilities, as one more column). Plain
JavaScript in ``static/stepview.js``; tokens are only ever set as text, never parsed as markup.
"""

from __future__ import annotations

import html
import uuid

import numpy as np

from ..errors import InputError
from ..report.page import json_for_script
from ..sites import head_name
from .assets import view_static

#: The key of the report's step views in ``AnalysisResult.results``.
STEPS_KEY = "attention_steps"

#: Most query (and key) tokens a step view holds (its data grows with tokens^2 * 5 + tokens * d_head * 3).
STEP_MAX_TOKENS = 160


def _rounded(a: np.ndarray) -> list:
    """float32 values as JSON numbers, 7 significant digits (what float32 holds); NaN (a value probe could
    not compute) as null."""
    return [None if np.isnan(v) else float(f"{v:.7g}") for v in np.asarray(a, dtype=np.float64).ravel()]


def step_view_data(st: dict, *, encoder_decoder: bool = False, source: str | None = None,
                   site_index: int | None = None, query: int = 0) -> dict:
    """What the step view's page receives, from :func:`probe.measures.steps.head_steps`' dict.

    Args:
        st: one head's steps (numpy arrays [Tq, Tk], [Tq, d_head], [Tk, d_head], [Tk]).
        encoder_decoder: name the head with its site kind (``cross L1H3``).
        source: the id of a head view whose pinned query tokens open here (None: standalone).
        site_index: the site's position among the head view's sites. query: the query shown first.

    Returns:
        The record (version 1): its fields since the first version, and ``sink`` (each query row's sink
        logit, one more softmax column, so that the row's probabilities sum to less than 1; null where the
        model has none), added without changing the others. ``valueNorm`` holds null where probe found no
        output projection (gated or differential attention, and every capture-only type). A capture-only
        type's steps (its own attention code, :func:`probe.measures.steps.own_steps`) add ``implied`` (the
        model's own term implied by its probabilities, [Tq, Tk] row-major: log p - scaled score, mean 0 over
        each row's unmasked keys; null where its scaled scores alone give its probabilities, and for every
        other type) and ``note`` (one line on where q, k and v came from and what the check found; null for
        every other type); the view then draws probability = softmax(scaled + implied).

    Raises:
        InputError: more than :data:`STEP_MAX_TOKENS` query or key tokens.
    """
    nq, nk = st["score"].shape
    if max(nq, nk) > STEP_MAX_TOKENS:
        raise InputError(f"the step view holds at most {STEP_MAX_TOKENS} tokens; this text has {max(nq, nk)} "
                         "(use probe.attention_steps for the table of a longer one)")
    site = st["site"]
    return {"version": 1, "site": site.name, "name": head_name(site if encoder_decoder else site.layer, st["head"]),
            "head": int(st["head"]), "kvHead": int(st["kv_head"]), "scale": float(st["scale"]),
            "softcap": None if st["softcap"] is None else float(st["softcap"]), "nq": int(nq), "nk": int(nk),
            "dHead": int(st["q"].shape[1]), "qTokens": list(st["q_tokens"]), "kTokens": list(st["k_tokens"]),
            "q": _rounded(st["q"]), "k": _rounded(st["k"]), "score": _rounded(st["score"]),
            "bias": _rounded(st["bias"]), "scaled": _rounded(st["scaled"]),
            "keep": [int(b) for b in np.asarray(st["keep"]).ravel()], "probs": _rounded(st["probs"]),
            "valueNorm": _rounded(st["value_norm"]), "source": source, "siteIndex": site_index,
            "query": int(query), "hasBias": bool(np.abs(st["bias"]).max() > 0),
            "sink": None if st.get("sink") is None else _rounded(st["sink"]),
            "implied": None if st.get("implied") is None else _rounded(st["implied"]), "note": st.get("note")}


def render_step_view(data: dict, view_id: str | None = None, assets: bool = True) -> str:
    """The step view as an HTML fragment (``static/stepview.js`` mounts it). With ``assets`` False the
    fragment holds its data without the view's style and script: a page of several step views gives
    :func:`step_view_assets` once, after them (a report's step views held the same 11 KB script each)."""
    view_id = view_id or f"probe-sv-{uuid.uuid4().hex[:12]}"
    style, script = (f'<style>{view_static("stepview.css")}</style>',
                     f'<script>{view_static("stepview.js")}</script>') if assets else ("", "")
    return (f'<div class="probe-sv" id="{html.escape(view_id)}">{style}'
            f'<div class="sv-fallback">probe step view: its script has not run.</div>'
            f'<script type="application/json" class="probe-sv-data">{json_for_script(data)}</script>{script}</div>')


def step_view_assets() -> str:
    """The step view's style and script once, to follow fragments rendered with ``assets=False``: the
    script, outside every view, mounts each step view on the page that is not yet mounted."""
    return f'<style>{view_static("stepview.css")}</style><script>{view_static("stepview.js")}</script>'
