"""The settings of every run kind as typed, frozen objects, checked once where they are built
(:mod:`.fields` the machinery, :mod:`.kinds` the nine classes, :mod:`.live` ``probe live``'s and its
requests'). No heavy library: the command line builds
them before torch is imported, the live page from a request::

    from probe.settings import PatchSettings
    settings = PatchSettings(direction="noise", components="z,q")  # checked here: InputError, one line
    settings = PatchSettings.from_mapping(request_json)              # unknown names refused too
"""

from .fields import OptionConflict, Settings, setting
from .kinds import (
    SETTINGS,
    AnalyzeSettings,
    CircuitSettings,
    CompareSettings,
    EffectsSettings,
    PatchSettings,
    PathSettings,
    PruneSettings,
    VerifySettings,
    WhySettings,
)
from .live import REQUESTS, AblateRequest, EditRequest, HeadRequest, LiveSettings, PatchRequest

__all__ = ["REQUESTS", "SETTINGS", "AblateRequest", "AnalyzeSettings", "CircuitSettings", "CompareSettings",
           "EditRequest", "EffectsSettings", "HeadRequest", "LiveSettings", "OptionConflict", "PatchRequest",
           "PatchSettings", "PathSettings", "PruneSettings", "Settings", "VerifySettings", "WhySettings", "setting"]
