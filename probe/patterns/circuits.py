"""Decoder circuits: induction, duplicate-token and previous-token scores on repeated random tokens,
and attention sinks with and without a BOS token (docs/statistics.md, "Decoder circuits").

The probe (Olsson et al. 2022, "In-context Learning and Induction Heads", sec. 2; the repeated
random sequences TransformerLens' head detector uses): a batch of 16 sequences r_1..r_n r_1..r_n
(n = 25), r drawn uniformly with a fixed seed from the vocabulary without special tokens, preceded by
BOS only where the tokenizer adds one. With positions t = 0..2n-1 counted from the first random
token, on the rows of the second half (t = n..2n-1), token-weighted over rows and sequences:

- ``induction`` = A[t, t-n+1] (the token after the earlier occurrence of the current token);
- ``duplicate`` = A[t, t-n] (the earlier occurrence itself);
- ``prev_random`` = A[t, t-1] (previous-token attention on random text, a control).

Decided here: the n tokens of one sequence are drawn without replacement (all distinct), so the
earlier occurrence of every second-half token is unique (with replacement, a repeat inside the
first half would make "the earlier occurrence" ambiguous); each token is still uniform over the
vocabulary. The probe is its own small run of :func:`probe.runs.analysis.run` (16 x 50 tokens: a few
forward-pass seconds for SmolLM2 on two CPU cores), not part of the corpus pass.

Attention sinks (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"):
per layer, the mean over heads and over query rows i >= 1 of A[i, 0] (row 0 can only attend to
itself in a causal model and is left out), measured on the same texts twice: with a BOS token at
position 0 and without one (the tokenizer's own BOS token is prepended where it adds none, and
removed where it adds one; a tokenizer without a BOS token gives only the second). The texts are
the first 16 of the corpus (cut to 128 tokens) when given, else the probe's random sequences.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..errors import InputError
from ..measures.accumulators import Accumulator, check_supported, present_heads
from ..runs.analysis import run
from ..sites import Site
from ..text.inputs import Batch, Text, as_texts, tokenize

#: Defaults of the probe (docs/statistics.md).
N_TOKENS, BATCH, SEED = 25, 16, 0
#: Corpus texts used for the attention-sink comparison, and their token cap.
SINK_TEXTS, SINK_TOKENS = 16, 128
#: Score columns added to heads.csv.
CIRCUIT_COLUMNS = ("induction", "duplicate", "prev_random")


def adds_bos(tokenizer) -> bool:
    """True when the tokenizer puts its BOS token at position 0 of an encoded text."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == bos


def random_vocabulary(tokenizer) -> torch.Tensor:
    """Token ids the probe draws from: the whole vocabulary without special tokens (and added special tokens)."""
    special = set(tokenizer.all_special_ids)
    added = getattr(tokenizer, "added_tokens_decoder", {})
    special |= {i for i, tok in added.items() if getattr(tok, "special", False)}
    return torch.tensor([i for i in range(len(tokenizer)) if i not in special], dtype=torch.long)


def repeated_random_tokens(tokenizer, n: int = N_TOKENS, batch: int = BATCH, seed: int = SEED,
                           bos: bool | None = None) -> tuple[torch.Tensor, int]:
    """The probe's input: [batch, offset + 2n] token ids r_1..r_n r_1..r_n, with BOS first where asked.

    Args:
        bos: prepend the BOS token (default: where the tokenizer adds one).

    Returns:
        (ids, offset): offset = 1 with a BOS token, else 0 (position of r_1).

    Raises:
        InputError: n < 2, or fewer than n ordinary tokens in the vocabulary.
    """
    if n < 2:
        raise InputError(f"the repeated-token probe needs n >= 2, got {n}")
    vocab = random_vocabulary(tokenizer)
    if len(vocab) < n:
        raise InputError(f"the vocabulary has {len(vocab)} ordinary tokens, fewer than n = {n}")
    g = torch.Generator().manual_seed(seed)
    first = torch.stack([vocab[torch.randperm(len(vocab), generator=g)[:n]] for _ in range(batch)])  # [batch, n]
    ids = torch.cat([first, first], 1)
    bos = adds_bos(tokenizer) if bos is None else bos
    if bos:
        ids = torch.cat([torch.full((batch, 1), tokenizer.bos_token_id, dtype=torch.long), ids], 1)
    return ids, int(bos)


def ids_batch(rows: Sequence[Sequence[int]], pad_id: int, texts: Sequence[Text], special_first: bool) -> Batch:
    """A right-padded :class:`Batch` of token ids (no character offsets)."""
    B, T = len(rows), max(len(r) for r in rows)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, :len(r)] = 1
    special = torch.zeros(B, T, dtype=torch.bool)
    special[:, 0] = special_first
    return Batch(ids, mask, None, torch.zeros(B, T, 2, dtype=torch.long), special, torch.full((B, T), -1),
                 list(texts), list(range(B)), [False] * B)


