"""``probe why`` as a library call (:func:`run_why`): one head's attention scores at one query row split
by the sources of its query and its key (or averaged over the rows of a corpus that fit the head's label),
the heads labelled by the analysis of the built-in sample (cached per model: :mod:`probe.qk.labels`),
returned as a :class:`~probe.entries.result.RunResult` (no folder written until ``save``).

Example::

    from probe.settings import WhySettings
    run = probe.run_why(lm, WhySettings(head="L1H0", text="When Mary and John went to the store"))
"""

from __future__ import annotations

from ..loading import models as loading  # load_model read as an attribute: a test may stand in for it
from ..qk.run import why_analysis
from ..qk.score import check_head_config
from ..settings import WhySettings
from ..text.corpus import read_corpus
from .result import Console, RunResult, folder_result, run_model


def run_why(model, settings: WhySettings, *, texts=None, console: Console | None = None, device=None,
            dtype=None) -> RunResult:
    """``probe why`` as one call: :func:`probe.qk.run.why_analysis` on the settings' head, text (or corpus),
    query row and keys listed.

    Args:
        model: a model name or a loaded model.
        settings: :class:`~probe.settings.WhySettings` (head, text or corpus, target, label, query, top).
        texts: the corpus's texts already read (the command reads them before torch), else read from the
            settings' ``corpus``.
        console: progress bars, the folder claim before the model loads (``before_load``).
        device, dtype: where and how a named model loads.

    Returns:
        A :class:`~probe.entries.result.RunResult`: ``tables`` ``heads``, ``why`` (why.csv) and ``shares`` (per
        source, at the top key); ``arrays`` ``contributions`` [query sources, key sources, keys] with a text;
        ``measured`` the :class:`~probe.qk.run.WhyRun`.

    Raises:
        InputError: as :func:`probe.qk.run.why_analysis`; a head the model's config does not have
            (:func:`probe.qk.score.check_head_config`, before the weights load); an unreadable corpus.
    """
    console = Console() if console is None else console
    s = settings
    if s.corpus is not None and texts is None:
        texts = read_corpus(s.corpus, s.limit)
    if isinstance(model, str):
        check_head_config(s.head, loading.peek_config(model), model)  # what the config decides: before the weights
    lm = run_model(model, console, dtype=dtype, device=device)
    measured, analysis = why_analysis(lm, s.text, s.head, s.query, top=s.top, progress=console.progress,
                                      corpus=None if s.corpus is None else list(texts), label=s.label,
                                      target=s.target)
    arrays = {} if measured.why is None else {"contributions": measured.why.contributions}
    return folder_result("why", s, lm, analysis, measured, console,
                         {"heads": analysis.heads, "why": measured.frame, "shares": measured.shares}, arrays)
