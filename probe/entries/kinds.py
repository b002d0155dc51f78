"""One library call per run kind, by the command's name: each takes a model (a name, or a loaded
:class:`~probe.core.LoadedModel`) and the kind's settings (:mod:`probe.settings`) and returns a
:class:`~probe.entries.result.RunResult` without writing a folder (``save(folder)`` writes the one the
command writes). The command line, a notebook and the live page call these::

    import probe
    from probe.settings import PatchSettings
    lm = probe.load_model("smollm2")
    run = probe.run_patch(lm, PatchSettings(direction="noise"))
    run.tables["patching"]; run.notes; run.save("reports/patch")
    run = probe.run_kind("patch", lm, {"direction": "noise"})   # a request's JSON: settings checked here
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..errors import InputError
from ..settings import SETTINGS, Settings
from .ablation import run_effects, run_prune
from .analyze import run_analyze
from .checks import run_verify
from .compare import run_compare
from .pairs import run_circuit, run_patch, run_path
from .result import Console, RunResult
from .why import run_why

#: Each run kind's call, by the command's name (:data:`probe.settings.SETTINGS` holds its settings class).
RUNS: dict[str, Callable[..., RunResult]] = {
    "analyze": run_analyze, "verify": run_verify, "prune": run_prune, "effects": run_effects, "patch": run_patch,
    "path": run_path, "circuit": run_circuit, "why": run_why, "compare": run_compare}


def run_kind(kind: str, model, settings: Settings | Mapping | None = None, *,
             console: Console | None = None) -> RunResult:
    """Run ``kind`` on ``model`` with ``settings`` (a settings object, or a mapping of its fields checked by
    :meth:`~probe.settings.fields.Settings.from_mapping`): what the live page calls with a request.

    ``compare`` takes no model: ``model`` is None, or two loaded models.

    Raises:
        InputError: an unknown kind, an unknown setting or a value out of bounds; as the kind's call.
    """
    if kind not in RUNS:
        raise InputError(f"unknown run kind {kind!r}; kinds: {', '.join(RUNS)}")
    cls = SETTINGS[kind]
    if not isinstance(settings, Settings):
        settings = cls.from_mapping(settings or {})
    elif not isinstance(settings, cls):
        raise InputError(f"{kind} takes {cls.__name__}, not {type(settings).__name__}")
    if kind == "compare":
        return run_compare(settings, models=model, console=console)
    return RUNS[kind](model, settings, console=console)
