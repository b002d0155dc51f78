"""``probe analyze`` as a function: the run a notebook gets by calling :func:`analyze_run` is the one
the command writes, for every kind of input the command takes (texts, a corpus, pairs, annotated text,
images, audio clips, a dual encoder's texts and images). :func:`analyze_run` reads the input, loads the
model and dispatches on the input's kind; :func:`analyze_texts` composes the decoder circuit probe (on
decoders), the pattern analyses, the annotated probes of ``--coref``/``--syntax``, the loop
(:func:`probe.runs.analysis.analyze`), verification, attention rollout and flow of the first examples,
the report's attention-step views, and the run folder (:func:`probe.report.write_run`);
:func:`analysis_input` reads what ``--text``, ``--corpus``, ``--pairs``, ``--coref`` and ``--syntax``
name, :func:`announcement` and :func:`start_up_note` are the lines the command prints. The command line
only reads options, calls :func:`analyze_run` and prints.

Example::

    import probe
    result, folder = probe.analyze_run("minilm", ["The cat sat on the mat."], out="reports/cat")
    result, folder = probe.analyze_run("vit", images="photos/", out="reports/photos")
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from ..audio import MAX_NEW_TOKENS, clips, speech_accumulators
from ..audio.batches import audio_input, check_speech_input
from ..capture.blocks import AUTO_LENGTH
from ..capture.maps import encode
from ..errors import InputError
from ..images import grid_accumulators
from ..images.batches import check_model_input, image_input
from ..images.batches import images as image_batches
from ..linguistic import annotated_input
from ..loading import models as loading  # load_model and peek_config read as attributes: a test may stand in for them
from ..loading.checkpoints import cache_dir
from ..loading.seq2seq import as_targets, check_generate, check_generate_config, stack_depths
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
from .towers import analyze_towers, is_pair_model, load_towers


@dataclasses.dataclass
class Run:
    """What :func:`analyze_run` gives: unpacks as ``(result, folder)``.

    Attributes:
        result: the :class:`~probe.records.AnalysisResult` (with ``run_verify``, ``results["verification"]``).
        folder: the run folder written; None on a process other than rank 0 of a distributed run.
        loading_notes: what loading the model said (also among ``result.notes``; the command does not repeat them).
        annotated: whether the input was annotated text (``coref``/``syntax``): the command prints its scores.
    """

    result: AnalysisResult
    folder: Path | None
    loading_notes: list[str] = dataclasses.field(default_factory=list)
    annotated: bool = False

    def __iter__(self):
        return iter((self.result, self.folder))


def analyze_run(model, texts=None, *, corpus: str | None = None, pairs: str | None = None,
                coref: str | None = None, syntax: str | None = None, images=None, image_folder=None,
                image_size: tuple[int, int] | None = None, audio=None, transcripts=(), limit: int | None = None,
                out=None, force: bool = False, device=None, dtype=None, device_map=None,
                source: str | None = None, annotated=None, batch_size: int = 16, max_length: int | None = None,
                examples: int = 3, thresholds=None, parse_special_tokens: bool = False, rollout: bool = True,
                run_verify: bool = False, query_block: int | None = None, distance: bool = True,
                map_sequences: int = 200, circuits: bool = True, health=None, value_weighted: bool = True,
                labels_by: str = "weight", generate: int | None = None, progress: bool = False, world=None,
                timings: dict | None = None, started: float | None = None,
                verify_progress: Callable | None = None, accumulators: list | None = None,
                announce: Callable[[str], None] | None = None, counted: int | None = None) -> Run:
    """Analyse a model on any input ``probe analyze`` takes and write the run folder the command writes.

    The kind of input decides the run: texts (given, a corpus, a pairs file, the built-in sample),
    annotated text (``coref``, ``syntax``), images (an image model: ``images``, ``image_folder``),
    audio clips (a speech model: ``audio``), or texts and images together (a dual encoder, CLIP or
    SigLIP: its text tower on the texts, its vision tower on the images). Everything is checked
    before the model loads, and the run folder is claimed before anything runs (no partial folder on
    an error).

    Args:
        model: a model name (alias, Hub id, folder, GGUF file: :func:`probe.loading.models.load_model`)
            or a :class:`~probe.core.LoadedModel`.
        texts: strings (``--text``; checked, at most ``limit``) or :class:`~probe.text.inputs.Text`
            objects or a stream of them (used as given). None with no other input: the built-in sample.
        corpus, pairs: a plain-text or CoNLL-U corpus, a file of tab-separated pairs (read as analysed).
        coref, syntax: a GAP file (or ``"builtin"``) and a CoNLL-U file whose trees are scored.
        images: image files (or one folder, a ``str`` or ``Path`` naming a directory); image_folder: a
            folder whose every image is read, by name (``--images``). Read with Pillow, checked before
            the model loads.
        image_size: ``(height, width)`` in pixels instead of the processor's size.
        audio: audio clips (a path or a list); transcripts: one per clip (default: the model's own).
        limit: at most this many sequences, images or clips (of each annotated file).
        out, force: the run folder (default a new ``reports/<model>-<time>``) and whether probe's own
            files in it are replaced.
        device, dtype, device_map: where and how a named model loads (:func:`probe.loading.models.load_model`).
        source: ``run.json``'s ``settings.input`` (default: what the input was: ``--text``, the file,
            the folder ...). annotated: an annotated input whose texts are ``texts`` (or None).
        announce: called with the line saying what is analysed, once the analysis will run, and with a long
            batch's estimate (:class:`probe.runs.pace.Pace`) once it is known (None: silent).
        counted: the sequences of a corpus or pairs file if already counted (for ``announce``).
        batch_size, max_length, examples, thresholds, parse_special_tokens: as :func:`analyze_texts`.
        rollout, run_verify, query_block, distance, map_sequences, circuits: as :func:`analyze_texts`.
        health, value_weighted, labels_by, generate, progress: as :func:`analyze_texts`.
        world: as :func:`analyze_texts`; default :func:`probe.runs.distributed.detect`.
        timings, started, verify_progress, accumulators: as :func:`analyze_texts`.

    Returns:
        A :class:`Run` (``result, folder = analyze_run(...)``).

    Raises:
        InputError: two kinds of input, an unreadable input, input the model does not read, a model
            that cannot be loaded, ``out`` taken; UnsupportedAnalysisError: as :func:`analyze_texts`.
    """
    t = time.perf_counter()
    timings = {} if timings is None else timings
    name = model if isinstance(model, str) else model.name
    texts = [texts] if isinstance(texts, str) else texts
    if isinstance(images, (str, os.PathLike)) and os.path.isdir(images) and image_folder is None:
        images, image_folder = (), images  # one folder: every image in it, as --images reads it
    image_files = [images] if isinstance(images, (str, os.PathLike)) else list(images or ())
    audio_files = [audio] if isinstance(audio, (str, os.PathLike)) else list(audio or ())
    text_given = bool(texts or corpus or pairs)
    # a dual encoder (CLIP, SigLIP) reads text and images together; its config is read only then
    pair = (bool((image_files or image_folder) and (texts or corpus)) and isinstance(model, str)
            and is_pair_model(model))
    paths = image_input(image_files, image_folder, limit, not pair and bool(text_given or coref or syntax))
    clip_paths = audio_input(audio_files, transcripts, limit, bool(text_given or coref or syntax or paths))
    if run_verify and (clip_paths is not None or paths is not None):  # before a model loads: verify reads text
        raise InputError("--verify checks the attention on text; it does not run on images or audio (leave out "
                         "--verify)")
    if clip_paths is not None:
        seqs, given_source = clip_paths, "--audio"
    elif paths is None or pair:
        seqs, given_source, annotated = _texts(texts, corpus, pairs, coref, syntax, limit, annotated)
    else:
        seqs, given_source = paths, "--image" if image_files else str(image_folder)
    source = given_source if source is None else source
    world = distributed.detect() if world is None else world
    main = world is None or world.main
    with claim_run_dir(out, name, force) if main else nullcontext() as claim:  # one run per folder
        out = claim.path if main else out
        timings["input_s"] = time.perf_counter() - t
        if pair:
            return _pair_run(model, seqs, source, paths, out, force=force, dtype=dtype, timings=timings,
                             started=started, announce=announce, batch_size=batch_size, max_length=max_length,
                             n_examples=examples, thresholds=thresholds)
        if isinstance(model, str):
            if generate is not None and clip_paths is None and (config := loading.peek_config(model)) is not None:
                check_generate_config(config, model, generate)  # before the weights load
            lm = loading.load_model(model, dtype=dtype, device=device, device_map=device_map)
            timings["model_load_s"] = lm.load_seconds
        else:
            lm = model
        check_speech_input(lm, clip_paths)
        if clip_paths is None:
            check_model_input(lm, paths)
        extra = list(accumulators or [])
        if clip_paths is not None:
            seqs = clips(lm, clip_paths, list(transcripts) or None, generate or MAX_NEW_TOKENS)
            extra += speech_accumulators(lm, n_clips=min(examples, 2))
            rollout, generate = False, None  # the bound was the transcript's; the section draws the clips
            query_block = 0 if query_block is None else query_block  # whole maps: the alignment reads them
        if paths is not None:
            seqs = image_batches(lm, paths, image_size)
            rollout = False  # the image section draws its own rollout over the patches
        if generate is not None:
            check_generate(lm, generate)
        if paths is not None:
            extra += grid_accumulators(lm, n_images=min(examples, 2))
        if announce is not None:
            announce(announcement(lm, seqs, source, world, counted))  # only once the analysis will run
        if pairs and lm.kind == "encoder-decoder":
            seqs = as_targets(seqs)  # the file's second column is the decoder's target
        show = progress and main
        result, path = analyze_texts(
            lm, seqs, out=out, force=force, source=source, annotated=annotated, batch_size=batch_size,
            max_length=max_length, examples=examples, thresholds=thresholds,
            parse_special_tokens=parse_special_tokens, rollout=rollout, run_verify=run_verify,
            query_block=query_block, distance=distance, map_sequences=map_sequences, circuits=circuits,
            health=health, value_weighted=value_weighted, labels_by=labels_by, generate=generate, progress=show,
            world=world, timings=timings, started=started, verify_progress=verify_progress if show else None,
            accumulators=extra or None, announce=announce if main else None)
    return Run(result, path, list(lm.notes), annotated is not None)


def _texts(texts, corpus, pairs, coref, syntax, limit, annotated):
    """The texts of a run, where they come from and the annotated input (or None): strings through
    :func:`analysis_input`, :class:`~probe.text.inputs.Text` objects or a stream as given."""
    if annotated is not None or (texts is not None and not (isinstance(texts, (list, tuple))
                                                            and all(isinstance(x, str) for x in texts))):
        if corpus or pairs or coref or syntax:
            raise InputError("give either texts or a file (corpus, pairs, coref, syntax), not both")
        return texts, "texts", annotated
    return analysis_input(texts or (), corpus, pairs, coref, syntax, limit)


def _pair_run(model_name: str, texts, source: str, paths: list[str] | None, out, *, force: bool, dtype,
              timings: dict, started: float | None, announce, **analysis) -> Run:
    """A dual encoder's run: load the pair's towers, analyse the texts and the images, write one run folder.

    Raises:
        InputError: no image, or no text given.
    """
    if not paths or source == "built-in sample":
        raise InputError(f"{model_name} is a dual encoder (text and vision towers): give images (--image, --images) "
                         "and text (--text, --corpus) together")
    t = time.perf_counter()
    towers = load_towers(model_name, dtype=dtype)
    timings["model_load_s"] = time.perf_counter() - t
    texts = list(texts)
    if announce is not None:
        announce(f"Analyzing {plural(len(texts), 'sequence')} ({source}) with the text tower and "
                 f"{plural(len(paths), 'image')} with the vision tower of {model_name}: "
                 f"{towers.text.geometry.n_layers} + {towers.vision.geometry.n_layers} layers")
    result = analyze_towers(towers, texts, paths, **analysis)
    result.settings["input"] = f"{source} and images"
    path = write_run(result, towers.text.tokenizer, out, force=force, timings=timings, started=started)
    return Run(result, path, list(towers.text.notes), False)


def analyze_texts(lm, texts, *, out=None, force: bool = False, source: str = "texts", annotated=None,
                batch_size: int = 16, max_length: int | None = None, examples: int = 3, thresholds=None,
                parse_special_tokens: bool = False, rollout: bool = True, run_verify: bool = False,
                query_block: int | None = None, distance: bool = True, map_sequences: int = 200,
                circuits: bool = True, health=None, value_weighted: bool = True, labels_by: str = "weight",
                generate: int | None = None, progress: bool = False, world=None, timings: dict | None = None,
                started: float | None = None, verify_progress: Callable | None = None,
                accumulators: list | None = None,
                announce: Callable | None = None) -> tuple[AnalysisResult, Path | None]:
    """Measure every head of a loaded model on its texts and write the run folder: the composition
    :func:`analyze_run` runs once the input is read and the model loaded (text, pairs, annotated text,
    images or clips already turned into sequences).

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
        announce: told, in one line, when one batch (a long text) will take long, with its estimate
            (:func:`probe.runs.analysis.analyze`'s ``announce``); None: silent.
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
                             labels_by=labels_by, query_block=query_block, announce=announce)
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
