"""Per-head attention statistics of ``shared/METRICS.md``, as pure functions on tensors.

Definitions follow Clark et al. 2019 ("What Does BERT Look At?", sections 3-4), Kovaleva et al.
2019 and Voita et al. 2019; the exact per-row definitions are in the docstring of
:func:`contraction_weights`. Corpus values are token-weighted means over real query rows, kept as
running sums and counts (:class:`HeadStatistics`) so memory does not grow with the corpus and
partial results merge across batches, processes or machines.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

#: The statistics, in report order. Units: probabilities (0..1) except ``entropy`` (nats),
#: ``norm_entropy`` (0..1) and ``distance`` (tokens).
STATISTICS: tuple[str, ...] = (
    "self", "prev", "next", "first", "sep", "punct",
    "entropy", "norm_entropy", "distance", "long", "max_weight",
)

#: Keys farther than this many tokens count as long-range (``long``).
LONG_RANGE = 4


@dataclass
class TokenFeatures:
    """Per-token facts of one padded batch, shared by every layer and head.

    Attributes:
        real: [batch, T] bool, True for real tokens (a prefix of each row: right padding).
        sep: [batch, T] bool, True where the token is the tokenizer's sep token.
        punct: [batch, T] bool, True where the token is punctuation (METRICS.md ``punct``).
        has_sep: whether the tokenizer has a sep token at all (``sep`` is undefined otherwise).
        causal: decoder-only model (``next`` undefined; ``norm_entropy`` uses k_i = i + 1).
    """

    real: torch.Tensor
    sep: torch.Tensor
    punct: torch.Tensor
    has_sep: bool
    causal: bool


def is_punctuation(text: str, continuation_prefix: str | None = "##") -> bool:
    """True if ``text`` (a token's surface form) with whitespace and subword markers removed is
    non-empty and made only of Unicode punctuation (categories Pc, Pd, Pe, Pf, Pi, Po, Ps).

    ``continuation_prefix`` is the tokenizer's subword-continuation marker ("##" for WordPiece),
    stripped once from the front; None for tokenizers without one (byte-level BPE, where "##"
    is two '#' characters, i.e. punctuation).
    """
    s = text.strip()
    if continuation_prefix and s.startswith(continuation_prefix):
        s = s[len(continuation_prefix):]
    s = "".join(ch for ch in s if not ch.isspace() and ch not in "\u2581\u0120\u010a")
    return bool(s) and all(unicodedata.category(ch).startswith("P") for ch in s)


def token_surface(tokenizer, token: str) -> str:
    """The text a token string stands for: byte-level BPE bytes decoded ('Ġ.' -> ' .'),
    sentencepiece markers turned into spaces; a WordPiece continuation keeps its '##'."""
    try:
        text = tokenizer.convert_tokens_to_string([token])
    except Exception:  # noqa: BLE001 - some tokenizers cannot decode lone tokens
        text = token
    if token.startswith("##") and not text.lstrip().startswith("##"):
        text = "##" + text.lstrip()
    return text


class TokenClassifier:
    """Maps token ids to sep/punctuation flags for one tokenizer (cached per vocabulary id)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.sep_id = tokenizer.sep_token_id if getattr(tokenizer, "sep_token", None) is not None else None
        self._special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self._punct: dict[int, bool] = {}
        backend = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
        prefix = getattr(backend, "continuing_subword_prefix", None)
        if backend is None:  # slow tokenizer: WordPiece ones (BERT family) use '##'
            prefix = "##" if hasattr(tokenizer, "wordpiece_tokenizer") else None
        self.continuation_prefix = prefix or None

    def surface(self, token_id: int) -> str:
        """The text a token id stands for (see :func:`token_surface`)."""
        return token_surface(self.tokenizer, self.tokenizer.convert_ids_to_tokens(int(token_id)))

    def is_punct(self, token_id: int) -> bool:
        """Whether a token id is punctuation in the sense of METRICS.md ``punct`` (cached)."""
        token_id = int(token_id)
        if token_id not in self._punct:
            self._punct[token_id] = token_id not in self._special and is_punctuation(
                self.surface(token_id), self.continuation_prefix)
        return self._punct[token_id]

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, causal: bool) -> TokenFeatures:
        """Token features of a right-padded batch.

        Args:
            input_ids: [batch, T] token ids.
            attention_mask: [batch, T] 1 for real tokens, 0 for padding (a prefix of ones per row).

        Raises:
            ValueError: padding is not on the right (real tokens must be a prefix).
        """
        real = attention_mask.bool()
        if real.shape[1] > 1 and bool((real[:, 1:] & ~real[:, :-1]).any()):
            raise ValueError("attention statistics need right padding (real tokens first in each row)")
        ids = input_ids.tolist()
        punct = torch.tensor([[self.is_punct(t) for t in row] for row in ids], dtype=torch.bool) & real
        if self.sep_id is None:
            sep = torch.zeros_like(real)
        else:
            sep = (input_ids == self.sep_id) & real
        return TokenFeatures(real=real, sep=sep, punct=punct, has_sep=self.sep_id is not None, causal=causal)


