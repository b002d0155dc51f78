"""``python -m probe.cli ...``: the same as ``python -m probe``."""

from . import entry

entry()
