"""Interactive, offline head view (bertviz's head view without its CDN) and notebook helpers.

    from probe import load_model, show
    lm = load_model("minilm")
    show(lm, "The cat sat on the mat.")          # in Jupyter: the view; .save("view.html") a page

:mod:`probe.view.data` prepares the data (rounded probabilities, word units), :mod:`probe.view.html`
renders it (plain JavaScript in ``static/headview.js``), :mod:`probe.view.section` adds it to the
report, :func:`probe.view.grid.label_grid` colours the layer x head grid in a notebook;
:mod:`probe.view.modelview` draws every head as a thumbnail (``probe.model_view``) and
:mod:`probe.view.stepview` one head's attention steps (``probe.attention_steps``' numbers).

The views only draw what they are handed (maps, tokens, an analysis result, a rollout record) and
run no model: ``probe.show``, ``probe.model_view`` and ``probe.rollout_view`` (:mod:`probe.entries.notebook`)
run the model on a text and hand the result to them.
"""

from .assets import VIEW_CSP, view_page
from .data import LINE_THRESHOLD, MAX_VALUES, SCALE, Alignment, Display, view_data, word_attention, word_units
from .grid import label_grid
from .html import HeadView, render_fragment, render_page, result_view, text_view
from .modelview import ModelView, build_model_view, result_model_view

__all__ = ["HeadView", "result_view", "text_view", "view_data", "Alignment", "Display", "word_attention", "word_units",
           "render_fragment", "render_page", "view_page", "label_grid", "ModelView", "build_model_view",
           "result_model_view", "VIEW_CSP", "SCALE", "MAX_VALUES", "LINE_THRESHOLD"]