class CircuitScores(Accumulator):
    """Sums of A[t, t-n+1], A[t, t-n] and A[t, t-1] over the second-half rows of the probe's batches.

    Args:
        sites: the model's sites; n_heads: query heads per site; n: length of the random half;
        offset: position of r_1 (1 after a BOS token).
    """

    name = "circuit_scores"
    title = "the induction / duplicate-token probe"
    model_kinds = ("decoder",)
    on_device = ("sums",)

    def __init__(self, sites: list[Site], n_heads: int, n: int = N_TOKENS, offset: int = 0) -> None:
        self.sites, self.n_heads, self.n, self.offset = list(sites), n_heads, n, offset
        self._pos = {s: i for i, s in enumerate(self.sites)}
        self.sums = torch.zeros(len(self.sites), n_heads, 3, dtype=torch.float64)
        self.rows = 0

    def begin_batch(self, batch: Batch) -> None:
        if batch.input_ids.shape[1] != self.offset + 2 * self.n or not bool(batch.real.all()):
            raise ValueError("circuit scores need unpadded sequences of offset + 2n tokens")
        self.rows += len(batch) * self.n

    def update(self, site: Site, probs: torch.Tensor, batch: Batch) -> None:
        """``probs`` [batch, heads, T, T]: add the three scores of every second-half row."""
        n, o = self.n, self.offset
        q = torch.arange(n, 2 * n, device=probs.device) + o  # rows of the second half
        cols = torch.stack([q - n + 1, q - n, q - 1])  # [3, n]
        vals = probs[:, :, q[None, :].expand(3, n), cols]  # [batch, heads, 3, n]
        self.follow(probs.device)
        self.sums[self._pos[site]] += vals.to(self.sums.device, torch.float64).sum((0, 3))  # rows added in float64

    def merge(self, other: CircuitScores) -> CircuitScores:
        self.sums += other.sums.to(self.sums.device)
        self.rows += other.rows
        return self

    def result(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head``, ``induction``, ``duplicate``, ``prev_random``."""
        S, H = len(self.sites), self.n_heads
        means = (self.sums.cpu() / max(self.rows, 1)).reshape(S * H, 3).numpy()
        frame = pd.DataFrame(means, columns=list(CIRCUIT_COLUMNS))
        frame.insert(0, "head", np.tile(np.arange(H), S))
        frame.insert(0, "layer", np.repeat([s.layer for s in self.sites], H))
        return frame


class SinkShares(Accumulator):
    """Per site, the sum over heads and real query rows i >= 1 of A[i, 0] (attention to position 0)."""

    name = "sinks"
    title = "the attention-sink probe"
    model_kinds = ("decoder",)
    on_device = ("sums", "rows")

    def __init__(self, sites: list[Site]) -> None:
        self.sites = list(sites)
        self._pos = {s: i for i, s in enumerate(self.sites)}
        self.sums = torch.zeros(len(self.sites), dtype=torch.float64)
        self.rows = torch.zeros(len(self.sites), dtype=torch.int64)

    def update(self, site: Site, probs: torch.Tensor, batch: Batch) -> None:
        self.follow(probs.device)
        dev = self.sums.device
        real = batch.real.to(dev).clone()
        real[:, 0] = False  # row 0 sees only itself in a causal model
        i = self._pos[site]
        present = present_heads(probs).to(dev)  # heads removed by pruning have no probabilities
        first = probs[..., 0].to(dev, torch.float64)  # [batch, heads, query]
        keep = real[:, None, :] & present[None, :, None]  # padded rows and removed heads out before the sum
        self.sums[i] += torch.where(keep, first, 0.0).sum()
        self.rows[i] += keep.sum()

    def merge(self, other: SinkShares) -> SinkShares:
        self.sums += other.sums.to(self.sums.device)
        self.rows += other.rows.to(self.rows.device)
        return self

    def result(self) -> np.ndarray:
        """[sites] mean attention to position 0 over heads and rows i >= 1 (NaN without such rows)."""
        rows, sums = self.rows.cpu().double(), self.sums.cpu()
        return torch.where(rows > 0, sums / rows.clamp(min=1), torch.full_like(rows, float("nan"))).numpy()


@dataclass
class CircuitResult:
    """What :func:`circuit_probe` measured.

    Attributes:
        scores: one row per head: ``layer``, ``head``, ``induction``, ``duplicate``, ``prev_random``.
        sinks: one row per layer: ``layer``, ``with_bos``, ``without_bos`` (mean attention to position
            0; ``with_bos`` NaN when the tokenizer has no BOS token).
        settings: n, batch, seed, bos (the probe starts with BOS), bos_token, sink_texts (how many,
            and whether corpus texts or the random sequences).
        seconds: wall time of the probe's forward passes (seconds).
    """

    scores: pd.DataFrame
    sinks: pd.DataFrame
    settings: dict
    seconds: float


class CircuitProbe(Accumulator):
    """The finished circuit probe of one model, in the accumulator shape :func:`probe.runs.analysis.analyze`
    takes as ``finished=[...]``: :meth:`columns` adds ``induction``, ``duplicate`` and ``prev_random`` to
    heads.csv (``induction`` / ``duplicate-token`` labels follow from :data:`probe.measures.classify.LABEL_RULES`)."""

    name = "circuits"
    title = "the induction / duplicate-token probe"
    model_kinds = ("decoder",)

    def __init__(self, result: CircuitResult) -> None:
        self._result = result

    def update(self, site: Site, probs: torch.Tensor, batch: Batch) -> None:
        raise RuntimeError("the circuit probe has already run on its own inputs; pass it as analyze(finished=[...])")

    def merge(self, other: CircuitProbe) -> CircuitProbe:
        raise NotImplementedError("circuit probes of different runs are compared, not merged")

    def result(self) -> CircuitResult:
        return self._result

    def columns(self) -> pd.DataFrame:
        return self._result.scores


def _sink_rows(lm, texts: Sequence[str | Text] | None, random_ids: torch.Tensor, offset: int):
    """Token rows without and with BOS for the sink comparison (the second None without a BOS token)."""
    tok = lm.tokenizer
    if texts:
        rows = [t.ids for t in tokenize(lm, as_texts(list(texts)[:SINK_TEXTS]), min(SINK_TOKENS, lm.max_length))]
        source, starts_with_bos = "corpus", adds_bos(tok)
    else:
        rows, source, starts_with_bos = [r.tolist() for r in random_ids], "random", bool(offset)
    bos = getattr(tok, "bos_token_id", None)
    if starts_with_bos:
        with_bos = [list(r) for r in rows if len(r) > 2]
        without = [r[1:] for r in with_bos]
    else:
        without = [list(r) for r in rows if len(r) > 1]
        with_bos = [[bos] + r for r in without] if bos is not None else None
    return without, with_bos, source


@torch.no_grad()
def circuit_probe(lm, *, n: int = N_TOKENS, batch_size: int = BATCH, seed: int = SEED,
                  sink_texts: Sequence[str | Text] | None = None) -> CircuitProbe:
    """Run the repeated-random-token probe and the attention-sink comparison on a decoder.

    Args:
        lm: a loaded causal model (:class:`~probe.loading.models.LoadedModel`).
        n: random tokens per half (default 25); batch_size: sequences (default 16); seed: of the draw.
        sink_texts: texts for the sinks (the first 16 are used, cut to 128 tokens); default the
            probe's random sequences.

    Returns:
        A :class:`CircuitProbe` (pass it to :func:`probe.runs.analysis.analyze` as ``finished=[...]``).

    Raises:
        UnsupportedAnalysisError: not a decoder-only model (:attr:`CircuitProbe.model_kinds`).
        InputError: n < 2, or 2n + 1 tokens above the model's limit.
    """
    check_supported(lm, [CircuitProbe])
    t0 = time.perf_counter()
    ids, offset = repeated_random_tokens(lm.tokenizer, n, batch_size, seed)
    if ids.shape[1] > lm.max_length:
        raise InputError(f"the probe needs {ids.shape[1]} tokens; the model takes {lm.max_length}")
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    texts = [Text(f"repeated random tokens {i}", meta={"probe": "repeated-random"}) for i in range(batch_size)]
    scores = CircuitScores(lm.sites, lm.geometry.n_heads, n, offset)
    without, with_bos, source = _sink_rows(lm, sink_texts, ids, offset)
    shares, same = {}, SinkShares(lm.sites)
    run(lm, [ids_batch(ids.tolist(), pad, texts, bool(offset))], [scores] + ([same] if source == "random" else []))
    if source == "random":  # the probe's own sequences are one of the two sink inputs: no extra pass
        shares["with_bos" if offset else "without_bos"] = same.result()
    for key, rows in (("without_bos", without), ("with_bos", with_bos)):
        if key in shares:
            continue
        if not rows:
            shares[key] = np.full(len(lm.sites), np.nan)
            continue
        sink = SinkShares(lm.sites)
        stubs = [Text(f"sink text {i}") for i in range(len(rows))]
        run(lm, [ids_batch(rows, pad, stubs, key == "with_bos")], [sink])
        shares[key] = sink.result()
    sinks = pd.DataFrame({"layer": [s.layer for s in lm.sites], "with_bos": shares["with_bos"],
                          "without_bos": shares["without_bos"]})
    settings = {"n": n, "batch": batch_size, "seed": seed, "bos": bool(offset),
                "bos_token": getattr(lm.tokenizer, "bos_token", None), "sink_texts": len(without),
                "sink_source": source}
    return CircuitProbe(CircuitResult(scores.result(), sinks, settings, round(time.perf_counter() - t0, 4)))
