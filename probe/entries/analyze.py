"""``probe analyze`` as library calls, dispatched by the kind of input: texts (given, a corpus, a pairs file,
the built-in sample), annotated text (``coref``, ``syntax``), images (an image model), audio clips (a speech
model), or texts and images together (a dual encoder, CLIP or SigLIP: its two towers). :func:`run_analyze`
reads and checks the input, loads the model, turns the input into sequences and hands them to the
composition of a text analysis (:func:`probe.entries.texts.analyze_texts`), returning a
:class:`~probe.entries.result.RunResult` without writing anything; :func:`analyze_run` is the same run with
its folder written, as the command writes it. :func:`analysis_input` reads what ``--text``, ``--corpus``,
``--pairs``, ``--coref`` and ``--syntax`` name; :func:`announcement` and :func:`start_up_note` are the lines
the command prints.

Example::

    import probe
    from probe.settings import AnalyzeSettings
    run = probe.run_analyze(lm, AnalyzeSettings(texts=("The cat sat on the mat.",)))   # no folder
    run.tables["heads"]; run.save("reports/cat")
    result, folder = probe.analyze_run("minilm", ["The cat sat on the mat."], out="reports/cat")
    result, folder = probe.analyze_run("vit", images="photos/", out="reports/photos")
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from ..audio import MAX_NEW_TOKENS, clips, speech_accumulators
from ..audio.batches import audio_input, check_speech_input
from ..errors import InputError
from ..images import grid_accumulators
from ..images.batches import check_model_input, image_input
from ..images.batches import images as image_batches
from ..linguistic import annotated_input
from ..loading import models as loading  # load_model and peek_config read as attributes: a test may stand in for them
from ..loading.checkpoints import cache_dir
from ..loading.seq2seq import as_targets, check_generate, check_generate_config, stack_depths
from ..records import AnalysisResult
from ..report import claim_run_dir
from ..runs import distributed
from ..settings import AnalyzeSettings
from ..text.corpus import check_texts, count_sequences, iter_corpus, iter_pairs, peek, sample_texts  # noqa: F401 (count_sequences: re-exported)
from ..util import plural
from .result import Console, RunResult
from .texts import analyze_texts, report_steps  # noqa: F401 (report_steps: re-exported)
from .towers import analyze_towers, is_pair_model, load_towers


@dataclasses.dataclass
class Run:
    """What :func:`analyze_run` gives: unpacks as ``(result, folder)``.

    Attributes:
        result: the :class:`~probe.records.AnalysisResult` (with ``verify``, ``results["verification"]``).
        folder: the run folder written; None on a process other than rank 0 of a distributed run.
        loading_notes: what loading the model said (also among ``result.notes``; the command does not repeat them).
        annotated: whether the input was annotated text (``coref``/``syntax``): the command prints its scores.
        run: the :class:`~probe.entries.result.RunResult` that was saved.
    """

    result: AnalysisResult
    folder: Path | None
    loading_notes: list[str] = dataclasses.field(default_factory=list)
    annotated: bool = False
    run: RunResult | None = None

    def __iter__(self):
        return iter((self.result, self.folder))


def analyze_run(model, texts=None, settings: AnalyzeSettings | None = None, *, out=None, force: bool = False,
                console: Console | None = None, world=None, counted: int | None = None, **options) -> Run:
    """Analyse a model on any input ``probe analyze`` takes and write the run folder the command writes:
    :func:`run_analyze`, then :meth:`~probe.entries.result.RunResult.save`, the folder claimed once the input
    is read and before the model loads (no partial folder on an error).

    Args:
        model: a model name (alias, Hub id, folder, GGUF file) or a :class:`~probe.core.LoadedModel`.
        texts: strings (checked, at most ``limit``), or :class:`~probe.text.inputs.Text` objects or a stream
            of them (used as given); None with no other input: the built-in sample.
        settings: an :class:`~probe.settings.AnalyzeSettings`; or its fields as keyword ``options``
            (``images=``, ``audio=``, ``generate=``, ``examples=`` ...; ``images`` naming one folder reads every
            image in it, as ``--images``).
        out, force: the run folder (default a new ``reports/<model>-<time>``) and whether probe's own files
            in it are replaced.
        console, world: as :func:`run_analyze`. counted: the sequences of a corpus or pairs file if already
            counted (for the announcement).
        options: :class:`~probe.settings.AnalyzeSettings` fields, :func:`run_analyze`'s keywords
            (``source``, ``annotated``, ``device``, ``dtype``, ``device_map``, ``accumulators``), or the
            :class:`~probe.entries.result.Console` fields by their earlier names (``progress``, ``announce``,
            ``verify_progress``, ``started``, ``timings``).

    Returns:
        A :class:`Run` (``result, folder = analyze_run(...)``).

    Raises:
        InputError: an unknown option, a value out of bounds, two kinds of input, an unreadable input,
            input the model does not read, a model that cannot be loaded, ``out`` taken;
            UnsupportedAnalysisError: as :func:`probe.runs.analysis.analyze`.
    """
    keywords = {k: options.pop(k) for k in RUN_KEYWORDS if k in options}
    console = Console() if console is None else console
    talk = {CONSOLE_KEYWORDS[k]: options.pop(k) for k in list(options) if k in CONSOLE_KEYWORDS}
    talk = {k: v for k, v in talk.items() if v is not None}
    console = dataclasses.replace(console, **talk) if talk else console
    images = options.get("images")
    if isinstance(images, (str, os.PathLike)) and os.path.isdir(images) and options.get("image_folder") is None:
        options["images"], options["image_folder"] = (), images  # one folder: every image in it, as --images
    settings = _settings(settings, texts, options)
    world = distributed.detect() if world is None else world
    main = world is None or world.main
    held = []

    def claim_folder(name: str) -> None:  # once the input is read, before the model loads: one run per folder
        if main:
            held.append(claim_run_dir(out, name, force))
        console.loading(name)

    try:
        run = run_analyze(model, settings, texts=None if _strings(texts) else texts, world=world, counted=counted,
                          console=dataclasses.replace(console, before_load=claim_folder), **keywords)
        path = run.save(held[0].path, force=force) if held else None
    finally:
        for claim in held:
            claim.release()
    return Run(run.analysis, path, run.loading_notes, run.annotated, run)


#: The keywords of :func:`run_analyze` that :func:`analyze_run` passes on from its ``options``.
RUN_KEYWORDS = ("source", "annotated", "device", "dtype", "device_map", "accumulators")
#: :func:`analyze_run`'s earlier keywords of how a run talks, and the :class:`Console` field each sets.
CONSOLE_KEYWORDS = {"progress": "progress", "announce": "announce", "verify_progress": "case", "started": "started",
                    "timings": "timings"}


def _strings(texts) -> bool:
    """``texts`` given as strings (the settings' ``texts``), not as Text objects or a stream."""
    return isinstance(texts, str) or (isinstance(texts, (list, tuple)) and all(isinstance(t, str) for t in texts))


def _settings(settings, texts, options: dict) -> AnalyzeSettings:
    """The settings of :func:`analyze_run`: ``settings`` or ``options``, with ``texts`` given as strings."""
    if settings is not None and options:
        raise InputError(f"give either settings or options ({', '.join(options)}), not both")
    if texts is not None and _strings(texts):
        options["texts"] = texts
    if settings is None:
        return AnalyzeSettings.from_mapping(options)
    return settings.replace(texts=options["texts"]) if "texts" in options else settings


def run_analyze(model, settings: AnalyzeSettings | None = None, *, texts=None, source: str | None = None,
                annotated=None, console: Console | None = None, world=None, device=None, dtype=None,
                device_map=None, accumulators: list | None = None, counted: int | None = None) -> RunResult:
    """``probe analyze`` as one call, without a folder: read the input the settings name, load the model
    (or take a loaded one), dispatch on the input's kind, measure every head.

    Args:
        model: a model name (alias, Hub id, folder, GGUF file: :func:`probe.loading.models.load_model`)
            or a :class:`~probe.core.LoadedModel`.
        settings: :class:`~probe.settings.AnalyzeSettings` (the input: ``texts``, ``corpus``, ``pairs``,
            ``coref``, ``syntax``, ``images``, ``image_folder``, ``audio``; and how the run measures).
        texts: :class:`~probe.text.inputs.Text` objects or a stream of them, used as given instead of the
            settings' input (with ``annotated``: the annotated input whose texts these are).
        source: ``run.json``'s ``settings.input`` (default: what the input was: ``--text``, the file ...).
        console: progress bars, the line saying what is analysed (``announce``), the folder claim before
            the model loads (``before_load``), the start time (:class:`~probe.entries.result.Console`).
        world: the processes of a distributed run (default :func:`probe.runs.distributed.detect`).
        device, dtype, device_map: where and how a named model loads.
        accumulators: more accumulators to run beside the pattern analyses.
        counted: the sequences of a corpus or pairs file if already counted (for the announcement).

    Returns:
        A :class:`~probe.entries.result.RunResult`: ``tables["heads"]``, ``arrays`` (the kept maps), ``notes``,
        ``timings``, ``save(folder)``, ``records()``.

    Raises:
        InputError: two kinds of input, an unreadable input, input the model does not read, a model that
            cannot be loaded; UnsupportedAnalysisError: as :func:`probe.runs.analysis.analyze`.
    """
    s = AnalyzeSettings() if settings is None else settings
    console = Console() if console is None else console
    t = time.perf_counter()
    timings = console.timings
    image_files, image_folder, audio_files = list(s.images), s.image_folder, list(s.audio)
    text_given = bool(texts is not None or s.texts or s.corpus or s.pairs)
    # a dual encoder (CLIP, SigLIP) reads text and images together; its config is read only then
    pair = (bool((image_files or image_folder) and (texts is not None or s.texts or s.corpus))
            and isinstance(model, str) and is_pair_model(model))
    paths = image_input(image_files, image_folder, s.limit, not pair and bool(text_given or s.coref or s.syntax))
    clip_paths = audio_input(audio_files, s.transcripts, s.limit, bool(text_given or s.coref or s.syntax or paths))
    if s.verify and (clip_paths is not None or paths is not None):  # before a model loads: verify reads text
        raise InputError("--verify checks the attention on text; it does not run on images or audio (leave out "
                         "--verify)")
    if clip_paths is not None:
        seqs, given_source = clip_paths, "--audio"
    elif paths is None or pair:
        seqs, given_source, annotated = _texts(texts, s, annotated)
    else:
        seqs, given_source = paths, "--image" if image_files else str(image_folder)
    source = given_source if source is None else source
    world = distributed.detect() if world is None else world
    timings["input_s"] = time.perf_counter() - t
    console.loading(model if isinstance(model, str) else model.name)
    if pair:
        return _pair_run(model, seqs, source, paths, s, console, dtype)
    if isinstance(model, str):
        if s.generate is not None and clip_paths is None and (config := loading.peek_config(model)) is not None:
            check_generate_config(config, model, s.generate)  # before the weights load
        lm = loading.load_model(model, dtype=dtype, device=device, device_map=device_map)
        timings["model_load_s"] = lm.load_seconds
    else:
        lm = model
    check_speech_input(lm, clip_paths)
    if clip_paths is None:
        check_model_input(lm, paths)
    extra = list(accumulators or [])
    if clip_paths is not None:
        seqs = clips(lm, clip_paths, list(s.transcripts) or None, s.generate or MAX_NEW_TOKENS)
        extra += speech_accumulators(lm, n_clips=min(s.examples, 2))
        # the bound was the transcript's; the section draws the clips; whole maps: the alignment reads them
        s = s.replace(rollout=False, generate=None, query_block=0 if s.query_block is None else s.query_block)
    if paths is not None:
        seqs = image_batches(lm, paths, s.image_size)
        s = s.replace(rollout=False)  # the image section draws its own rollout over the patches
    if s.generate is not None:
        check_generate(lm, s.generate)
    if paths is not None:
        extra += grid_accumulators(lm, n_images=min(s.examples, 2))
    console.tell(announcement(lm, seqs, source, world, counted))  # only once the analysis will run
    if s.pairs and lm.kind == "encoder-decoder":
        seqs = as_targets(seqs)  # the file's second column is the decoder's target
    return analyze_texts(lm, seqs, s, source=source, annotated=annotated, console=console, world=world,
                         accumulators=extra or None)


def _texts(texts, s: AnalyzeSettings, annotated):
    """The texts of a run, where they come from and the annotated input (or None): the settings' input
    through :func:`analysis_input`, :class:`~probe.text.inputs.Text` objects or a stream as given."""
    if annotated is not None or texts is not None:
        if s.texts or s.corpus or s.pairs or s.coref or s.syntax:
            raise InputError("give either texts or a file (corpus, pairs, coref, syntax), not both")
        return texts, "texts", annotated
    return analysis_input(s.texts, s.corpus, s.pairs, s.coref, s.syntax, s.limit)


def _pair_run(model_name: str, texts, source: str, paths: list[str] | None, s: AnalyzeSettings, console: Console,
              dtype) -> RunResult:
    """A dual encoder's run: load the pair's towers, analyse the texts and the images.

    Raises:
        InputError: no image, or no text given.
    """
    if not paths or source == "built-in sample":
        raise InputError(f"{model_name} is a dual encoder (text and vision towers): give images (--image, --images) "
                         "and text (--text, --corpus) together")
    t = time.perf_counter()
    towers = load_towers(model_name, dtype=dtype)
    console.timings["model_load_s"] = time.perf_counter() - t
    texts = list(texts)
    console.tell(f"Analyzing {plural(len(texts), 'sequence')} ({source}) with the text tower and "
                 f"{plural(len(paths), 'image')} with the vision tower of {model_name}: "
                 f"{towers.text.geometry.n_layers} + {towers.vision.geometry.n_layers} layers")
    result = analyze_towers(towers, texts, paths, batch_size=s.batch_size, max_length=s.max_length,
                            n_examples=s.examples, thresholds=s.thresholds)
    result.settings["input"] = f"{source} and images"
    return RunResult("analyze", s, result, tables={"heads": result.heads}, timings=console.timings,
                     tokenizer=towers.text.tokenizer, started=console.started,
                     loading_notes=list(towers.text.notes))


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
