"""Extra sections of the report page, one per analysis that has something to show.

An analysis (pruning, coreference, syntax, head groups ...) contributes a :class:`Section`: its
HTML fragment (rendered from its own template in ``report/templates``, autoescaped), the data of
its canvas figures (drawn by the page's heatmap script like every other figure), files written
beside ``index.html`` (``coref.csv`` ...) and an entry for ``run.json``.

The report is a leaf that sections plug into: it imports none of them. A builder, a function
``(result, tokenizer) -> Section | None``, registers itself where it is defined with
:func:`section_builder`; each returns None when its analysis did not run, so the page shows only
what was measured. The modules that define builders are named in :data:`SECTION_MODULES` (plug-ins by
name, as entry points are): :func:`build_sections` imports them when a page is built, so every
section is registered whatever was imported first, and importing the report stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from markupsafe import Markup

from .page import template_environment


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
        lead: the page's title when this section is what the page is about (``probe why``: the head's
            score): the page opens on it, right under that title, and the run that labelled the heads
            follows; None for a section among the others.
    """

    id: str
    title: str
    html: str
    figures: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    record: dict | None = None
    order: int = 50
    lead: str | None = None


def render_fragment(template: str, **context) -> Markup:
    """Render one of ``report/templates`` (autoescaped) as a fragment for :attr:`Section.html`."""
    return Markup(template_environment().get_template(template).render(**context))


#: The registered section builders, in the order they registered (the page sorts the sections by
#: :attr:`Section.order`, distinct for every builder).
BUILDERS: list[Callable[..., Section | None]] = []


def section_builder(build: Callable[..., Section | None]) -> Callable[..., Section | None]:
    """Register ``build`` (a decorator): :func:`build_sections` calls it for every run written.

    Args:
        build: ``(result, tokenizer) -> Section | None``; None when its analysis did not run.

    Returns:
        ``build`` itself.
    """
    if build not in BUILDERS:
        BUILDERS.append(build)
    return build


#: The modules that define section builders (each registers its own with :func:`section_builder`); a new
#: section's module is added here.
SECTION_MODULES = (
    "probe.report.cross", "probe.report.images", "probe.report.norms", "probe.report.speech", "probe.report.sinks",
    "probe.report.routers",
    "probe.patterns.report",
    "probe.linguistic.report", "probe.effects.report", "probe.effects.patch_report", "probe.pruning.report",
    "probe.view.rollout", "probe.view.section", "probe.circuits.report", "probe.circuits.path_report",
    "probe.qk.report",
)


def load_sections() -> list[Callable[..., Section | None]]:
    """Import every module of :data:`SECTION_MODULES` (once; their builders register themselves) and
    return :data:`BUILDERS`."""
    for name in SECTION_MODULES:
        importlib.import_module(name)
    return BUILDERS


def build_sections(result, tokenizer) -> list[Section]:
    """Every registered section whose analysis ran, sorted by :attr:`Section.order`
    (:func:`load_sections` first)."""
    load_sections()
    sections = [s for s in (build(result, tokenizer) for build in BUILDERS) if s is not None]
    return sorted(sections, key=lambda s: s.order)