#: Statistics whose per-row value is a weighted sum of the row's probabilities.
LINEAR: tuple[str, ...] = ("self", "prev", "next", "first", "sep", "punct", "distance", "long")
_INDEX = {name: i for i, name in enumerate(STATISTICS)}


@dataclass
class ContractionWeights:
    """Per-batch weights turning one layer's probabilities into statistic sums by contraction.

    Attributes:
        linear: [batch, T*T, len(LINEAR)]: weight of A[b, :, q, k] in each linear statistic's sum
            over valid rows (row validity folded in).
        entropy: [batch, T*T, 2]: weights of A ln A for ``entropy`` and ``norm_entropy``
            (the latter 1 / ln k_q on rows with k_q >= 2).
        real_rows: [batch, T] float, 1 on real query rows (for ``max_weight``).
        counts: [len(STATISTICS)] int64 valid rows per statistic.
    """

    linear: torch.Tensor
    entropy: torch.Tensor
    real_rows: torch.Tensor
    counts: torch.Tensor


def contraction_weights(feats: TokenFeatures, T: int) -> ContractionWeights:
    """Build (once per batch, cached on ``feats``) the weights used by :meth:`HeadStatistics.update`.

    With A = attention probabilities of one head on one sequence of T real tokens (row i = query,
    column j = key), the per-row values are (METRICS.md):

    - ``self`` A[i, i]; ``prev`` A[i, i-1] (i >= 1); ``next`` A[i, i+1] (i <= T-2, encoders only);
    - ``first`` A[i, 0]; ``sep`` sum of A[i, j] over sep positions j (only if the tokenizer has a
      sep token); ``punct`` sum of A[i, j] over punctuation positions j;
    - ``entropy`` -sum_j A[i, j] ln A[i, j] (nats, 0 ln 0 = 0); ``norm_entropy`` entropy / ln(k_i)
      with k_i = T (encoder) or i + 1 (causal), rows with k_i >= 2;
    - ``distance`` sum_j A[i, j] |i - j| (tokens); ``long`` sum of A[i, j] over |i - j| > 4,
      j not 0 and not a sep position; ``max_weight`` max_j A[i, j].

    Each of these except ``max_weight`` is a weighted sum of the row's A (or of -A ln A), so its sum
    over the valid rows of a batch is A contracted with one weight tensor, built here once for
    all layers of the batch.

    Args:
        feats: token features of the batch (real / sep / punctuation positions).
        T: padded sequence length of the batch.
    """
    cached = getattr(feats, "_weights", None)
    if cached is not None and cached.real_rows.shape[1] == T:
        return cached
    real = feats.real
    B = real.shape[0]
    pos = torch.arange(T)
    lengths = real.sum(1)
    realf = real.float()
    q, k = pos[:, None], pos[None, :]
    offset = (q - k).abs().float()  # [T, T]
    sep = feats.sep.float()
    far = ((q - k).abs() > LONG_RANGE)[None] & (pos != 0)[None, None, :] & ~feats.sep[:, None, :]
    next_rows = torch.zeros_like(real) if feats.causal else real & (pos[None, :] <= lengths[:, None] - 2)
    row = realf[:, :, None]  # [B, T(query), 1]
    chans = {
        "self": (q == k).float()[None] * row,
        "prev": (k == q - 1).float()[None] * row,
        "next": (k == q + 1).float()[None] * next_rows.float()[:, :, None],
        "first": (k == 0).float()[None] * row,
        "sep": sep[:, None, :] * (row if feats.has_sep else torch.zeros_like(row)),
        "punct": feats.punct.float()[:, None, :] * row,
        "distance": offset[None] * row,
        "long": far.float() * row,
    }
    linear = torch.stack([chans[n].expand(B, T, T) for n in LINEAR], -1).reshape(B, T * T, len(LINEAR))
    kq = (pos + 1)[None, :].expand(B, T).float() if feats.causal else lengths[:, None].expand(B, T).float()
    inv_log_k = torch.where(kq >= 2, 1.0 / torch.log(kq.clamp(min=2)), torch.zeros(())) * realf
    ent = torch.stack([realf[:, :, None].expand(B, T, T), inv_log_k[:, :, None].expand(B, T, T)], -1)
    counts = torch.zeros(len(STATISTICS), dtype=torch.int64)
    n_real = int(real.sum())
    for name in STATISTICS:
        counts[_INDEX[name]] = n_real
    counts[_INDEX["prev"]] = int((real & (pos >= 1)).sum())
    counts[_INDEX["next"]] = int(next_rows.sum())
    counts[_INDEX["sep"]] = n_real if feats.has_sep else 0
    counts[_INDEX["norm_entropy"]] = int((real & (kq >= 2)).sum())
    w = ContractionWeights(linear.contiguous(), ent.reshape(B, T * T, 2).contiguous(), realf, counts)
    feats._weights = w
    return w


