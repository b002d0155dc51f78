"""``analyze``: run a corpus through a model under hooks and measure every head.

Data flow (one direction): texts -> tokenizer -> model with hooks -> per-head statistics
accumulated as sums and counts (:class:`probe.stats.HeadStatistics`) -> labels and clusters
(:mod:`probe.classify`) -> :class:`AnalysisResult` (DataFrame + a few example maps). Each layer's
attention probabilities are reduced as soon as the layer has run, so memory does not grow with
the corpus; only ``n_examples`` sequences keep their full maps, for the report.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from .capture import attention_hooks, pad, tokenize
from .classify import cluster_heads, default_thresholds, label_heads, validate_thresholds
from .errors import InputError
from .models import LoadedModel
from .stats import STATISTICS, HeadStatistics, TokenClassifier


@dataclass
class Example:
    """One example sequence with its full attention maps.

    Attributes:
        text: the input text.
        tokens: the T token strings (special tokens included).
        attentions: [layers, heads, T, T] float32 attention probabilities.
        truncated: the text was cut to the token limit (``tokens`` are what was analysed).
    """

    text: str
    tokens: list[str]
    attentions: np.ndarray
    truncated: bool = False


@dataclass
class AnalysisResult:
    """Everything ``analyze`` measured.

    Attributes:
        heads: one row per (layer, head): ``layer``, ``head``, ``label`` (primary), ``labels``
            (all, ';'-separated), one column per statistic of :data:`probe.stats.STATISTICS`,
            and ``cluster``.
        stats: the raw running sums and counts (mergeable with another run's).
        thresholds: label -> threshold used.
        counts: sequences, tokens (real, special included), truncated sequences, batches.
        examples: a few sequences with their full maps.
        settings: batch size, max length, example count.
        timings: seconds spent tokenizing, in forward + statistics, and in total.
        notes: what probe changed to capture correctly (attention implementation, train mode).
    """

    model: dict
    heads: pd.DataFrame
    stats: HeadStatistics
    thresholds: dict[str, float]
    counts: dict
    examples: list[Example]
    settings: dict
    timings: dict
    notes: list[str] = field(default_factory=list)

    def label_counts(self) -> dict[str, int]:
        """Primary label -> number of heads."""
        return self.heads["label"].value_counts().to_dict()


def model_summary(lm: LoadedModel) -> dict:
    """Name, source, type, geometry and parameter count of a loaded model (JSON-ready)."""
    g = lm.geometry
    return {
        "name": lm.name, "source": lm.source, "model_type": lm.model_type,
        "class": type(lm.model).__name__, "family": lm.spec.family, "causal": lm.causal,
        "layers": g.n_layers, "heads": g.n_heads, "kv_heads": g.n_kv_heads, "d_head": g.d_head,
        "d_model": g.d_model, "max_length": lm.max_length,
        "parameters": int(sum(p.numel() for p in lm.model.parameters())),
        "dtype": str(next(lm.model.parameters()).dtype).replace("torch.", ""),
    }


def analyze(lm: LoadedModel, texts: Sequence[str], *, batch_size: int = 16, max_length: int | None = None,
            n_examples: int = 3, thresholds: dict[str, float] | None = None, n_clusters: int = 6,
            progress: bool = False) -> AnalysisResult:
    """Measure every attention head of ``lm`` on ``texts``.

    Sequences are sorted by length into batches (less padding); padding never enters a statistic,
    so batched results equal one-sequence-at-a-time results. Sequences longer than ``max_length``
    (default: the model's limit) are truncated and counted.

    Args:
        texts: the sequences.
        batch_size: sequences per forward pass (>= 1).
        max_length: token limit per sequence (<= the model's limit).
        n_examples: how many of the first texts keep full [layers, heads, T, T] maps.
        thresholds: label thresholds overriding METRICS.md's defaults.
        n_clusters: k of the k-means grouping of heads.
        progress: show a tqdm progress bar.

    Returns:
        An :class:`AnalysisResult`.

    Raises:
        InputError: no text, an empty text, batch_size < 1, max_length < 2 (from
            :func:`probe.capture.tokenize`) or a bad threshold.
        CaptureError: attention probabilities could not be captured.
    """
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise InputError("no text given")
    if any(not t or not t.strip() for t in texts):
        raise InputError("empty text in input")
    if batch_size < 1:
        raise InputError(f"batch size must be at least 1, got {batch_size}")
    try:
        validate_thresholds(thresholds)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    thresholds_used = default_thresholds()
    thresholds_used.update({k: float(v) for k, v in (thresholds or {}).items()})

    t0 = time.perf_counter()
    features, truncated_flags = tokenize(lm, texts, max_length, per_text=True)
    truncated = sum(truncated_flags)
    t_tok = time.perf_counter() - t0
    order = sorted(range(len(texts)), key=lambda i: len(features[i]["input_ids"]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    g = lm.geometry
    acc = HeadStatistics(g.n_layers, g.n_heads)
    classifier = TokenClassifier(lm.tokenizer)
    n_examples = max(0, min(n_examples, len(texts)))
    example_maps: dict[int, list[np.ndarray]] = {i: [None] * g.n_layers for i in range(n_examples)}

    state = {}

    def on_layer(layer: int, probs: torch.Tensor) -> None:
        acc.update(layer, probs, state["feats"])
        for row, idx in state["examples"]:
            n = state["lengths"][row]
            example_maps[idx][layer] = probs[row, :, :n, :n].float().cpu().numpy()

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(texts), unit="seq", desc="analyze", leave=False)
    n_tokens = 0
    t1 = time.perf_counter()
    with torch.no_grad(), attention_hooks(lm, on_layer) as notes:
        for batch in batches:
            enc = pad(lm, [features[i] for i in batch])
            state["feats"] = classifier.features(enc.input_ids, enc.attention_mask, lm.causal)
            state["lengths"] = enc.lengths.tolist()
            state["examples"] = [(row, idx) for row, idx in enumerate(batch) if idx < n_examples]
            kwargs = enc.model_inputs()
            if lm.causal:
                kwargs["use_cache"] = False
            lm.model(**kwargs)
            n_tokens += int(enc.attention_mask.sum())
            if bar is not None:
                bar.update(len(batch))
    if bar is not None:
        bar.close()
    t_run = time.perf_counter() - t1

    heads = label_heads(acc.to_frame(), thresholds_used)
    heads["cluster"] = cluster_heads(heads, list(STATISTICS), n_clusters=n_clusters)
    examples = []
    for idx in range(n_examples):
        ids = features[idx]["input_ids"]
        examples.append(Example(texts[idx], lm.tokenizer.convert_ids_to_tokens(ids),
                                np.stack(example_maps[idx]), bool(truncated_flags[idx])))
    return AnalysisResult(
        model=model_summary(lm),
        heads=heads,
        stats=acc,
        thresholds=thresholds_used,
        counts={"sequences": len(texts), "tokens": n_tokens, "truncated": truncated, "batches": len(batches)},
        examples=examples,
        settings={"batch_size": batch_size, "max_length": min(max_length or lm.max_length, lm.max_length),
                  "n_examples": n_examples, "n_clusters": n_clusters},
        timings={"model_load_s": round(lm.load_seconds, 4), "tokenize_s": round(t_tok, 4),
                 "forward_and_statistics_s": round(t_run, 4), "analyze_s": round(time.perf_counter() - t0, 4)},
        notes=list(lm.notes) + list(notes) + _size_notes(n_tokens, len(texts)),
    )


#: Fewer real tokens than this in the whole corpus and the labels rest on too little text.
MIN_TOKENS = 50


def _size_notes(n_tokens: int, n_sequences: int) -> list[str]:
    if n_tokens >= MIN_TOKENS:
        return []
    return [f"only {n_tokens} tokens in {n_sequences} sequence(s): per-head statistics of so little text "
            f"are dominated by special tokens and the first positions; labels are unreliable"]


def versions() -> dict:
    """Versions of Python and the libraries whose behaviour shapes the numbers."""
    import transformers

    return {"probe": __import__("probe").__version__, "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "pandas": pd.__version__, "numpy": np.__version__}
