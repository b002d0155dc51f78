"""The "Attention on the image" section: the pictures of :mod:`probe.images.view` for the images
an analysis kept (``results["image_maps"]``), and each drawn rollout and flow over the grid in run.json."""

from __future__ import annotations

import numpy as np
from markupsafe import Markup, escape

from .sections import Section, section_builder


@section_builder
def image_maps_section(result, tokenizer) -> Section | None:
    """The section, or None where no image was analysed."""
    examples = result.results.get("image_maps")
    if not examples:
        return None
    from ..images.view import STYLE, caption, image_html  # deferred: a text model's page imports no image stack

    html = (STYLE + f'<div class="img-att-section"><p>{escape(caption())}</p>'
            + "".join(image_html(ex) for ex in examples) + "</div>")
    record = {"images": [_record(ex) for ex in examples]}
    return Section("image-attention", "Attention on the image", Markup(html), record=record, order=15)




def _record(ex) -> dict:
    """run.json's entry of one image: its rollout and flow over the grid (flow None, and why, where
    it was left out)."""
    flow = ex.flow()
    return {"name": ex.name, "grid": list(ex.grid), "query": ex.query_name,
            "rollout": np.round(ex.patches(ex.rollout()), 6).tolist(),
            "flow": None if flow is None else np.round(ex.patches(flow), 6).tolist(),
            "flow_note": ex.flow_note()}
