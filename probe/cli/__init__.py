"""The ``probe`` command line: a thin layer over the Python API.

Errors a user can cause end in one line (``Error: ...``) on stderr and exit status 1; a malformed
option (unknown option, a value out of range) or options that do not go together is one line too
and exits with status 2, as click's usage errors do. An interrupt (Ctrl-C) ends in one line and
exit status 130 (128 + SIGINT, as shells report it); what the command was writing is removed
(:mod:`probe.runfolder`). The library never imports click; only this package does.

Modules: :mod:`.group` (the ``probe`` group, error handling, logging, the console script), then one per
command: :mod:`.analyze`, :mod:`.verify`, :mod:`.compare`, :mod:`.prune`, :mod:`.effects`, :mod:`.patch`,
:mod:`.path`, :mod:`.circuit`, :mod:`.why`, :mod:`.live` (``probe live``), :mod:`.listing` (``probe models``);
:mod:`.options` holds the
options several commands share and makes an option from a settings field (:mod:`probe.settings`: its default
and check are the field's), :mod:`.start` what every command does around its one library call
(:mod:`probe.entries.kinds`). A command parses its options into the kind's settings, makes the call, saves
the result and prints: no module here loads a model or computes. Commands import what they need from the
library when they run (``probe --help`` stays fast), and the library looks up
``probe.loading.models.load_model`` at that moment (tests replace it).
"""

from __future__ import annotations

from . import analyze, circuit, compare, effects, listing, live, patch, path, prune, verify, why  # noqa: F401 (each registers its command on ``main``)
from .group import INTERRUPTED, ProbeGroup, entry, hold, main, user_errors

__all__ = ["INTERRUPTED", "ProbeGroup", "entry", "hold", "main", "user_errors"]
