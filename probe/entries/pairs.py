"""The run kinds on prompt pairs as library calls: ``probe patch`` (:func:`run_patch`), ``probe path``
(:func:`run_path`) and ``probe circuit`` (:func:`run_circuit`). Each reads the pairs, checks them and
the model before its weights load (a bad pairs file or a model the kind refuses fails before minutes of
loading), loads the model (or takes a loaded one), measures, labels the heads with a short analysis and
returns a :class:`~probe.entries.result.RunResult`: no folder is written until ``save``.

Example::

    from probe.settings import PatchSettings, PathSettings, CircuitSettings
    run = probe.run_patch(lm, PatchSettings(direction="noise"))
    run = probe.run_path(lm, PathSettings(senders="L1H0", receivers="logits"))
    run = probe.run_circuit(lm, CircuitSettings(method="eap", edges=20))
"""

from __future__ import annotations

from collections.abc import Callable

from ..circuits.path_run import check_arguments, path_analysis
from ..circuits.run import circuit_analysis
from ..circuits.wiring import check_kind
from ..effects.components import check_components
from ..effects.patch_report import component_rows
from ..effects.patch_run import builtin_refusal, check_before_loading, patch_analysis
from ..effects.patching import check_patchable
from ..loading import models as loading  # load_model read as an attribute: a test may stand in for it
from ..settings import CircuitSettings, PatchSettings, PathSettings
from ..text.pairfile import pair_input
from ..util import plural
from .result import Console, RunResult, folder_result, run_model


def open_pairs(model, pairs_file: str | None, pairs, console: Console, *, device=None, dtype=None,
               check: Callable | None = None, kind_check: Callable | None = None):
    """The pairs (``pairs`` as given, else ``pairs_file``'s, else the built-in indirect-object pairs) checked
    against the model's tokenizer before its weights load, then the model loaded (a masked-LM head where the
    checkpoint has one) and checked.

    Args:
        model: a model name or a loaded model.
        pairs_file: the settings' pairs file (None: the built-in pairs, decoders only).
        pairs: :class:`~probe.effects.patching.Pair` objects already read (the command reads the file before
            torch is imported), or None.
        console: ``before_load`` is called between the checks and the load (the command claims its folder).
        device, dtype: where and how a named model loads.
        check: called with the loaded model before anything runs (raises to refuse it).
        kind_check: the kind's refusal by the model's kind, before the weights load (on the model's
            preview, where it is on this machine) and again once loaded.

    Returns:
        ``(lm, pairs, source)``.

    Raises:
        InputError: a bad pairs file, pairs that do not fit the tokenizer, the built-in pairs on a model
            that is not a decoder; UnsupportedAnalysisError: as ``check`` and ``kind_check``.
    """
    builtin = pairs is None and pairs_file is None
    if pairs is None:
        pairs, source = pair_input(pairs_file)
    else:
        pairs, source = list(pairs), str(pairs_file or "pairs")
    if isinstance(model, str):
        check_before_loading(model, pairs, builtin=builtin, kind_check=kind_check)  # weights take minutes
    lm = run_model(model, console, dtype=dtype, device=device, head="auto")
    for each in (kind_check, check):
        if each is not None:
            each(lm)
    if lm.kind != "decoder" and builtin:
        raise builtin_refusal(lm.name, lm.kind)
    return lm, pairs, source


def run_patch(model, settings: PatchSettings | None = None, *, pairs=None, console: Console | None = None,
              device=None, dtype=None) -> RunResult:
    """``probe patch`` as one call: activation patching of every head between clean and corrupted prompts,
    direct logit attribution, composition scores, the heads labelled by a short analysis (no folder written).

    Args:
        model: a model name or a :class:`~probe.core.LoadedModel` (a decoder, an encoder with its masked-LM
            head, or an encoder-decoder model).
        settings: :class:`~probe.settings.PatchSettings` (pairs file, direction, method, components, heads per
            pass, RoPE offsets).
        pairs: :class:`~probe.effects.patching.Pair` objects instead of the settings' file.
        console: progress bars (else a line per stage through ``say``), the start line (``announce``), the
            patched passes' time after the first passes (``estimate``).
        device, dtype: where and how a named model loads.

    Returns:
        A :class:`~probe.entries.result.RunResult`: ``tables`` ``heads``, ``patching``, ``dla``,
        ``composition``, ``components`` (those measured); ``measured`` the
        :class:`~probe.effects.patch_run.PatchRun`.

    Raises:
        InputError, UnsupportedAnalysisError: as :func:`probe.effects.patch_run.measure`; pairs or a model
            refused before loading (:func:`open_pairs`).
    """
    s = PatchSettings() if settings is None else settings
    console = Console() if console is None else console

    def check(lm) -> None:
        check_patchable(lm)
        check_components(lm, s.components)

    lm, pairs, source = open_pairs(model, s.pairs, pairs, console, device=device, dtype=dtype, check=check)
    console.tell(f"Patching {lm.name} ({plural(len(lm.sites) * lm.geometry.n_heads, 'head')}) on "
                 f"{plural(len(pairs), 'pair')} ({source}), {s.direction}")
    measured, analysis = patch_analysis(lm, pairs, source=source, direction=s.direction,
                                        heads_per_pass=s.heads_per_pass, progress=console.progress,
                                        rope_offsets=s.rope_offsets, method=s.method, components=s.components,
                                        say=None if console.progress else console.say,  # no bars: a line a stage
                                        estimate=console.estimate)
    tables = {"heads": analysis.heads, "patching": measured.patching, "dla": measured.dla,
              "composition": measured.composition, "components": measured.components}
    return folder_result("patch", s, lm, analysis, measured, console, tables)


