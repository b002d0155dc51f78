"""What a run of any kind gives back, before any folder is written: :class:`RunResult` (its tables as
DataFrames, its arrays, notes and timings, :meth:`RunResult.save` writing the run folder the command
writes, :meth:`RunResult.records` the JSON a view draws), and :class:`Console`, how a run talks while it
runs (progress bars, the lines a command prints, the time it started).

The run calls (:mod:`probe.entries.kinds`) build these; the command line saves and prints them, a
notebook or the live page reads them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..compare import write_compare
from ..loading import models as loading  # load_model read as an attribute: a test may stand in for it
from ..records import AnalysisResult
from ..report import build_sections, claim_run_dir, run_record, write_run
from ..report.page import json_default
from ..runfolder import claim


@dataclasses.dataclass
class Console:
    """How a run talks while it runs; every callable may be None (silent).

    Attributes:
        progress: show progress bars (tqdm, on stderr).
        announce: given the line that says what runs, once the run is sure to start (``Patching ...``).
        say: given one line as each stage ends (``activation patching: done in 1.2 s``), for a log without bars.
        estimate: given the cost estimate of a circuit run after its first pass, of a patch run's patched
            passes after its first passes, of a path run's other paths after its first, of an effects run's
            ablation passes after its second.
        case: ``probe verify``'s progress, ``case(index, total, name, result or None)``.
        before_load: called once the input is read and checked, before the model loads, with the name a
            default folder is named after (the command claims its folder there, so that a taken folder
            fails before minutes of loading).
        started: ``time.perf_counter()`` when the run started (run.json's ``total_s``), or None.
        timings: seconds measured before the call (``startup_s`` ...), completed by the run.
    """

    progress: bool = False
    announce: Callable[[str], None] | None = None
    say: Callable[[str], None] | None = None
    estimate: Callable[[str], None] | None = None
    case: Callable | None = None
    before_load: Callable[[str], Any] | None = None
    started: float | None = None
    timings: dict = dataclasses.field(default_factory=dict)

    def tell(self, line: str) -> None:
        """``announce(line)`` where there is one."""
        if self.announce is not None:
            self.announce(line)

    def loading(self, name: str) -> None:
        """``before_load(name)`` where there is one (``name``: what a default folder is named after)."""
        if self.before_load is not None:
            self.before_load(name)


def run_model(model, console: Console, **load):
    """The model a run works on: a name is loaded (``load``: :func:`probe.loading.models.load_model`'s keywords,
    the load time in ``console.timings["model_load_s"]``, seconds), a loaded model is used as given; either
    way ``console.loading`` hears the name first.

    Raises:
        as :func:`probe.loading.models.load_model` (a name it cannot load).
    """
    if not isinstance(model, str):
        console.loading(model.name)
        return model
    console.loading(model)
    lm = loading.load_model(model, **load)
    console.timings["model_load_s"] = lm.load_seconds
    return lm


@dataclasses.dataclass
class RunResult:
    """One run of one kind, measured, not yet written.

    Attributes:
        kind: the run kind (``analyze``, ``patch`` ...: :data:`probe.settings.SETTINGS`).
        settings: the :class:`~probe.settings.Settings` the run was made with.
        analysis: the :class:`~probe.records.AnalysisResult` written as the run folder (heads table with the
            kind's columns, each section's result in ``results``); None for ``verify`` and ``compare``.
        measured: the kind's own record (:class:`~probe.effects.patch_run.PatchRun`,
            :class:`~probe.circuits.run.CircuitRun`, :class:`~probe.circuits.path_run.PathRun`,
            :class:`~probe.effects.measure.EffectsResult`, :class:`~probe.pruning.experiment.PruneResult`,
            :class:`~probe.qk.run.WhyRun`, :class:`~probe.verification.VerifyResult`, the comparison frame), or None.
        tables: name -> DataFrame (``heads`` and the kind's own: ``patching``, ``edges`` ...).
        arrays: name -> array where the kind has them (a circuit's edge scores, an analysis's kept maps).
        timings: phase -> seconds (model load, the kind's phases; the report's time is added by :meth:`save`).
        tokenizer: the model's tokenizer (token labels of the report); lm: the model it ran on (or None).
        verification: ``probe analyze --verify``'s record, or None.
        started: ``time.perf_counter()`` when the run started, or None.
        loading_notes: what loading the model said (also among the notes).
        annotated: the input was annotated text (``coref``/``syntax``).
        writes: False on a process other than rank 0 of a distributed run (:meth:`save` writes nothing).
        pair: ``probe compare``'s two results and tokenizers, ``(a, b, tokenizers)``; else None.
    """

    kind: str
    settings: Any
    analysis: AnalysisResult | None
    measured: Any = None
    tables: dict = dataclasses.field(default_factory=dict)
    arrays: dict = dataclasses.field(default_factory=dict)
    timings: dict = dataclasses.field(default_factory=dict)
    tokenizer: Any = None
    lm: Any = None
    verification: dict | None = None
    started: float | None = None
    loading_notes: list = dataclasses.field(default_factory=list)
    annotated: bool = False
    writes: bool = True
    pair: tuple | None = None

    @property
    def notes(self) -> list[str]:
        """What the run said (the run folder's ``run.json`` ``notes``; a comparison's notes)."""
        if self.analysis is not None:
            return self.analysis.notes
        if self.kind == "compare":
            return list(self.measured.attrs.get("notes", []))
        return list(getattr(self.measured, "notes", []))

    def save(self, folder: str | Path | None = None, *, force: bool = False) -> Path | None:
        """Write the run folder the command writes (``index.html``, ``heads.csv``, ``run.json`` and the
        kind's files; ``probe compare``: the comparison folder; ``probe verify``: ``verify.json``).

        Args:
            folder: where (default a new ``reports/<model>-<time>``); claimed, written whole
                (:mod:`probe.runfolder`).
            force: replace probe's own files in ``folder``.

        Returns:
            The folder; None on a process other than rank 0 of a distributed run.

        Raises:
            InputError: ``folder`` taken or not writable.
        """
        if not self.writes:
            return None
        if self.kind == "compare":
            a, b, tokenizers = self.pair
            return write_compare(a, b, folder, force=force, top=self.settings.top, tokenizers=tokenizers)
        if self.analysis is None:
            return self._save_json(folder, force)
        return write_run(self.analysis, self.tokenizer, folder, force=force, verification=self.verification,
                         timings=self.timings, started=self.started)

    def _save_json(self, folder, force: bool) -> Path:
        """``verify.json`` (the record ``probe verify --json`` prints) in a folder of its own."""
        name = self.measured.model if self.measured is not None else "verify"
        with claim_run_dir(folder, f"verify-{Path(str(name)).name}", force, kind="verify") \
                if folder is None else claim(folder, kind="verify", force=force) as held, held.staging() as tmp:
            (tmp / "verify.json").write_text(json.dumps(self.records(), indent=2, default=json_default) + "\n",
                                             encoding="utf-8")
        return held.path

    def records(self) -> dict:
        """The JSON-ready records a view draws: for a run folder's kinds, ``run.json``'s record (model,
        settings, counts, notes, each section's record) and ``heads`` (one dict per head); ``verify``: its
        JSON; ``compare``: one dict per head of the comparison."""
        if self.kind == "compare":
            return {"kind": self.kind, "settings": self.settings.to_json(),
                    "heads": _plain(self.measured.to_dict("records")), "notes": self.notes}
        if self.analysis is None:
            return _plain(self.measured.to_json())
        sections = build_sections(self.analysis, self.tokenizer)
        extra = {"verification": self.verification} if self.verification else {}
        extra.update({sec.id: sec.record for sec in sections if sec.record is not None})
        record = run_record(self.analysis, extra)
        record.pop("created", None)
        return _plain({"kind": self.kind, **record, "heads": self.analysis.heads.to_dict("records")})


def _plain(value) -> Any:
    """``value`` as plain JSON values (NumPy numbers and arrays, NaN as None is left to the reader: NaN stays)."""
    return json.loads(json.dumps(value, default=json_default))


def folder_result(kind: str, settings, lm, analysis: AnalysisResult, measured, console: Console, tables: dict,
                  arrays: dict | None = None) -> RunResult:
    """The :class:`RunResult` of a kind that writes a run folder, measured on ``lm`` (``tables`` without the
    absent ones; the timings and start time the ``console`` holds)."""
    return RunResult(kind, settings, analysis, measured, tables={k: v for k, v in tables.items() if v is not None},
                     arrays=arrays or {}, timings=console.timings, tokenizer=lm.tokenizer, lm=lm,
                     started=console.started, loading_notes=list(lm.notes))
