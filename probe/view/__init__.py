"""Interactive, offline head view (bertviz's head view without its CDN) and notebook helpers.

    from probe import load_model, show
    lm = load_model("minilm")
    show(lm, "The cat sat on the mat.")          # in Jupyter: the view; .save("view.html") a page

:mod:`probe.view.data` prepares the data (rounded probabilities, word units), :mod:`probe.view.html`
renders it (plain JavaScript in ``static/headview.js``), :mod:`probe.view.section` adds it to the
report, :func:`probe.view.grid.label_grid` colours the layer x head grid in a notebook;
:mod:`probe.view.modelview` draws every head as a thumbnail (``probe.model_view``) and
:mod:`probe.view.stepview` one head's attention steps (``probe.attention_steps``' numbers).
"""

from .data import LINE_THRESHOLD, MAX_VALUES, SCALE, view_data, word_attention, word_units
from .grid import label_grid
from .html import VIEW_CSP, HeadView, render_fragment, render_page, show
from .modelview import ModelView, model_view

__all__ = ["HeadView", "show", "view_data", "word_attention", "word_units", "render_fragment", "render_page",
           "label_grid", "ModelView", "model_view", "VIEW_CSP", "SCALE", "MAX_VALUES", "LINE_THRESHOLD"]
