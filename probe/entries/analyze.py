"""``probe analyze`` as a function: the run a notebook gets by calling :func:`analyze_run` is the one
the command writes. It composes the decoder circuit probe (on decoders), the pattern analyses, the
annotated probes of ``--coref``/``--syntax``, the loop (:func:`probe.runs.analysis.analyze`), verification,
attention rollout and flow of the first examples, the report's attention-step views, and the run
folder (:func:`probe.report.write_run`); :func:`analysis_input` reads what ``--text``, ``--corpus``,
``--pairs``, ``--coref`` and ``--syntax`` name, :func:`announcement` and :func:`start_up_note` are the
lines the command prints. The command line only reads options and prints.

Example::

    from probe import load_model
    from probe.entries.analyze import analyze_run
    lm = load_model("minilm")
    result, folder = analyze_run(lm, ["The cat sat on the mat."], out="reports/cat")
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from ..capture.blocks import AUTO_LENGTH
from ..capture.maps import encode
from ..errors import InputError
from ..linguistic import annotated_input
from ..loading.checkpoints import cache_dir
from ..loading.seq2seq import stack_depths
from ..measures.accumulators import check_supported
from ..measures.rollout_examples import MAX_EXAMPLES, run_rollout
from ..measures.steps import heads_steps
from ..patterns import CircuitProbe, circuit_probe, pattern_accumulators
from ..patterns.circuits import SINK_TEXTS
from ..records import AnalysisResult
from ..report import claim_run_dir, write_run
from ..report.page import choose_heads
from ..runs import distributed
from ..runs.analysis import analyze
from ..sites import head_name
from ..text.corpus import check_texts, count_sequences, iter_corpus, iter_pairs, peek, sample_texts  # noqa: F401 (count_sequences: re-exported)
from ..util import plural
from ..verification import verify
from ..view.stepview import STEP_MAX_TOKENS, STEPS_KEY, step_view_data


def analyze_run(lm, texts, *, out=None, force: bool = False, source: str = "texts", annotated=None,
                batch_size: int = 16, max_length: int | None = None, examples: int = 3, thresholds=None,
                parse_special_tokens: bool = False, rollout: bool = True, run_verify: bool = False,
                query_block: int | None = None, distance: bool = True, map_sequences: int = 200,
                circuits: bool = True, health=None, value_weighted: bool = True, labels_by: str = "weight",
                generate: int | None = None, progress: bool = False, world=None, timings: dict | None = None,
                started: float | None = None, verify_progress: Callable | None = None,
                accumulators: list | None = None) -> tuple[AnalysisResult, Path | None]:
    """Measure every head of ``lm`` on ``texts`` and write the run folder, as ``probe analyze`` does.

    Args:
        lm: a loaded model.
        texts: strings or :class:`~probe.text.inputs.Text` (a list, or a stream read as it is analysed).
        out: the run folder (claimed before anything runs; default a new ``reports/<model>-<time>``).
        force: replace probe's own files in ``out``.
        source: where the texts come from (``run.json``'s ``settings.input``).
        annotated: the annotated input of ``--coref``/``--syntax``
            (:func:`probe.linguistic.annotated_input`), whose texts are ``texts``; None without.
        rollout: add attention rollout and flow of the first
            :data:`~probe.measures.rollout_examples.MAX_EXAMPLES` kept examples.
        run_verify: verify the from-scratch attention against the model and add it to the report.
        distance, map_sequences, circuits, health: the pattern analyses (``--no-distance`` ...).
        world: the processes of a distributed run (:func:`probe.runs.distributed.detect`); rank 0 writes.
        timings: seconds measured before this call (start-up, model load), completed here.
        started: ``time.perf_counter()`` when the run started (for the total in ``run.json``).
        verify_progress: called by :func:`probe.verification.verify` as its cases run (or None).
        accumulators: more accumulators to run beside the pattern analyses (an analysis of
            images adds its grid measures, :func:`probe.images.grid_accumulators`).
        batch_size, max_length, examples, thresholds: as :func:`probe.runs.analysis.analyze`.
        parse_special_tokens, query_block, value_weighted: as :func:`probe.runs.analysis.analyze`.
        labels_by, generate, progress: as :func:`probe.runs.analysis.analyze`.

    Returns:
        ``(result, run folder)``; on a process other than rank 0, ``(its share's result, None)``. With
        ``run_verify``, ``result.results["verification"]`` holds the verification record.

    Raises:
        InputError, UnsupportedAnalysisError: as :func:`probe.runs.analysis.analyze`; ``out`` taken.
    """
    main = world is None or world.main
    timings = {} if timings is None else timings
    with claim_run_dir(out, lm.name, force) if main else nullcontext() as claim:
        finished, skipped, texts = _circuit_probe(lm, texts, circuits and main, timings)
        extra = _pattern_analyses(lm, distance, map_sequences, health, query_block, skipped)
        extra += list(accumulators or [])
        if annotated is not None:
            # the readers' own left-out rows are counted once, by rank 0 (the accumulators are summed over ranks)
            extra += annotated.accumulators(lm, prior=main)
            check_supported(lm, extra)  # --coref/--syntax on a model they do not measure: one Error line
        with distributed.process_group(world) if world else nullcontext():
            result = analyze(lm, distributed.shard(texts, world) if world else texts, batch_size=batch_size,
                             max_length=max_length, n_examples=examples, thresholds=thresholds, progress=progress,
                             parse_special_tokens=parse_special_tokens, accumulators=extra, finished=finished,
                             reduce=distributed.reducer(world), generate=generate, value_weighted=value_weighted,
                             labels_by=labels_by, query_block=query_block)
        if not main:
            return result, None
        timings["analyze_s"] = result.timings["analyze_s"]
        result.notes.extend(skipped)
        verification = _verification(lm, verify_progress, timings) if run_verify else None
        if verification is not None:
            result.results["verification"] = verification
        if rollout:
            _add_rollout(lm, result, timings)
        result.settings["input"] = source
        report_steps(lm, result)
        path = write_run(result, lm.tokenizer, claim.path, force=force, verification=verification,
                         timings=timings, started=started)
    return result, path


def _pattern_analyses(lm, distance: bool, map_sequences: int, health, query_block: int | None,
                      skipped: list[str]) -> list:
    """The pattern accumulators that fit ``lm`` (the library's own rule; the others said in ``skipped``)."""
    offered = pattern_accumulators(lm, distance=distance, map_sequences=map_sequences, thresholds=health)
    refused = [acc.refusal(lm) for acc in offered if acc.refusal(lm) is not None]
    if refused:
        skipped.append("not run: " + "; ".join(refused))
    return _block_ready([acc for acc in offered if acc.refusal(lm) is None], query_block, skipped)


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
        examples); ``name`` is the head's in the original numbering, ``head`` its slot in a physically
        pruned layer.
    """
    if not result.examples or lm.spec.discovered or lm.spec.capture_only:  # steps: a hand spec's from-scratch module
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


def analysis_input(texts=(), corpus: str | None = None, pairs: str | None = None, coref: str | None = None,
                   syntax_file: str | None = None, limit: int | None = None):
    """The texts of ``probe analyze`` as :func:`analyze_run` takes them: a list, or a stream for a corpus
    or pairs file (read as it is analysed), with where they come from and the annotated input of
    ``--coref``/``--syntax`` (or None). Nothing given: the built-in sample.

    Args:
        texts: texts given one by one (``--text``). corpus: a plain-text or CoNLL-U file (``--corpus``).
        pairs: a file of tab-separated pairs (``--pairs``). coref: a GAP file or ``"builtin"``.
        syntax_file: a CoNLL-U file whose trees are scored. limit: most sequences (of each file).

    Returns:
        ``(texts, source, annotated)``.

    Raises:
        InputError: two kinds of input given, or an input that cannot be read.
    """
    if sum(bool(x) for x in (texts, corpus, pairs)) > 1:
        raise InputError("give either --text, --corpus or --pairs, not two of them")
    if coref is not None or syntax_file is not None:
        if texts or corpus or pairs:
            raise InputError("--coref and --syntax analyse their own annotated text; leave out --text, --corpus "
                             "and --pairs")
        annotated = annotated_input(coref, syntax_file, limit)
        return annotated.texts, annotated.source, annotated
    if corpus:
        return peek(iter_corpus(corpus, limit)), corpus, None
    if pairs:
        return peek(iter_pairs(pairs, limit)), pairs, None
    if texts:
        return check_texts(list(texts), limit), "--text", None
    return check_texts(sample_texts(), limit), "built-in sample", None


def announcement(lm, texts, source: str, world=None, counted: int | None = None) -> str:
    """The line saying what is analysed, with which model (and, under a launcher, which share): ``counted``
    sequences "from" a streamed file, or the sequences of a list with where they come from."""
    share = (f", process {world.rank} of {world.size}: sequences {world.rank}, {world.rank + world.size}, ..."
             if world else "")
    if counted is not None:
        how_many = f"{plural(counted, 'sequence')} from {source}" + (f" ({share[2:]})" if share else "")
    else:
        how_many = f"{plural(len(texts), getattr(texts, 'noun', 'sequence'))} ({source}{share})"
    layers = lm.geometry.n_layers
    if lm.kind == "encoder-decoder":
        layers = " + ".join(f"{n} {stack}" for stack, n in stack_depths(lm.sites).items())
    return f"Analyzing {how_many} with {lm.name}: {layers} layers x {plural(lm.geometry.n_heads, 'head')}"


#: A start-up (Python imports before the command runs) longer than this gets a one-time explanation.
SLOW_START_S = 8.0


def start_up_note(startup_s: float) -> str | None:
    """Why a start-up took ``startup_s`` seconds, once per cache folder, when it is above
    :data:`SLOW_START_S` (else None): the first run after installing reads torch's and transformers'
    libraries from disk and compiles Python modules (measured: torch's import 7.7 s, pandas 2.0 s,
    networkx 1.5 s on a busy 2-core machine). A marker file in probe's cache folder keeps it to once
    (a read-only cache folder: the note comes again next time, nothing else changes)."""
    marker = cache_dir() / "start-up-explained"
    if startup_s < SLOW_START_S or marker.exists():
        return None
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass
    return (f"note: start-up took {startup_s:.1f} s: a first run after installing reads torch's and "
            "transformers' libraries from disk and compiles Python modules (every run compiles them where "
            "PYTHONDONTWRITEBYTECODE is set); later runs start faster. (Said once.)")