class HeadStatistics:
    """Running sums and counts of every statistic for every (layer, head).

    ``sums`` is [layers, heads, statistics] float64 and ``counts`` [layers, statistics] int64 (every
    head of a layer sees the same rows). Corpus values (:meth:`means`) are sums / counts, the
    token-weighted mean over real query rows of METRICS.md. Instances merge with :meth:`merge`.
    """

    def __init__(self, n_layers: int, n_heads: int) -> None:
        self.n_layers, self.n_heads = n_layers, n_heads
        self.sums = torch.zeros(n_layers, n_heads, len(STATISTICS), dtype=torch.float64)
        self.counts = torch.zeros(n_layers, len(STATISTICS), dtype=torch.int64)

    def update(self, layer: int, attn: torch.Tensor, feats: TokenFeatures) -> None:
        """Add one batch of one layer: ``attn`` is [batch, heads, T, T] probabilities.

        Every statistic except ``max_weight`` is linear in A (or in A ln A), so its sum over valid
        rows is one contraction of A with a per-batch weight tensor built once for all layers
        (:func:`contraction_weights`).
        """
        w = contraction_weights(feats, attn.shape[-1])
        a = attn.float()
        B, H, T, _ = a.shape
        flat = a.reshape(B, H, T * T)
        linear = torch.bmm(flat, w.linear).sum(0)  # [heads, len(LINEAR)]
        # entr(x) = -x ln x with entr(0) = 0 (about twice as fast as xlogy on CPU)
        ent = torch.bmm(torch.special.entr(a).reshape(B, H, T * T), w.entropy).sum(0)  # [heads, 2]
        mx = (a.amax(-1) * w.real_rows[:, None, :]).sum((0, 2))  # [heads]
        sums = torch.empty(H, len(STATISTICS), dtype=torch.float64)
        for c, name in enumerate(LINEAR):
            sums[:, _INDEX[name]] = linear[:, c].double().cpu()
        sums[:, _INDEX["entropy"]] = ent[:, 0].double().cpu()
        sums[:, _INDEX["norm_entropy"]] = ent[:, 1].double().cpu()
        sums[:, _INDEX["max_weight"]] = mx.double().cpu()
        self.sums[layer] += sums
        self.counts[layer] += w.counts

    def merge(self, other: "HeadStatistics") -> "HeadStatistics":
        """Add another accumulator's sums and counts into this one (in place); returns self."""
        if (other.n_layers, other.n_heads) != (self.n_layers, self.n_heads):
            raise ValueError("cannot merge statistics of models with different layer/head counts")
        self.sums += other.sums
        self.counts += other.counts
        return self

    def means(self) -> np.ndarray:
        """[layers, heads, statistics] corpus values; NaN where a statistic had no defined row."""
        counts = self.counts[:, None, :].double()
        means = self.sums / counts.clamp(min=1)
        means[(counts == 0).expand_as(means)] = float("nan")
        return means.numpy()

    def to_frame(self) -> pd.DataFrame:
        """One row per head: columns ``layer``, ``head`` and one per statistic."""
        means = self.means()
        L, H, _ = means.shape
        frame = pd.DataFrame(means.reshape(L * H, -1), columns=list(STATISTICS))
        frame.insert(0, "head", np.tile(np.arange(H), L))
        frame.insert(0, "layer", np.repeat(np.arange(L), H))
        return frame
