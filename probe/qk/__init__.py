"""Why a head attends where it does: its attention scores split by the sources of its query and key
(:func:`why`; the stream walk in :mod:`probe.qk.stream`)."""

from .score import Why, why

__all__ = ["Why", "why"]
