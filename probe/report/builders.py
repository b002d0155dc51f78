"""The extra sections of the report page, in one list: each analysis's builder, called as
``fn(result, tokenizer)``, returns a :class:`~probe.report.sections.Section` or None (its analysis
did not run), so the page shows only what was measured."""

from __future__ import annotations

from collections.abc import Callable

from ..effects.patch_report import section as patching_section
from ..effects.report import section as effects_section
from ..linguistic.report import coref_section, syntax_section
from ..patterns.report import circuits_section, groups_section, health_section, types_section
from ..pruning.report import section as pruning_section
from ..view.rollout import rollout_section
from ..view.section import head_view_section, model_view_section, steps_section
from .cross import cross_attention_section
from .images import image_maps_section
from .norms import value_weighted_section
from .sections import Section
from .sinks import sink_profile_section

#: The section builders, in the order they are tried (the page sorts them by ``Section.order``).
BUILDERS: list[Callable[..., Section | None]] = [
    cross_attention_section,
    image_maps_section,
    head_view_section,
    model_view_section,
    steps_section,
    coref_section,
    syntax_section,
    health_section,
    groups_section,
    types_section,
    circuits_section,
    pruning_section,
    value_weighted_section,
    patching_section,
    rollout_section,
    effects_section,
    sink_profile_section,
]


def build_sections(result, tokenizer) -> list[Section]:
    """Every section whose analysis ran, in order."""
    sections = [s for s in (build(result, tokenizer) for build in BUILDERS) if s is not None]
    return sorted(sections, key=lambda s: s.order)
