"""``probe patch`` as a function: activation patching, direct logit attribution and composition scores
of one decoder on prompt pairs, with the head labels of a short analysis (the pairs' clean prompts and
the built-in sample, plus the decoder-circuit probe), and the analysis a run folder is written from (report
section, patch.csv, composition.csv, heads.csv with ``effect``, ``effect_last`` and ``dla`` columns, run.json:
:func:`probe.entries.pairs.run_patch` and its ``save``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import InputError, UnsupportedAnalysisError
from ..loading.models import peek_config, preview_model
from ..patterns import CircuitProbe, circuit_probe
from ..records import AnalysisResult
from ..runs.analysis import analyze, merge_head_columns
from ..text.corpus import sample_texts
from ..text.inputs import Text
from ..util import progress_bar
from .attribution import attribute_heads, correlation
from .components import check_components, measure_components
from .composition import composition_scores
from .dla import direct_logit_attribution, head_grid
from .pairs import LAST_POSITION, encode_pairs, metric_place
from .patching import Pair, builtin_pairs, check_patchable_config, patch_heads


@dataclass
class PatchRun:
    """What ``probe patch`` measured.

    Attributes:
        patching: :func:`~probe.effects.patching.patch_heads`'s frame (``attrs`` included).
        dla: :func:`~probe.effects.dla.direct_logit_attribution`'s frame, or None (``notes`` say why).
        composition: :func:`~probe.effects.composition.composition_scores`'s frame, or None.
        pairs: the pairs; source: where they came from; seconds: phase -> wall time (s); notes.
        components: :func:`~probe.effects.components.measure_components`'s frame when components other
            than z were asked for, else None.
        metric_at: where the metric reads the logits, in words (:func:`~probe.effects.pairs.metric_place`).
    """

    patching: pd.DataFrame
    dla: pd.DataFrame | None
    composition: pd.DataFrame | None
    pairs: list[Pair]
    source: str
    seconds: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    components: pd.DataFrame | None = None
    metric_at: str = LAST_POSITION

    def heads_frame(self) -> pd.DataFrame:
        """``layer``, ``head``, ``effect``, ``effect_last``, ``dla`` (NaN without DLA): columns for heads.csv."""
        extra = ["attribution"] if "attribution" in self.patching.columns else []
        out = self.patching[["stack", "kind", "layer", "head", "effect", "effect_last", *extra]].copy()
        if self.dla is not None:
            L, H = int(out["layer"].max()) + 1, int(out["head"].max()) + 1
            out["dla"] = head_grid(self.dla, L, H)[out["layer"], out["head"]]
        else:
            out["dla"] = np.nan
        return out


#: The stages of ``probe patch``, as the stage lines name them.
STAGES = {"patch_s": "activation patching", "attribution_s": "attribution patching",
          "components_s": "component patching",
          "dla_s": "direct logit attribution", "composition_s": "composition scores", "analyze_s": "labelling analysis"}


def _then(estimate, what: str, join: str = ", "):
    """``estimate`` (a callable given one line, or None) with ``what`` added to its line: the stages that follow
    the patched passes, which the line's figure leaves out."""
    return None if estimate is None else (lambda line: estimate(f"{line}{join}{what}"))


def measure(lm, pairs: list[Pair] | None = None, *, source: str = "built-in IOI set", direction: str = "denoise",
            heads_per_pass: int | None = None, progress=None, rope_offsets: int = 1, say=None,
            method: str = "activation", components: tuple[str, ...] = ("z",), estimate=None) -> PatchRun:
    """Patching, DLA and composition of ``lm`` on ``pairs`` (default the built-in set); ``rope_offsets``:
    composition's RoPE offsets (:func:`~probe.effects.composition.composition_scores`); ``say``: a
    callable given one line as each stage ends (``activation patching: done in 12.3 s``), or None;
    ``method`` ``"attribution"`` adds attribution patching (:func:`~probe.effects.attribution.attribute_heads`)
    beside activation patching: columns ``attribution``, ``attribution_last``, ``attribution_raw``,
    ``attribution_raw_last`` and ``attrs["attribution"]``, the correlations of the two over the heads;
    ``components``: what is patched (:data:`~probe.effects.components.COMPONENTS`): z always (the
    heatmaps and heads.csv read it), the others into ``PatchRun.components``
    (:func:`~probe.effects.components.measure_components`), by the same method; ``estimate``: a callable given
    one line after activation patching's first passes, the time its patched passes will take
    (:class:`~probe.effects.patch_layers.PatchForecast`) and the stages that follow them, or None.

    Raises:
        UnsupportedAnalysisError, InputError: as :func:`~probe.effects.patching.patch_heads`.
    """
    pairs = builtin_pairs() if pairs is None else pairs
    check_components(lm, components)
    seconds, notes = {}, []
    t = time.perf_counter()
    rest = [w for w, on in (("attribution patching", method == "attribution"),
                            ("the other components", tuple(components) != ("z",)), ("DLA", True),
                            ("the composition scores", True)) if on]
    patching = patch_heads(lm, pairs, direction=direction, heads_per_pass=heads_per_pass, progress=progress,
                           estimate=_then(estimate, f"then {', '.join(rest)}", "; "))
    seconds["patch_s"] = time.perf_counter() - t
    _said(say, seconds, "patch_s")
    notes += patching.attrs["notes"]
    if method == "attribution":
        t = time.perf_counter()
        _add_attribution(patching, attribute_heads(lm, encode_pairs(lm, pairs), direction))
        seconds["attribution_s"] = time.perf_counter() - t
        _said(say, seconds, "attribution_s")
    table = None
    if tuple(components) != ("z",):
        t = time.perf_counter()
        table = measure_components(lm, encode_pairs(lm, pairs), components, patching, direction=direction,
                                   attribution=method == "attribution")
        seconds["components_s"] = time.perf_counter() - t
        _said(say, seconds, "components_s")
    results = {}
    steps = (("dla", lambda: direct_logit_attribution(lm, pairs)),
             ("composition", lambda: composition_scores(lm, rope_offsets)))
    for name, fn in steps:
        t = time.perf_counter()
        try:
            results[name] = fn()
        except UnsupportedAnalysisError as exc:
            results[name] = None
            notes.append(f"{name}: {exc}")
        seconds[f"{name}_s"] = time.perf_counter() - t
        _said(say, seconds, f"{name}_s")
    if results["composition"] is not None:  # read from the modules: the scores' approximation said
        notes += [f"composition: {n}" for n in results["composition"].attrs.get("notes", [])]
    if results["dla"] is not None and not results["dla"].attrs["holds"]:
        miss = results["dla"].attrs["residual"]
        notes.append(f"dla: the decomposition misses the model's logit difference by {miss:.3g}")
    return PatchRun(patching, results["dla"], results["composition"], pairs, source, seconds, notes, table,
                    metric_place(lm.kind))