def patch_components(run: RunResult) -> list[dict]:
    """The component lines' rows of a patch run (:func:`probe.effects.patch_report.component_rows`; [] with z only)."""
    table = run.measured.components
    return component_rows(table) if table is not None else []


def run_path(model, settings: PathSettings, *, pairs=None, console: Console | None = None, device=None,
             dtype=None) -> RunResult:
    """``probe path`` as one call: path patching of each sender head into each receiver (a head's q, k or v
    input, or the logits) and of all together, the heads labelled by a short analysis (no folder written).

    Args:
        model: a model name or a loaded pre-norm model the circuit graph fits.
        settings: :class:`~probe.settings.PathSettings` (senders, receivers, pairs file).
        pairs, console, device, dtype: as :func:`run_patch` (``console.estimate``: the other paths' time
            after the first, :func:`probe.circuits.path_run.rest_line`).

    Returns:
        A :class:`~probe.entries.result.RunResult`: ``tables`` ``heads`` and ``path`` (one row per sender and
        receiver); ``measured`` the :class:`~probe.circuits.path_run.PathRun`.

    Raises:
        UnsupportedAnalysisError: a model outside the graph. InputError: bad names, pairs that do not encode.
    """
    console = Console() if console is None else console
    if isinstance(model, str):  # the heads' ranges from the config, before the folder is claimed and weights load
        check_arguments(settings.senders, settings.receivers, loading.peek_config(model))
    lm, pairs, source = open_pairs(model, settings.pairs, pairs, console, device=device, dtype=dtype,
                                   kind_check=lambda lm: check_kind(lm, "path patching"))  # pre-norm models
    measured, analysis = path_analysis(lm, settings.senders, settings.receivers, pairs, source=source,
                                       progress=console.progress, estimate=console.estimate)
    return folder_result("path", settings, lm, analysis, measured, console,
                   {"heads": analysis.heads, "path": measured.frame})


def run_circuit(model, settings: CircuitSettings | None = None, *, pairs=None, console: Console | None = None,
                device=None, dtype=None) -> RunResult:
    """``probe circuit`` as one call: every edge of the graph of heads and MLPs scored by attribution
    patching (EAP, EAP-IG), the circuit of the top-scoring edges (or greedy), its faithfulness against
    random circuits, the heads labelled by a short analysis (no folder written).

    Args:
        model: a model name or a loaded pre-norm model the circuit graph fits.
        settings: :class:`~probe.settings.CircuitSettings`.
        pairs, device, dtype: as :func:`run_patch`.
        console: progress bars (else a line per stage through ``say``), the plan line (``announce``, once the
            graph is checked), the cost estimate after the first pass (``estimate``).

    Returns:
        A :class:`~probe.entries.result.RunResult`: ``tables`` ``heads``, ``edges``, ``nodes``, ``faithfulness``;
        ``arrays`` ``scores`` [edges] and ``circuit`` [edges] (boolean); ``measured`` the
        :class:`~probe.circuits.run.CircuitRun`.

    Raises:
        UnsupportedAnalysisError: a model outside the graph. InputError: pairs that do not encode, ``edges``
            larger than the graph.
    """
    s = CircuitSettings() if settings is None else settings
    console = Console() if console is None else console
    lm, pairs, source = open_pairs(model, s.pairs, pairs, console, device=device, dtype=dtype,
                                   kind_check=check_kind)  # pre-norm models
    m = 1 if s.method == "eap" else s.steps

    def plan(graph, sizes: int, n_batches: int) -> None:  # once the graph is checked: a model it does not fit gets
        # only its error
        console.tell(f"Circuit of {lm.name} on {plural(len(pairs), 'pair')} ({source}), {s.method}"
                     f"{f' m={m} ({s.points} points)' if s.method == 'eap-ig' else ''}, {graph.n_edges} edges: cost "
                     f"{n_batches * (2 + m)} forward and {n_batches * m} backward passes for the scores, about "
                     f"{n_batches} x (4 + {sizes} sizes x {1 + s.seeds}) passes for faithfulness"
                     + (f", up to {n_batches} x {s.max_passes} for greedy" if s.select == "greedy" else ""))

    measured, analysis = circuit_analysis(lm, pairs, settings=s, source=source, progress=console.progress, plan=plan,
                                          say=None if console.progress else console.say, estimate=console.estimate)
    tables = {"heads": analysis.heads, "edges": measured.edges_frame(), "nodes": measured.nodes_frame(),
              "faithfulness": measured.faithfulness.frame}
    return folder_result("circuit", s, lm, analysis, measured, console, tables,
                   {"scores": measured.scores, "circuit": measured.circuit})
