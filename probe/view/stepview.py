"""The attention-step view: for one site and head, pick a query token and see every key's way to its
weight, q . k, times the scale, plus the bias (capped where the model caps), the mask, the softmax,
and the value-weighted contribution ||alpha_ij f_h(x_j)||, with the elementwise products q_d k_d
that make each score drawn as a heat strip. The numbers are :func:`probe.steps.head_steps`' (the
from-scratch attention on the model's own projections). Plain JavaScript in ``static/stepview.js``;
tokens are only ever set as text, never parsed as markup.
"""

from __future__ import annotations

import html
import uuid

import numpy as np

from ..errors import InputError
from ..inputs import Text
from ..report.page import _json_for_script, choose_heads
from ..sites import head_name
from ..steps import heads_steps
from .assets import view_static

#: The key of the report's step views in ``AnalysisResult.results``.
STEPS_KEY = "attention_steps"

#: Most query (and key) tokens a step view holds (its data grows with tokens^2 * 5 + tokens * d_head * 3).
STEP_MAX_TOKENS = 160


def _rounded(a: np.ndarray) -> list:
    """float32 values as JSON numbers, 7 significant digits (what float32 holds)."""
    return [float(f"{v:.7g}") for v in np.asarray(a, dtype=np.float64).ravel()]


def step_view_data(st: dict, *, encoder_decoder: bool = False, source: str | None = None,
                   site_index: int | None = None, query: int = 0) -> dict:
    """What the step view's page receives, from :func:`probe.steps.head_steps`' dict.

    Args:
        st: one head's steps (numpy arrays [Tq, Tk], [Tq, d_head], [Tk, d_head], [Tk]).
        encoder_decoder: name the head with its site kind (``cross L1H3``).
        source: the id of a head view whose pinned query tokens open here (None: standalone).
        site_index: the site's position among the head view's sites. query: the query shown first.

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
            "query": int(query), "hasBias": bool(np.abs(st["bias"]).max() > 0)}


def render_step_view(data: dict, view_id: str | None = None) -> str:
    """The step view as an HTML fragment (``static/stepview.js`` mounts it)."""
    view_id = view_id or f"probe-sv-{uuid.uuid4().hex[:12]}"
    return (f'<div class="probe-sv" id="{html.escape(view_id)}"><style>{view_static("stepview.css")}</style>'
            f'<div class="sv-fallback">probe step view: its script has not run.</div>'
            f'<script type="application/json" class="probe-sv-data">{_json_for_script(data)}</script>'
            f'<script>{view_static("stepview.js")}</script></div>')


def report_steps(lm, result, *, limit: int = 8) -> list[dict]:
    """The step views of the report: the strongest head of each primary label (as the report's
    chosen heads, :func:`probe.report.page.choose_heads`) on the first example, cut to the tokens
    the analysis kept of it; put into ``result.results[STEPS_KEY]`` and returned.

    Args:
        lm: the model the result was measured on; result: :func:`probe.analysis.analyze`'s result.
        limit: most heads.

    Returns:
        :func:`step_view_data` dicts with ``label`` and ``reason`` added ([] without examples); ``name``
        is the head's in the original numbering, ``head`` its slot in a physically pruned layer.
    """
    if not result.examples or lm.spec.discovered:  # the steps come from the hand spec's from-scratch module
        return []
    ex = result.examples[0]
    n = int(ex.probs.shape[-1])
    text = ex.text if not ex.decoder else Text(ex.text, target=ex.target["text"])
    chosen, slots = [], []
    for layer, head, label, reason in choose_heads(result, limit=limit):
        slot = head  # the heads table numbers heads as the original model; a pruned layer's slots differ
        if lm.pruned is not None:
            present = lm.pruned.layouts[layer].q
            if head not in present:
                continue
            slot = present.index(head)
        chosen.append((layer, head, label, reason))
        slots.append((layer, slot))
    # every head's steps from the same passes (one per head of the layer with the most chosen heads)
    steps = heads_steps(lm, text, slots, max_length=min(n, STEP_MAX_TOKENS), model_probs=False)
    out = []
    for (layer, head, label, reason), st in zip(chosen, steps):
        data = step_view_data(st, encoder_decoder=lm.kind == "encoder-decoder", site_index=layer)
        name = head_name(lm.sites[layer] if lm.kind == "encoder-decoder" else layer, head)
        out.append({**data, "name": name, "label": label, "reason": reason})
    result.results[STEPS_KEY] = out
    return out
