"""Extra sections of the report page, one per analysis that has something to show.

An analysis (pruning, coreference, syntax, head groups ...) contributes a :class:`Section`: its
HTML fragment (rendered from its own template in ``report/templates``, autoescaped), the data of
its canvas figures (drawn by the page's heatmap script like every other figure), files written
beside ``index.html`` (``coref.csv`` ...) and an entry for ``run.json``. Builders are listed in
:data:`probe.report.builders.BUILDERS` and called with the analysis result; each returns None when
its analysis did not run, so the page shows only what was measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from markupsafe import Markup

from .page import _environment


@dataclass
class Section:
    """One extra part of the report.

    Attributes:
        id: anchor and key (``"coreference"``); also the key of ``record`` in run.json.
        title: heading shown on the page.
        html: the fragment (already escaped by its template).
        figures: canvas figure data by figure id (see ``report/static/heatmap.js``).
        files: file name -> text or bytes, written into the run folder.
        record: a JSON-ready summary for run.json, or None.
        order: position among the sections (lower first).
    """

    id: str
    title: str
    html: str
    figures: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    record: dict | None = None
    order: int = 50


def render_fragment(template: str, **context) -> Markup:
    """Render one of ``report/templates`` (autoescaped) as a fragment for :attr:`Section.html`."""
    return Markup(_environment().get_template(template).render(**context))
