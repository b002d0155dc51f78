"""The composition of a text analysis, once the input is read and the model loaded (texts, pairs,
annotated text, images or clips already turned into sequences): the decoder circuit probe (on decoders),
the pattern analyses, the annotated probes of ``--coref``/``--syntax``, the loop
(:func:`probe.runs.analysis.analyze`), verification, attention rollout and flow of the first examples and
the report's attention-step views, gathered into a :class:`~probe.entries.result.RunResult` (no folder is
written: :meth:`~probe.entries.result.RunResult.save` writes it). :mod:`probe.entries.analyze` dispatches on
the input's kind and calls it.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from contextlib import nullcontext

from ..capture.blocks import AUTO_LENGTH
from ..capture.maps import encode
from ..errors import InputError
from ..measures.accumulators import check_supported
from ..measures.rollout_examples import MAX_EXAMPLES, run_rollout
from ..measures.steps import heads_steps, steps_refusal
from ..patterns import CircuitProbe, circuit_probe, pattern_accumulators
from ..patterns.circuits import SINK_TEXTS
from ..records import AnalysisResult
from ..report.page import choose_heads
from ..runs import distributed
from ..runs.analysis import analyze
from ..settings import AnalyzeSettings
from ..sites import head_name
from ..verification import verify
from ..view.stepview import STEP_MAX_TOKENS, STEPS_KEY, step_view_data
from .result import Console, RunResult


def analyze_texts(lm, texts, settings: AnalyzeSettings | None = None, *, source: str = "texts", annotated=None,
                  console: Console | None = None, world=None, accumulators: list | None = None) -> RunResult:
    """Measure every head of a loaded model on its texts: the composition :func:`probe.entries.analyze.run_analyze`
    runs once the input is read and the model loaded.

    Args:
        lm: a loaded model.
        texts: strings or :class:`~probe.text.inputs.Text` (a list, or a stream read as it is analysed).
        settings: what is measured and how (:class:`~probe.settings.AnalyzeSettings`: batch size, token limit,
            kept examples, thresholds, rollout, verification, block capture, the pattern analyses, value
            weighting, generation); its input fields are not read here.
        source: where the texts come from (``run.json``'s ``settings.input``).
        annotated: the annotated input of ``--coref``/``--syntax``
            (:func:`probe.linguistic.annotated_input`), whose texts are ``texts``; None without.
        console: progress bars, verification's case lines, the start time and earlier timings (:class:`Console`).
        world: the processes of a distributed run (:func:`probe.runs.distributed.detect`); rank 0 keeps the run.
        accumulators: more accumulators to run beside the pattern analyses (an analysis of images adds its grid
            measures, :func:`probe.images.grid_accumulators`).

    Returns:
        A :class:`~probe.entries.result.RunResult` (``analysis``: the :class:`~probe.records.AnalysisResult`;
        ``verification``: the verification record with ``settings.verify``); on a process other than rank 0,
        its share's result, with ``writes`` False.

    Raises:
        InputError, UnsupportedAnalysisError: as :func:`probe.runs.analysis.analyze`.
    """
    s = AnalyzeSettings() if settings is None else settings
    console = Console() if console is None else console
    main = world is None or world.main
    timings = console.timings
    finished, skipped, texts = _circuit_probe(lm, texts, s.circuits and main, timings)
    extra = _pattern_analyses(lm, s.distance, s.map_sequences, s.health, s.query_block, skipped)
    extra += list(accumulators or [])
    if annotated is not None:
        # the readers' own left-out rows are counted once, by rank 0 (the accumulators are summed over ranks)
        extra += annotated.accumulators(lm, prior=main)
        check_supported(lm, extra)  # --coref/--syntax on a model they do not measure: one Error line
    show = console.progress and main
    with distributed.process_group(world) if world else nullcontext():
        result = analyze(lm, distributed.shard(texts, world) if world else texts, batch_size=s.batch_size,
                         max_length=s.max_length, n_examples=s.examples, thresholds=s.thresholds, progress=show,
                         parse_special_tokens=s.parse_special_tokens, accumulators=extra, finished=finished,
                         reduce=distributed.reducer(world), generate=s.generate, value_weighted=s.value_weighted,
                         labels_by=s.labels_by, query_block=s.query_block,
                         announce=console.announce if main else None)
    run = RunResult("analyze", s, result, tables={"heads": result.heads}, arrays=_kept_maps(result),
                    timings=timings, tokenizer=lm.tokenizer, lm=lm, started=console.started,
                    loading_notes=list(lm.notes), annotated=annotated is not None, writes=main)
    if not main:
        return run
    timings["analyze_s"] = result.timings["analyze_s"]
    result.notes.extend(skipped)
    if s.verify:
        run.verification = result.results["verification"] = _verification(lm, console.case if show else None,
                                                                           timings)
    if s.rollout:
        _add_rollout(lm, result, timings)
    result.settings["input"] = source
    report_steps(lm, result)
    return run


def _kept_maps(result: AnalysisResult) -> dict:
    """The kept examples' attention maps, ``example_<i>`` -> [sites, heads, query, key] (cropped as kept)."""
    return {f"example_{i}": ex.probs for i, ex in enumerate(result.examples)}


def _pattern_analyses(lm, distance: bool, map_sequences: int, health, query_block: int | None,
                      skipped: list[str]) -> list:
    """The pattern accumulators that fit ``lm`` (the library's own rule; the others said in ``skipped``)."""
    offered = pattern_accumulators(lm, distance=distance, map_sequences=map_sequences, thresholds=health)
    refused = [(acc.title, acc.refusal(lm)) for acc in offered if acc.refusal(lm) is not None]
    if refused:
        skipped.append("not run: " + "; ".join(_grouped(refused)))
    return _block_ready([acc for acc in offered if acc.refusal(lm) is None], query_block, skipped)


def _grouped(refused: list[tuple[str, str]]) -> list[str]:
    """Refusals (title, reason starting with the title) of the same cause said once: "head distances and
    Kovaleva pattern types are for encoder and decoder models; M is an encoder-decoder model"."""
    causes: dict[str, list[str]] = {}
    for title, reason in refused:
        cause = reason[len(title):] if reason.startswith(title + " is ") else reason
        causes.setdefault(cause, []).append(title if cause is not reason else "")
    said = []
    for cause, titles in causes.items():
        titles = [t for t in titles if t]
        if not titles:
            said.append(cause)
        elif len(titles) == 1:
            said.append(titles[0] + cause)
        else:
            said.append(f"{', '.join(titles[:-1])} and {titles[-1]}" + cause.replace(" is ", " are ", 1))
    return said


def _block_ready(extra: list, query_block: int | None, skipped: list[str]) -> list:
    """The pattern analyses that can run: with ``query_block`` N >= 1 (every batch in blocks) those that
    need whole attention maps are left out, with a line in ``skipped``."""
    if not query_block:
        return extra
    whole = [acc for acc in extra if not getattr(acc, "row_blocks", False)]
    if whole:
        skipped.append(f"not run with --query-block {query_block}: " + ", ".join(a.title for a in whole)
                       + " (they need whole attention maps)")
    return [acc for acc in extra if acc not in whole]


def _circuit_probe(lm, texts, wanted: bool, timings: dict):
    """The decoder circuit probe (:func:`probe.patterns.circuit_probe`, its sinks on the corpus's first
    texts) when wanted and the model is a decoder: ``(finished accumulators, notes, texts)``, ``texts``
    unchanged (a stream is re-chained after its first texts were read)."""
    if not wanted or CircuitProbe.refusal(lm) is not None:  # the probe's own rule: decoders
        return [], [], texts
    t = time.perf_counter()
    sink_texts, texts = _first(texts, SINK_TEXTS)
    finished, notes = [], []
    try:
        finished.append(circuit_probe(lm, sink_texts=sink_texts))
    except InputError as exc:  # e.g. a model whose limit is below the probe's 2 x 25 tokens
        notes.append(f"decoder circuit probe skipped: {exc}")
    timings["circuits_s"] = time.perf_counter() - t
    return finished, notes, texts


def _first(texts, n: int):
    """The first ``n`` texts of ``texts`` and ``texts`` itself, whole (a stream is re-chained)."""
    if hasattr(texts, "__len__"):
        return list(texts[:n]), texts
    head = list(itertools.islice(texts, n))
    return head, itertools.chain(head, texts)


def _verification(lm, progress: Callable | None, timings: dict) -> dict:
    """The verification record for the report (its time in ``timings``)."""
    t = time.perf_counter()
    record = verify(lm, progress=progress).to_json()
    timings["verify_s"] = time.perf_counter() - t
    return record


def _add_rollout(lm, result: AnalysisResult, timings: dict) -> None:
    """Rollout and flow of the first kept examples short enough to re-run whole (``result.results["rollout"]``)."""
    shown = [ex for ex in result.examples if ex.n_tokens <= AUTO_LENGTH]  # rollout re-runs whole maps
    if len(shown) < len(result.examples[:MAX_EXAMPLES]):
        result.notes.append(f"rollout left out for examples longer than {AUTO_LENGTH} tokens: it needs every "
                            "layer's whole attention map")
    if shown:
        result.results["rollout"] = run_rollout(lm, dataclasses.replace(result, examples=shown))
        timings["rollout_s"] = result.results["rollout"].seconds


def report_steps(lm, result: AnalysisResult, *, limit: int = 8) -> list[dict]:
    """The report's step views: the strongest head of each primary label (as the report's chosen heads,
    :func:`probe.report.page.choose_heads`) on the first example, cut to the tokens the analysis kept of
    it; put into ``result.results[STEPS_KEY]`` (the section draws them) and returned.

    Args:
        lm: the model the result was measured on (the steps need it: it is not kept in the result).
        result: :func:`probe.runs.analysis.analyze`'s result.
        limit: most heads.

    Returns:
        :func:`probe.view.stepview.step_view_data` dicts with ``label`` and ``reason`` added ([] without
        examples, and on an image or speech model: the steps re-run the example's text; a capture-only
        model's heads at sites whose projections probe cannot read are left out); ``name`` is the
        head's in the original numbering, ``head`` its slot in a physically
        pruned layer.
    """
    if not result.examples:
        return []
    if hasattr(lm.tokenizer, "discovery_inputs"):  # an image or speech processor: the steps re-read text
        return []
    ex = result.examples[0]
    n = int(ex.probs.shape[-1])
    text = ex.as_text()  # the input as analysed: a sentence pair's second segment, a target
    m = min(n, STEP_MAX_TOKENS)
    if encode(lm, [text], m).input_ids[0].tolist() != list(ex.ids[:m]):
        result.notes.append("attention steps left out: the first example's text no longer gives the tokens "
                            "analysed")
        return []
    chosen, slots = [], []
    for layer, head, label, reason in choose_heads(result, limit=limit):
        if steps_refusal(lm, layer) is not None:  # a capture-only site whose projections probe cannot read
            continue
        slot = head  # the heads table numbers heads as the original model; a pruned layer's slots differ
        if lm.pruned is not None:
            present = lm.pruned.layouts[layer].q
            if head not in present:
                continue
            slot = present.index(head)
        chosen.append((layer, head, label, reason))
        slots.append((layer, slot))
    # every head's steps from the same passes (one per head of the layer with the most chosen heads)
    steps = heads_steps(lm, text, slots, max_length=m, model_probs=False)
    out = []
    for (layer, head, label, reason), st in zip(chosen, steps):
        data = step_view_data(st, encoder_decoder=lm.kind == "encoder-decoder", site_index=layer)
        name = head_name(lm.sites[layer] if lm.kind == "encoder-decoder" else layer, head)
        out.append({**data, "name": name, "label": label, "reason": reason})
    result.results[STEPS_KEY] = out
    return out