def _add_attribution(patching: pd.DataFrame, attribution: pd.DataFrame) -> None:
    """Attribution patching's columns added to the patching frame (the same rows), and its correlations
    with activation patching in ``attrs["attribution"]``."""
    for col in ("attribution", "attribution_last", "attribution_raw", "attribution_raw_last"):
        patching[col] = attribution[col].to_numpy()
    patching.attrs["attribution"] = {
        "correlation": correlation(patching["effect"], patching["attribution"]),
        "correlation_last": correlation(patching["effect_last"], patching["attribution_last"])}


def _said(say, seconds: dict, key: str) -> None:
    if say is not None:
        say(f"{STAGES[key]}: done in {seconds[key]:.1f} s")


def label_texts(lm, pairs: list[Pair]) -> list:
    """The texts of the labelling analysis: the clean prompts and the built-in sample; an
    encoder-decoder model reads each clean source with its target prefix and answer as the target."""
    if lm.kind == "encoder-decoder":
        return [Text(p.clean, target=(p.prefix + p.answer).strip() or p.answer) for p in pairs]
    return [p.clean for p in pairs] + sample_texts()


def patch_analysis(lm, pairs: list[Pair] | None = None, *, source: str = "built-in IOI set",
                   direction: str = "denoise", heads_per_pass: int | None = None, progress: bool = False,
                   rope_offsets: int = 1, say=None, method: str = "activation",
                   components: tuple[str, ...] = ("z",), estimate=None) -> tuple[PatchRun, AnalysisResult]:
    """Measure (:func:`measure`; ``estimate`` as there) and label the heads with a short analysis: ``(PatchRun,
    the analysis the run folder is written from)`` (heads.csv's columns merged, ``results["patching"]``), no
    folder written.

    Raises:
        InputError, UnsupportedAnalysisError: as :func:`measure`.
    """
    bar = progress_bar(total=2 * lm.geometry.n_layers * lm.geometry.n_heads, desc="patching", unit="head",
                       leave=False) if progress else None
    try:
        result = measure(lm, pairs, source=source, direction=direction, heads_per_pass=heads_per_pass,
                         rope_offsets=rope_offsets, say=say, method=method, components=components,
                         estimate=_then(estimate, "the labelling analysis"),
                         progress=(lambda done, total: bar.update(done - bar.n)) if bar else None)
    finally:
        if bar is not None:
            bar.close()
    t = time.perf_counter()
    analysis = analyze(lm, label_texts(lm, result.pairs), progress=progress,
                       finished=[circuit_probe(lm)] if CircuitProbe.refusal(lm) is None else [])
    result.seconds["analyze_s"] = time.perf_counter() - t
    _said(say, result.seconds, "analyze_s")
    analysis.heads = merge_head_columns(analysis.heads, result.heads_frame())
    analysis.results["patching"] = result
    analysis.notes += [n for n in result.notes if n not in analysis.notes]
    analysis.timings.update({k: round(v, 4) for k, v in result.seconds.items()})
    return result, analysis


def check_before_loading(name: str, pairs: list[Pair], builtin: bool, kind_check=None) -> None:
    """The refusals of ``probe patch`` that the model's config and tokenizer decide, made before its
    weights load (which can take minutes): an encoder without its masked-LM head, the built-in set
    on a model that is not a decoder, pairs of unequal token counts or answers of several tokens
    (:func:`probe.effects.pairs.encode_pairs` on :func:`probe.loading.models.preview_model`). A model that is
    not on this machine (a Hub id) is checked after loading, as before.

    ``kind_check``: a command's own refusal of the model by its kind, called with the preview first
    (``probe circuit`` and ``probe path``: pre-norm models only).

    Raises:
        UnsupportedAnalysisError, InputError: as :func:`probe.effects.patching.patch_heads`, or as
            ``kind_check``.
    """
    config = peek_config(name)
    preview = preview_model(name) if config is not None else None
    if preview is None:
        return
    if kind_check is not None:
        kind_check(preview)
    check_patchable_config(config, name)
    if builtin and preview.kind != "decoder":
        raise builtin_refusal(name, preview.kind)
    if preview.kind != "encoder-decoder":  # its decoder start token is read from the loaded model
        encode_pairs(preview, pairs)


def builtin_refusal(name: str, kind: str) -> InputError:
    """The refusal of the built-in (decoder) pair set on a model of another kind."""
    return InputError(f"the built-in set is for decoders; {name} is an {kind} model: give --pairs FILE "
                      + ("with a [MASK] in each prompt" if kind == "encoder" else
                         "with sources and an optional fifth field, the target prefix"))
