"""Extra sections of the report page, one per analysis that has something to show.

An analysis (pruning, coreference, syntax, head groups ...) contributes a :class:`Section`: its
HTML fragment (rendered from its own template in ``report/templates``, autoescaped), the data of
its canvas figures (drawn by the page's heatmap script like every other figure), files written
beside ``index.html`` (``coref.csv`` ...) and an entry for ``run.json``. Builders are listed in
:data:`BUILDERS` and called with the analysis result; each returns None when its analysis did not
run, so the page shows only what was measured.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from markupsafe import Markup


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


#: Section builders, ``"module:function"``; each is called as ``fn(result, tokenizer)`` and returns
#: a :class:`Section` or None.
BUILDERS: list[str] = [
    "probe.report.cross:cross_attention_section",
    "probe.view.section:head_view_section",
    "probe.linguistic.report:coref_section",
    "probe.linguistic.report:syntax_section",
    "probe.patterns.report:health_section",
    "probe.patterns.report:groups_section",
    "probe.patterns.report:types_section",
    "probe.patterns.report:circuits_section",
    "probe.pruning.report:section",
]


def render_fragment(template: str, **context) -> Markup:
    """Render one of ``report/templates`` (autoescaped) as a fragment for :attr:`Section.html`."""
    from . import _environment

    return Markup(_environment().get_template(template).render(**context))


def build_sections(result, tokenizer) -> list[Section]:
    """Every section whose analysis ran, in order."""
    sections = []
    for path in BUILDERS:
        module, _, name = path.partition(":")
        section = getattr(importlib.import_module(module), name)(result, tokenizer)
        if section is not None:
            sections.append(section)
    return sorted(sections, key=lambda s: s.order)
