"""``probe path`` as a function: path patching (:func:`~probe.circuits.paths.path_patch`) of sender heads
into chosen receivers (a head's query, key or value input, or the logits) on prompt pairs, each sender
into each receiver and all of them together, and the analysis a run folder is written from (report section,
path.csv, run.json; heads.csv with the labels of a short analysis: :func:`probe.entries.pairs.run_path` and its
``save``).

Norms on a receiver's input are recomputed from the patched stream (the norm before the head's
projection, or the final norm before the logits): nothing is frozen but the other heads' outputs in
the sender pass, as Wang et al. 2022 do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pandas as pd

from ..architectures.modules import head_geometry
from ..bounds import HEAD_NAME, INPUT_NAME, path_reads  # noqa: F401 (HEAD_NAME, INPUT_NAME: re-exported)
from ..causal.parts import check_pre_ln
from ..effects.pairs import LAST_POSITION, Pair, builtin_pairs, encode_pairs, metric_place
from ..effects.patch_full import full_pass, last_logit_diffs, model_inputs
from ..effects.patch_run import label_texts
from ..effects.patching import MIN_GAP
from ..errors import InputError
from ..patterns import CircuitProbe, circuit_probe
from ..records import AnalysisResult
from ..runs import pace
from ..runs.analysis import analyze
from ..sites import head_name
from .checked import graph_of
from .graph import Graph
from .paths import path_patch


def parse_senders(text: str, graph: Graph) -> list[tuple[int, int]]:
    """``--senders``: comma-separated heads ``L5H1`` (layer, head, 0-based), each once, in order.

    Raises:
        InputError: a name that is not a head of the model.
    """
    out = []
    for part in (p.strip() for p in text.split(",")):
        m = HEAD_NAME.fullmatch(part)
        if m is None or int(m[1]) >= graph.layers or int(m[2]) >= graph.heads:
            raise InputError(f"--senders: {part!r} is not a head of this model ({head_name(0, 0)} .. "
                             f"{head_name(graph.layers - 1, graph.heads - 1)})")
        out.append((int(m[1]), int(m[2])))
    return list(dict.fromkeys(out))


def parse_receivers(text: str, graph: Graph) -> list[tuple[str, int, int]]:
    """``--receivers``: comma-separated ``logits`` or a head's input ``L9H6.q``, ``L9H6.k``, ``L9H6.v``
    (k and v: the key/value head serving query head 6), ``L9KV1.k`` (key/value head 1), as the graph's
    inputs (kind, layer, index), each once, in order.

    Raises:
        InputError: anything else.
    """
    rep, out = graph.heads // graph.kv_heads, []
    for part in (p.strip() for p in text.split(",")):
        if part == "logits":
            out.append(("logits", graph.layers, 0))
            continue
        m = INPUT_NAME.fullmatch(part)
        n = graph.kv_heads if m is not None and m[2] == "KV" else graph.heads
        if m is None or int(m[1]) >= graph.layers or int(m[3]) >= n or (m[2] == "KV" and m[4] == "q"):
            last = graph.layers - 1
            kv = f", L{last}KV{graph.kv_heads - 1}.k" if graph.kv_heads != graph.heads else ""
            raise InputError(f"--receivers: {part!r} is neither logits nor a head's input of this model (layers 0 .. "
                             f"{last}, heads 0 .. {graph.heads - 1}: L{last}H0.q, L{last}H0.k, L{last}H0.v{kv})")
        layer, index, kind = int(m[1]), int(m[3]), m[4]
        out.append((kind, layer, index if kind == "q" or m[2] == "KV" else index // rep))
    return list(dict.fromkeys(out))


def check_arguments(senders: str, receivers: str, config=None) -> None:
    """Refuse what ``--senders`` and ``--receivers`` decide before any weight loads (a second where
    loading the model and patching take minutes): a receiver that reads none of the senders
    (:func:`probe.bounds.path_reads`), and a head out of the model's range (with ``config``).

    Args:
        senders, receivers: as :func:`parse_senders` and :func:`parse_receivers` read them.
        config: the model's ``transformers`` config (:func:`probe.loading.models.peek_config`), or None
            (the ranges are checked once the model has loaded).

    Raises:
        InputError: as :func:`~probe.bounds.path_reads`; a name out of range (the words of
            :func:`parse_senders` and :func:`parse_receivers`).
    """
    path_reads(senders, receivers)
    if config is None:
        return
    try:
        g = head_geometry(config)
    except Exception:  # noqa: BLE001 - an architecture the config alone does not describe: checked once loaded
        return
    names = Graph(g.n_layers, g.n_heads, g.n_kv_heads)
    parse_senders(senders, names)
    parse_receivers(receivers, names)


def receiver_name(graph: Graph, receiver: tuple[str, int, int]) -> str:
    """``logits``, ``L9H6.q``, or ``L9KV1.k`` (``L9H6.k`` where every key/value head serves one query head)."""
    kind, layer, index = receiver
    if kind == "logits":
        return "logits"
    if kind != "q" and graph.kv_heads != graph.heads:
        return f"L{layer}KV{index}.{kind}"  # a key/value head, named as the circuit graph names it
    return f"{head_name(layer, index)}.{kind}"


@dataclass
class PathRun:
    """What ``probe path`` measured.

    Attributes:
        frame: one row per sender and receiver and one for all together: ``senders``, ``receivers``
            (names joined by ``+``), ``effect`` (M(path-patched) - M(clean), logits), ``share`` (effect /
            (LD_corrupted - LD_clean): the share of corrupting everything that the path carries; NaN
            when the two runs differ by less than :data:`~probe.effects.patching.MIN_GAP`).
        ld_clean, ld_corrupted: the runs' mean logit differences.
        pairs, source; seconds: phase -> wall time; notes; metric_at: where the metric reads the logits,
        in words (:func:`~probe.effects.pairs.metric_place`).
    """

    frame: pd.DataFrame
    ld_clean: float
    ld_corrupted: float
    pairs: list[Pair]
    source: str
    seconds: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    metric_at: str = LAST_POSITION


def rest_line(first_s: float, paths: int) -> str | None:
    """The estimate said after the first of ``paths`` paths took ``first_s`` seconds: the others' time
    at that pace, where it reaches :data:`probe.runs.pace.LONG_S` (else None: nothing to say)."""
    left = first_s * (paths - 1)
    if paths < 2 or left < pace.LONG_S:
        return None
    return (f"path patching: the first of {paths} paths took {first_s:.1f} s; the other {paths - 1} will take about "
            f"{pace.duration(left)} on this machine as loaded now, then the heads are labelled")


def measure(lm, senders: str, receivers: str, pairs: list[Pair] | None = None, *,
            source: str = "built-in IOI set", estimate=None, clock=None) -> PathRun:
    """Path patching of each sender into each receiver, and of all senders into all receivers together.

    Args:
        lm: a decoder the circuit graph fits (:func:`~probe.circuits.checked.graph_of`).
        senders, receivers: as :func:`parse_senders` and :func:`parse_receivers` read them.
        pairs: the prompt pairs (default the built-in set).
        estimate: a callable given one line after the first path where the others will take
            :data:`probe.runs.pace.LONG_S` or more (:func:`rest_line`), or None.
        clock: the estimate's clock (seconds, monotonic; default ``time.perf_counter``; tests give a fake one).

    Raises:
        UnsupportedAnalysisError: a model outside the graph. InputError: bad names, pairs that do not encode.
    """
    pairs = builtin_pairs() if pairs is None else pairs
    enc = encode_pairs(lm, pairs)
    check_pre_ln(lm, "path patching")
    with graph_of(lm) as (wiring, graph, _):
        send, receive = parse_senders(senders, graph), parse_receivers(receivers, graph)
        t = time.perf_counter()
        ld = {name: float(last_logit_diffs(full_pass(lm, enc, model_inputs(lm, enc, ids), 1)[0], enc, 1).mean())
              for name, ids in (("clean", enc.clean), ("corrupted", enc.corrupted))}
        gap = ld["corrupted"] - ld["clean"]
        jobs = [([s], [r]) for s in send for r in receive]
        if len(jobs) > 1:
            jobs.append((send, receive))
        rows, clock = [], time.perf_counter if clock is None else clock
        for i, (s, r) in enumerate(jobs):
            begun = clock() if i == 0 and estimate is not None else None  # the first path is timed
            effect = path_patch(lm, wiring, graph, enc, s, r) + 0.0  # + 0.0: an exact zero is 0, not -0
            line = None if begun is None else rest_line(clock() - begun, len(jobs))
            if line is not None:
                estimate(line)
            rows.append({"senders": "+".join(head_name(*h) for h in s),
                         "receivers": "+".join(receiver_name(graph, x) for x in r), "effect": effect,
                         "share": effect / gap + 0.0 if abs(gap) >= MIN_GAP else float("nan")})
        notes = [] if abs(gap) >= MIN_GAP else [
            f"|LD_clean - LD_corrupted| = {abs(gap):.3g} < {MIN_GAP}: no share of the corrupted run's change"]
        return PathRun(pd.DataFrame(rows), ld["clean"], ld["corrupted"], pairs, source,
                       {"path_s": time.perf_counter() - t}, notes, metric_place(lm.kind))


def path_analysis(lm, senders: str, receivers: str, pairs: list[Pair] | None = None, *,
                  source: str = "built-in IOI set", progress: bool = False,
                  estimate=None) -> tuple[PathRun, AnalysisResult]:
    """Measure (:func:`measure`; ``estimate`` as it takes it) and label the heads with a short analysis:
    ``(PathRun, the analysis the run folder is written from)``, no folder written.

    Raises:
        UnsupportedAnalysisError, InputError: as :func:`measure`.
    """
    result = measure(lm, senders, receivers, pairs, source=source, estimate=estimate)
    t = time.perf_counter()
    analysis = analyze(lm, label_texts(lm, result.pairs), progress=progress,
                       finished=[circuit_probe(lm)] if CircuitProbe.refusal(lm) is None else [])
    result.seconds["analyze_s"] = time.perf_counter() - t
    analysis.results["path"] = result
    analysis.notes += result.notes
    analysis.timings.update({k: round(v, 4) for k, v in result.seconds.items()})
    return result, analysis
