"""The analysis loop: batches -> model under hooks -> accumulators -> result.

Data flow (one direction): texts -> :func:`probe.text.inputs.iter_batches` -> :func:`run` (the model
under attention hooks; each site's probabilities handed to every accumulator as soon as the layer
has run) -> accumulators' results -> labels and clusters (:mod:`probe.measures.classify`) ->
:class:`AnalysisResult`. Memory does not grow with the corpus: statistics are sums and counts,
and example maps are cropped to what is shown.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext

import pandas as pd
import torch

from .. import validate
from ..capture.blocks import AUTO_LENGTH, block_capture, check_query_block, lean_outputs, longest, query_block_for
from ..capture.hooks import Hooks, input_device
from ..capture.maps import ScoreTracker, attention_hooks, check_fired, forward
from ..capture.values import ValueTracker, value_weighting_for
from ..core import LoadedModel
from ..errors import InputError
from ..loading.seq2seq import check_generate, stack_depths, with_generated_targets
from ..measures.accumulators import Accumulator, ExampleMaps, TokenCounts, check_block_ready, check_supported
from ..measures.classify import LABEL_RULES, REMOVED, cluster_heads, default_thresholds, label_heads
from ..measures.routers import RouterLoad, find_routers
from ..measures.sinks import SinkProfile
from ..measures.stats import HeadStatistics, by_norm
from ..records import AnalysisResult
from ..text.inputs import Batch, Text, as_texts, iter_batches, stream_texts
from ..text.tokens import label_examples
from ..util import plural, progress_bar
from .overlap import LAST, QUEUED_PER_SITE, Overlap, Policy, enabled, mode, submitter
from .pace import Pace, to_stderr


def run(lm: LoadedModel, batches: Iterable[Batch], accumulators: Sequence[Accumulator], *,
        progress=None, query_block: int | None = None, pace: Pace | None = None) -> list[str]:
    """Run every batch through the model and hand each site's probabilities to every accumulator.

    Args:
        lm: a loaded model (measured in eager attention and eval mode; restored afterwards).
        batches: right-padded batches (:func:`probe.text.inputs.iter_batches`).
        accumulators: objects with ``begin_batch``/``update``/``end_batch``
            (:class:`probe.measures.accumulators.Accumulator`).
        progress: a tqdm-like bar (``update(n)``) advanced by the sequences of each batch, or None.
        query_block: block capture (:mod:`probe.capture.blocks`): None: automatic (long batches,
            :func:`probe.capture.blocks.query_block_for`); 0: whole maps always; n >= 1: every batch in
            blocks of n query rows.
        pace: told each batch's start and each site's end (:class:`probe.runs.pace.Pace`: a long batch's
            estimate and its bar over the layers), or None.

    Returns:
        Notes on what capture changed (attention implementation, train mode), restored on exit,
        and which accumulators were left out of block-captured batches.

    On a block-captured batch, accumulators with ``row_blocks`` get ``update(..., rows=(i0, i1))``
    per block (:mod:`probe.measures.accumulators`); the others are not called for it and a note names them.
    A model whose heads were physically removed (``lm.pruned``) hands accumulators its
    probabilities in the original numbering, [batch, heads, query, key] with NaN for removed heads.
    Accumulators that read values (``reads_values``) also get each site's
    :class:`~probe.capture.values.ValueNorms` (``update(site, probs, batch, values=...)``), from hooks on the
    value projections of the same forward pass; those that read scores (``reads_scores``) get the
    :class:`~probe.capture.op.Scores` probe's attention function computed the probabilities from
    (``scores=...``; None where it did not). Accumulators that read other modules (``hooks_model``: the MoE
    routers, :class:`probe.measures.routers.RouterLoad`) register their hooks through ``acc.hook(hooks)``,
    removed on exit.

    On the CPU with torch on more than one thread, the accumulators' calls may run on a worker thread, in
    the serial loop's order, while the forward pass goes on (:mod:`probe.runs.overlap`: the same sums,
    bit for bit). Whether they do (:class:`probe.runs.overlap.Policy`): by default where torch leaves a
    core over or the machine is busy when the run starts (load average above one per core);
    ``PROBE_OVERLAP=1`` always, ``PROBE_OVERLAP=0`` never. Those that hook the model, and every
    block-captured batch, run in the forward pass's thread. An exception raised by an accumulator leaves as
    it would from the serial loop.

    Raises:
        InputError: a bad ``query_block``.
        UnsupportedAnalysisError: an accumulator that does not measure this kind of model or site
            (:meth:`probe.measures.accumulators.Accumulator.refusal`), before anything runs.
        CaptureError: a site returned no attention probabilities, or none at all in the first
            batch (its attention module is never called).
    """
    check_supported(lm, accumulators)
    query_block = check_query_block(query_block)
    state: dict = {"seen": set(), "active": list(accumulators), "left": {}, "blocked": [0, 0]}
    reads = {id(acc): getattr(acc, "reads_values", False) for acc in accumulators}
    scored = {id(acc): getattr(acc, "reads_scores", False) for acc in accumulators}
    tracker = ValueTracker(lm) if any(reads.values()) else None
    score_tracker = ScoreTracker(lm) if any(scored.values()) else None

    # accumulators that hook the model read what their hooks keep: always in the forward pass's thread
    own_hooks = [acc for acc in accumulators if getattr(acc, "hooks_model", False)]
    beside = enabled(input_device(lm.model)) and len(own_hooks) < len(accumulators)  # probe.runs.overlap
    policy = Policy(mode()) if beside else None  # whether the whole-map batches are overlapped
    beside = beside and policy.overlapped
    state["overlap"] = None  # the worker for the batch now running, or None (serial)

    def call(method: str, *args, each=None) -> None:
        """``acc.<method>(*args, **each(acc))`` for every active accumulator, in order: those that hook the
        model now, the others on the worker (one hand-over for all of them) where it runs."""
        work = state["overlap"]
        later = []
        for acc in state["active"]:
            bound, kwargs = getattr(acc, method), ({} if each is None else each(acc))
            if work is None or getattr(acc, "hooks_model", False):
                bound(*args, **kwargs)
            else:
                later.append((bound, kwargs))
        if later:
            work.submit(_in_order, later, args)

    def paced(method: str, *args) -> None:
        """``pace.<method>(*args)``, on the worker where it runs: a site is done when its statistics are."""
        if pace is not None:
            submitter(state["overlap"])(getattr(pace, method), *args)

    def hand(site, probs, values, rows):
        scores = score_tracker.take(site, probs) if score_tracker is not None else None
        if lm.pruned is not None:
            probs = lm.pruned.expand(site.layer, probs)
        extra = {} if rows is None else {"rows": rows}
        call("update", site, probs, state["batch"],
             each=lambda acc: {**extra, **({"values": values} if reads[id(acc)] else {}),
                               **({"scores": scores} if scored[id(acc)] else {})})

    def on_site(site, probs):
        if state["seen"] is not None:
            state["seen"].add(site)
        hand(site, probs, tracker.take(site, probs) if tracker is not None else None, None)
        paced("site_done")

    def on_block(site, probs, rows, n_query):
        if state["seen"] is not None:
            state["seen"].add(site)
        values = None
        if tracker is not None:
            values = tracker.take_block(site, probs, (*rows, n_query))
        hand(site, probs, values, rows)
        if rows[1] >= n_query:  # the site's last block
            paced("site_done")

    with torch.no_grad(), attention_hooks(lm, on_site, tracker, score_tracker) as notes, Hooks() as own, \
            Overlap(QUEUED_PER_SITE * len(lm.sites)) if beside else nullcontext() as overlap:
        for acc in own_hooks:
            acc.hook(own)
        for batch in batches:
            state["batch"] = batch
            rows = query_block_for(lm, batch, query_block)
            if rows is not None and overlap is not None:  # a block-captured batch: serial, after the queued calls
                overlap.join()
            state["overlap"] = overlap if rows is None else None
            state["active"] = list(accumulators) if rows is None else _block_ready(accumulators, batch, state)
            call("begin_batch", batch)
            paced("begin", len(batch), int(batch.input_ids.shape[1]))
            with block_capture(lm, rows, on_block) if rows is not None else nullcontext():
                forward(lm, batch, **({} if rows is None else lean_outputs(lm)))
            paced("end")
            if state["seen"] is not None:  # the first batch: every site handed its probabilities
                check_fired(lm, state["seen"])
                state["seen"] = None
            call("end_batch", batch)
            if progress is not None:
                progress.update(len(batch))
    LAST.clear()
    LAST.update(policy.summary() if policy is not None else {"setting": mode(), "reason": "serial: no overlap applies"})
    return notes + _left_out_notes(state, query_block)


def _in_order(calls: list, args: tuple) -> None:
    """``fn(*args, **kwargs)`` for each (fn, kwargs) of ``calls``, in order (one hand-over to the worker)."""
    for fn, kwargs in calls:
        fn(*args, **kwargs)


def _block_ready(accumulators: Sequence[Accumulator], batch: Batch, state: dict) -> list[Accumulator]:
    """The accumulators that take row blocks; the others are recorded in ``state`` as left out of
    ``batch`` (its sequences and its longest)."""
    state["blocked"][0] += len(batch)
    state["blocked"][1] = max(state["blocked"][1], longest(batch))
    for acc in accumulators:
        if not getattr(acc, "row_blocks", False):
            state["left"][getattr(acc, "title", type(acc).__name__)] = None
    return [acc for acc in accumulators if getattr(acc, "row_blocks", False)]


def _left_out_notes(state: dict, query_block: int | None) -> list[str]:
    """One note per accumulator left out of block-captured batches."""
    n, T = state["blocked"]
    which = (f"longer than {AUTO_LENGTH} tokens (or too large for whole maps)" if query_block is None
             else f"of blocks of {query_block} query rows")
    return [f"{title} needs whole attention maps: left out of the {plural(n, 'sequence')} {which}, captured in "
            f"query blocks (longest {T} tokens)" for title in state["left"]]


def model_summary(lm: LoadedModel) -> dict:
    """Name, source, type, kind, geometry and parameter count of a loaded model (JSON-ready).

    ``kind`` is ``"encoder"``, ``"decoder"`` or ``"encoder-decoder"``; ``causal`` says whether every
    site is causal (decoder-only models); encoder-decoder models add ``stacks`` (layers per stack). A model with
    sliding windows adds ``site_windows``: each windowed site's :meth:`probe.sites.Site.record` (its window, keys
    before and after the query).
    """
    g = lm.geometry
    return {
        "name": lm.name, "source": lm.source, "model_type": lm.model_type, "kind": lm.kind,
        "class": type(lm.model).__name__, "family": lm.spec.family, "causal": lm.kind == "decoder",
        "layers": g.n_layers, "heads": g.n_heads, "kv_heads": g.n_kv_heads, "d_head": g.d_head,
        "d_model": g.d_model, "max_length": lm.max_length,
        "windows": sorted({s.window for s in lm.sites if s.window is not None}),
        "parameters": int(sum(p.numel() for p in lm.model.parameters())),
        "removed_heads": 0 if lm.pruned is None else sum(len(h) for h in lm.pruned.removed().values()),
        "dtype": str(next(lm.model.parameters()).dtype).replace("torch.", ""),
        **({"stacks": stack_depths(lm.sites)} if lm.kind == "encoder-decoder" else {}),
        **({"site_windows": [s.record() for s in lm.sites if s.window is not None]}
           if any(s.window is not None for s in lm.sites) else {}),
    }


def analyze(lm: LoadedModel, texts: Sequence[str | Text] | str, *, batch_size: int = 16,
            max_length: int | None = None, n_examples: int = 3, example_tokens: int | None = 64,
            thresholds: dict[str, float] | None = None, n_clusters: int = 6, progress: bool = False,
            parse_special_tokens: bool = False, accumulators: Sequence[Accumulator] = (),
            finished: Sequence[Accumulator] = (), reduce: Callable[[list[Accumulator]], None] | None = None,
            generate: int | None = None, value_weighted: bool = True, labels_by: str = "weight",
            query_block: int | None = None, announce: Callable[[str], None] | None = None) -> AnalysisResult:
    """Measure every attention head of ``lm`` on ``texts``.

    Sequences are sorted by length into batches; padding never enters a statistic, so batched
    results equal one-at-a-time ones. Longer sequences are cut to ``max_length`` and counted.

    Args:
        texts: the sequences (strings or :class:`probe.text.inputs.Text`): a list, or any iterable (a
            corpus streamed from disk: read and tokenized a chunk at a time, so memory stays flat;
            the progress bar then counts sequences without a total); or an object with its own
            ``iter_batches(batch_size)`` and length (images: :func:`probe.images.images`).
        batch_size: sequences per forward pass (>= 1).
        max_length: token limit per sequence (<= the model's limit).
        n_examples: how many of the first texts keep their attention maps.
        example_tokens: tokens per side kept of each example's maps (default 64, what the report draws; None: all).
        thresholds: label thresholds overriding the defaults (docs/statistics.md).
        n_clusters: k of the k-means grouping of heads (``cluster``), unless an accumulator gives heads
            a ``group`` (:class:`probe.patterns.HeadDistances`'s Jensen-Shannon groups replace it).
        progress: show a tqdm progress bar.
        parse_special_tokens: let typed special-token strings become special tokens (default: typed text is text).
        accumulators: extra accumulators run in the same pass (results in ``results[acc.name]``). A
            mixture-of-experts model (one stack) always adds :class:`probe.measures.routers.RouterLoad`
            (``results["routers"]``: each token's experts and weights per layer, the experts' load).
        finished: accumulators that already ran on their own inputs (e.g. the decoder circuit probe,
            :func:`probe.patterns.circuit_probe`): not run on the texts; their columns, labels and
            results join the result like the others'.
        reduce: called with every accumulator after the pass, to merge in those of other
            processes (data parallelism: :func:`probe.runs.distributed.reducer`); None in one process.
        generate: encoder-decoder models: the model writes each source's target (greedy, at most this
            many new tokens); else each text has its ``target``. Their ``heads`` have ``stack``, ``kind``
            and cross-attention's ``aligned`` (:mod:`probe.measures.stats`).
        value_weighted: also each statistic on the value-weighted map (``<statistic>_by_norm``, ``norm_mass``).
        labels_by: labels from the statistics (``"weight"``) or their ``_by_norm`` forms (``"norm"``).
        query_block: block capture (docs/length.md, :mod:`probe.capture.blocks`): None: batches longer than
            :data:`probe.capture.blocks.AUTO_LENGTH` tokens (or too large for whole maps) are captured in
            blocks of query rows, and accumulators that need whole maps are left out of them with a
            note; 0: whole maps always; n >= 1: every batch in blocks of n rows (an accumulator
            without ``row_blocks`` is then refused).
        announce: called once, with one line, when a batch (one long text) is going to take
            :data:`probe.runs.pace.LONG_S` seconds or more, from the time of its second layer
            (:class:`probe.runs.pace.Pace`; with ``progress`` a bar over its layers follows); None: on
            stderr with ``progress`` (every command that labels heads on a terminal), else silent.

    Returns:
        An :class:`AnalysisResult`.

    Raises:
        InputError: no text, an empty text, batch_size < 1, max_length < 2, a bad threshold, labels_by
            or query_block.
        UnsupportedAnalysisError: an accumulator not made for this kind of model or site, or one that
            needs whole maps with a ``query_block`` >= 1, at once.
        CaptureError: attention probabilities could not be captured.
    """
    check_supported(lm, [*accumulators, *finished])
    check_block_ready(accumulators, check_query_block(query_block))
    t0 = time.perf_counter()
    prepared = hasattr(texts, "iter_batches")  # images (probe.images.Images): batches of their own
    sized = prepared or isinstance(texts, (str, Text)) or hasattr(texts, "__len__")
    items = texts if prepared else as_texts(validate.texts(texts)) if sized else stream_texts(texts)
    thresholds_used = _checked(lm, batch_size, max_length, thresholds, example_tokens, value_weighted, labels_by)
    value_weighted, left_out = value_weighting_for(lm, value_weighted, labels_by)
    n_examples = max(0, min(n_examples, len(items)) if sized else n_examples)
    if generate is not None:
        items = _generated(lm, items, generate, sized)

    stats = HeadStatistics(lm.sites, lm.geometry.n_heads, lm.tokenizer, value_weighted=value_weighted)
    examples = ExampleMaps(range(n_examples), lm.sites, example_tokens)
    counts = TokenCounts(getattr(lm.tokenizer, "unk_token_id", None))
    sinks = SinkProfile(lm.sites, lm.geometry.n_heads)
    if lm.kind != "encoder-decoder" and find_routers(lm):  # a mixture-of-experts model: its routers beside the heads
        accumulators = [*accumulators, RouterLoad(lm, n_examples)]
    batches = items.iter_batches(batch_size) if prepared else iter_batches(
        lm, items, batch_size=batch_size, max_length=max_length, parse_special_tokens=parse_special_tokens)
    t1 = time.perf_counter()
    everything = [stats, examples, counts, sinks, *accumulators]
    notes = _run_with_bar(lm, batches, everything, progress, len(items) if sized else None, query_block, announce)
    t_run = time.perf_counter() - t1
    if reduce is not None:
        reduce(everything)
    if counts.result().sequences == 0:
        raise InputError("no text given")

    extras = [*accumulators, *finished]
    heads = _heads_table(lm, stats, extras, thresholds_used, n_clusters, labels_by)
    c = counts.result()
    return AnalysisResult(
        model=model_summary(lm), heads=heads, stats=stats, thresholds=thresholds_used, counts=c.as_dict(),
        examples=label_examples(examples.result(), lm.tokenizer),
        settings={"batch_size": batch_size, "max_length": validate.max_length(max_length, lm.max_length),
                  "n_examples": n_examples, "example_tokens": example_tokens, "n_clusters": n_clusters,
                  "parse_special_tokens": parse_special_tokens, "query_block": query_block,
                  **validate.value_weighting(value_weighted, labels_by)},
        timings={"forward_and_statistics_s": round(t_run, 4), "analyze_s": round(time.perf_counter() - t0, 4)},
        notes=list(lm.notes) + [left_out] * bool(left_out) + list(notes) + input_notes(c, lm.tokenizer),
        results={sinks.name: sinks.result(), **{acc.name: acc.result() for acc in extras}},
    )


def _run_with_bar(lm: LoadedModel, batches: Iterable[Batch], accumulators: list[Accumulator], progress: bool,
                  total: int | None, query_block: int | None = None, announce: Callable | None = None) -> list[str]:
    """:func:`run`, with a tqdm progress bar counting sequences when ``progress`` (``total``: None
    for a stream), and a long batch's estimate said to ``announce`` (:class:`probe.runs.pace.Pace`)."""
    bar = None
    if progress:
        bar = progress_bar(total=total, unit="seq", desc="analyze", leave=False)
    pace = Pace(len(lm.sites), announce if announce is not None else to_stderr if progress else None, progress)
    try:
        return run(lm, batches, accumulators, progress=bar, query_block=query_block, pace=pace)
    finally:
        pace.end()
        if bar is not None:
            bar.close()


def _checked(lm: LoadedModel, batch_size: int, max_length: int | None, thresholds, example_tokens,
             value_weighted: bool = True, labels_by: str = "weight") -> dict:
    """The thresholds to use, after checking the settings of :func:`analyze`.

    Raises:
        InputError: batch_size < 1, max_length < 2 or above the model's limit, a bad threshold,
            example_tokens < 2, labels by norm without value-weighted statistics.
    """
    validate.value_weighting(value_weighted, labels_by)
    validate.positive_int("batch size", batch_size)
    validate.max_length(max_length, lm.max_length)
    if example_tokens is not None:
        validate.positive_int("example tokens", example_tokens, 2)
    return {**default_thresholds(), **validate.thresholds(thresholds)}


def _generated(lm: LoadedModel, items, generate: int, sized: bool):
    """The texts with the model's own greedy targets (a list if ``items`` is one, else a stream).

    Raises:
        InputError: ``lm`` is not an encoder-decoder model, or ``generate`` < 1.
    """
    check_generate(lm, generate)
    items = with_generated_targets(lm, items, generate)
    return list(items) if sized else items


def _heads_table(lm: LoadedModel, stats: HeadStatistics, extras: Sequence[Accumulator],
                 thresholds: dict[str, float], n_clusters: int, labels_by: str = "weight") -> pd.DataFrame:
    """One row per head: the statistics, the columns the other accumulators add, labels (their rules
    on the statistics of ``labels_by``, and the accumulators' own), and ``cluster`` (k-means) unless
    an accumulator gave ``group``. Heads physically removed by pruning are labelled ``removed`` with
    cluster/group -1."""
    heads = stats.result()
    for acc in extras:
        extra = acc.columns()
        if extra is not None:
            heads = merge_head_columns(heads, extra)
    heads = labelled(heads, thresholds, [lab for acc in extras for lab in acc.head_labels()], labels_by)
    if "group" not in heads.columns:
        heads["cluster"] = cluster_heads(heads, list(stats.statistics), n_clusters=n_clusters)
    if any(site.window is not None for site in lm.sites):  # sliding windows: each head's site's window
        heads["window"] = site_windows(lm.sites, heads)
    if lm.pruned is not None:  # physically removed heads: no statistic, label "removed", no cluster
        gone = [(layer, h) for layer, hs in lm.pruned.removed().items() for h in hs]
        rows = heads.set_index(["layer", "head"]).index.isin(gone)
        heads.loc[rows, ["label", "labels"]] = REMOVED
        heads.loc[rows, "cluster" if "cluster" in heads.columns else "group"] = -1
    return heads


#: The columns that name a head in a heads table (``stack`` and ``kind`` on encoder-decoder models only).
HEAD_KEYS = ("stack", "kind", "layer", "head")


def site_windows(sites, heads: pd.DataFrame) -> pd.Series:
    """The ``window`` column of a heads table: each head's site's sliding window (the most keys a query
    sees, itself included; :attr:`probe.sites.Site.window`), empty (<NA>) where the site has none; the
    keys before and after the query are in run.json's ``site_windows``.

    Args:
        sites: the model's sites. heads: one row per head, with ``layer`` (and ``stack``/``kind`` where
            the model has several stacks).
    """
    keys = [k for k in ("stack", "kind") if k in heads.columns]
    window = {tuple(getattr(s, k) for k in keys) + (s.layer,): s.window for s in sites}
    rows = zip(*(heads[k] for k in keys), heads["layer"]) if keys else ((layer,) for layer in heads["layer"])
    return pd.Series(pd.array([window.get(tuple(r)) for r in rows], dtype="Int64"), index=heads.index)


def merge_head_columns(heads: pd.DataFrame, frame: pd.DataFrame, columns=None) -> pd.DataFrame:
    """``heads`` with the columns of ``frame`` (one row per head) added: the one way every analysis and
    command adds its columns to the heads table.

    Rows are matched on the :data:`HEAD_KEYS` both tables have, one to one; a key column only ``frame``
    has (``stack``/``kind`` of a one-stack model) is not added.

    Args:
        heads: the heads table ([heads] rows).
        frame: one row per head, with ``layer`` and ``head`` (and ``stack``/``kind`` where ``heads`` has them).
        columns: the columns of ``frame`` to add, in this order (default: all but the keys).

    Returns:
        A new table: ``heads``' rows in their order, its columns, then the added ones (NaN for a head
        ``frame`` has no row for).

    Raises:
        pandas.errors.MergeError: a head twice in either table.
    """
    keys = [c for c in HEAD_KEYS if c in heads and c in frame]
    added = [c for c in (frame.columns if columns is None else columns) if c not in HEAD_KEYS]
    return heads.merge(frame[keys + added], on=keys, how="left", validate="one_to_one")


def labelled(heads: pd.DataFrame, thresholds: dict[str, float], extra, labels_by: str = "weight") -> pd.DataFrame:
    """:func:`probe.measures.classify.label_heads` with its rules read on the statistics of ``labels_by``:
    ``"weight"`` the attention statistics, ``"norm"`` their value-weighted forms (``first-token`` holds
    when ``first_by_norm`` >= its threshold ...; rules on columns without such a form read the column)."""
    if labels_by != "norm":
        return label_heads(heads, thresholds, extra)
    swapped = {stat for stat, _ in LABEL_RULES.values() if by_norm(stat) in heads}
    view = heads.copy()
    for stat in swapped:
        view[stat] = heads[by_norm(stat)]
    out = label_heads(view, thresholds, extra)
    for stat in swapped:
        out[stat] = heads[stat].to_numpy()
    return out


#: Fewer real tokens than this in the whole corpus and the labels rest on too little text.
MIN_TOKENS = 50
#: A larger share of unknown-word tokens than this gets a note.
UNKNOWN_SHARE = 0.01


def input_notes(counts, tokenizer) -> list[str]:
    """Notes on the input a user should know: too little text, many unknown-word tokens."""
    notes = []
    if counts.tokens < MIN_TOKENS:
        notes.append(f"only {plural(counts.tokens, 'token')} in {plural(counts.sequences, 'sequence')}: per-head "
                     "statistics of so little text are dominated by special tokens and the first positions; labels are "
                     "unreliable")
    if counts.tokens and counts.unknown / counts.tokens > UNKNOWN_SHARE:
        unk = getattr(tokenizer, "unk_token", None) or "the unknown-word token"
        notes.append(f"{counts.unknown} of {counts.tokens} tokens ({100 * counts.unknown / counts.tokens:.1f}%) "
                     f"are {unk}: the tokenizer has no piece for some characters (emoji, rare scripts), so "
                     f"attention to them is measured on {unk}")
    return notes
