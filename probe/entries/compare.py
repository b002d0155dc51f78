"""``probe compare`` as a library call (:func:`run_compare`): two run folders read back, or two models
analysed on one corpus, compared head by head; returned as a :class:`~probe.entries.result.RunResult`
whose ``save`` writes the comparison folder.

Example::

    from probe.settings import CompareSettings
    run = probe.run_compare(CompareSettings(runs=("reports/a", "reports/b"))); run.tables["compare"]
    run = probe.run_compare(models=(lm_a, lm_b), texts=["The cat sat on the mat."])   # two loaded models
"""

from __future__ import annotations

from pathlib import Path

from ..compare import compare_runs, load_run
from ..compare.report import COMPARE_STEM, compare_name
from ..errors import InputError
from ..loading import models as loading  # load_model read as an attribute: a test may stand in for it
from ..runs.analysis import analyze
from ..settings import CompareSettings
from ..text.corpus import corpus_input
from ..util import plural
from .result import Console, RunResult


def run_compare(settings: CompareSettings | None = None, *, models=None, texts=None, source: str | None = None,
                console: Console | None = None) -> RunResult:
    """``probe compare`` as one call: the settings' two run folders read back (:func:`probe.compare.load_run`),
    or their two models (or ``models``, two loaded models) analysed on the same sequences; compared head by
    head (:func:`probe.compare.compare_runs`).

    Args:
        settings: :class:`~probe.settings.CompareSettings` (runs or models, texts or corpus, limit, batch size,
            token limit, heads drawn); None with ``models``: the defaults, the models named by their names
            (``probe.run_compare(models=(lm_a, lm_b), texts=[...])``).
        models: two :class:`~probe.core.LoadedModel` objects instead of the settings' model names.
        texts, source: the sequences already read (:func:`probe.text.corpus.corpus_input`) and where they come from
            (default ``texts``).
        console: the line per model analysed (``announce``); ``before_load`` with the comparison folder's
            default name, once the runs are read or before the models load.

    Returns:
        A :class:`~probe.entries.result.RunResult` of kind ``compare``: ``tables["compare"]`` (one row per head:
        ``delta_<statistic>`` = B - A, labels, status), ``pair`` (the two results and tokenizers ``save`` writes).

    Raises:
        InputError: a folder that is not a run folder; neither settings nor models; as
            :func:`probe.runs.analysis.analyze`.
    """
    if settings is None:
        if models is None:
            raise InputError("run_compare needs its settings (CompareSettings) or two loaded models (models=)")
        settings = CompareSettings(models=tuple(m if isinstance(m, str) else m.name for m in models))
    s = settings
    console = Console() if console is None else console
    if s.runs:
        a, b = load_run(s.runs[0]), load_run(s.runs[1])
        console.loading(compare_name(a, b))
        tokenizers = (None, None)
    else:
        if texts is None:
            texts, source = corpus_input(s.corpus, None, s.limit, texts=s.texts, sample="built-in sample")
        elif source is None:
            source = "texts"
        names = models if models is not None else s.models
        console.loading(COMPARE_STEM.format(*(Path(m if isinstance(m, str) else m.name).name for m in names)))
        results, tokenizers = [], []
        for name in names:
            lm = loading.load_model(name) if isinstance(name, str) else name
            console.tell(f"Analyzing {plural(len(texts), 'sequence')} ({source}) with {lm.name}: "
                         f"{plural(lm.geometry.n_layers, 'layer')} x {plural(lm.geometry.n_heads, 'head')}")
            result = analyze(lm, texts, batch_size=s.batch_size, max_length=s.max_length)
            result.settings["input"] = source
            results.append(result)
            tokenizers.append(lm.tokenizer)
        a, b, tokenizers = results[0], results[1], tuple(tokenizers)
    frame = compare_runs(a, b)
    return RunResult("compare", s, None, frame, tables={"compare": frame}, timings=console.timings,
                     started=console.started, pair=(a, b, tokenizers))
