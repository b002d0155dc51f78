"""Why a head attends where its label says, over a corpus: the contributions C_ij[a, b] averaged over
every query row whose most attended key fits the head's label.

The rows kept, per label (token ids ``x``; the row i, its most attended kept key j):

- ``previous-token``: j = i - 1; ``next-token``: j = i + 1; ``self``: j = i; ``first-token``: j = 0;
- ``induction``: j is the token after an earlier copy of the current one, x_(j-1) = x_i with j - 1 < i;
- ``duplicate-token``: an earlier copy itself, x_j = x_i with j < i;
- ``sep``: j holds the tokenizer's separator token.

For the kept rows the mean of C_ij[a, b] over rows is a [sources, sources] matrix whose sum is the
mean score s_ij; each source's share on the key side is sum_a mean C[a, b] / mean s (and on the query
side likewise), so "L5H1 is an induction head because its key side reads L4H7 (previous-token)"
becomes a measured sentence with the share of the score it explains. Composition scores are the
weight-only counterpart: the same bilinear form averaged over every input, not over these rows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..capture.maps import encode
from ..errors import InputError
from ..sites import head_name
from .score import TOLERANCE, check_model, sides
from .stream import record_rows

#: Texts run in one pass (right-padded): the model's weights are read once per batch instead of per text.
BATCH = 16

#: The labels whose rows can be told by their most attended key.
RULES = ("previous-token", "next-token", "self", "first-token", "induction", "duplicate-token", "sep")


def fits(label: str, ids: torch.Tensor, i: int, j: int, sep_id: int | None = None) -> bool:
    """Whether key ``j`` is where a head labelled ``label`` attends from row ``i`` (module docstring).

    Raises:
        InputError: a label outside :data:`RULES`.
    """
    if label == "previous-token":
        return j == i - 1
    if label == "next-token":
        return j == i + 1
    if label == "self":
        return j == i
    if label == "first-token":
        return j == 0
    if label == "induction":
        return 1 <= j <= i and int(ids[j - 1]) == int(ids[i])
    if label == "duplicate-token":
        return j < i and int(ids[j]) == int(ids[i])
    if label == "sep":
        return sep_id is not None and int(ids[j]) == sep_id
    raise InputError(f"no row rule for the label {label!r}; labels with one: {', '.join(RULES)}")


@dataclass
class CorpusWhy:
    """A head's contributions averaged over the rows that fit its label.

    Attributes:
        layer, head, label: the head and the label whose rows were kept.
        sources: the source names.
        mean: [sources (query side), sources (key side)] the mean of C_ij[a, b] over the kept rows
            (score units); mean_score: the mean of s_ij over them (mean.sum() equals it).
        rows: rows kept; rows_seen: rows looked at (every row of every text); texts: texts read.
        residual: the largest |sum_ab C_ij[a, b] - s_ij| over the kept rows; tolerance its bound.
        seconds: wall time.
    """

    layer: int
    head: int
    label: str
    sources: list[str]
    mean: np.ndarray
    mean_score: float
    rows: int
    rows_seen: int
    texts: int
    residual: float
    tolerance: float
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return head_name(self.layer, self.head)

    def shares(self) -> pd.DataFrame:
        """Per source: ``query_side`` and ``key_side`` (its part of the mean score, sums over the other
        side) and their shares of the mean score, largest |key side| first."""
        s = self.mean_score
        frame = pd.DataFrame({"source": self.sources, "query_side": self.mean.sum(1), "key_side": self.mean.sum(0)})
        frame["query_share"] = frame["query_side"] / s if s else np.nan
        frame["key_share"] = frame["key_side"] / s if s else np.nan
        return frame.iloc[np.argsort(-frame["key_side"].abs().to_numpy(), kind="stable")].reset_index(drop=True)

    def sentence(self, labels: dict | None = None, n: int = 2) -> str:
        """The finding in words: the largest key-side and query-side sources with their shares."""
        labels = labels or {}
        f = self.shares()

        def named(r) -> str:
            return f"{r.source} ({labels[r.source]})" if labels.get(r.source) else r.source

        keys = ", ".join(f"{named(r)} {r.key_share:.2f}" for r in f.head(n).itertuples())
        q = f.iloc[np.argsort(-f["query_side"].abs().to_numpy(), kind="stable")].head(n)
        queries = ", ".join(f"{named(r)} {r.query_share:.2f}" for r in q.itertuples())
        return (f"{self.name} ({self.label}) over {self.rows} rows whose top key fits the label (of {self.rows_seen}, "
                f"{self.texts} texts; mean score {self.mean_score:.3g}): its key side reads {keys} of the score, its "
                f"query side {queries}")


@torch.no_grad()
def why_corpus(lm, texts: Sequence[str], head, label: str, *, max_length: int | None = None) -> CorpusWhy:
    """Average head ``head``'s contributions over every row of ``texts`` whose most attended key fits
    ``label`` (one pass per :data:`BATCH` texts, each text's rows read from its row of the batch; see
    the module docstring).

    Args:
        lm: as :func:`probe.why`; texts: the corpus; head: ``(layer, head)`` or ``"L5H1"``;
        label: one of :data:`RULES`; max_length: token limit per text.

    Returns:
        A :class:`CorpusWhy` (``rows`` 0 where no row fits: ``mean`` all NaN).

    Raises:
        InputError: no texts, a bad head or label.
        UnsupportedAnalysisError: as :func:`probe.why`.
    """
    started = time.perf_counter()
    layer, h = check_model(lm, head)
    if label not in RULES:
        raise InputError(f"no row rule for the label {label!r}; labels with one: {', '.join(RULES)}")
    if not texts:
        raise InputError("no text given")
    sep_id = getattr(lm.tokenizer, "sep_token_id", None)
    total, score_sum, rows, seen, residual, top_score, names = None, 0.0, 0, 0, 0.0, 0.0, None
    texts = list(texts)
    recorded = (rec for k in range(0, len(texts), BATCH)
                for rec in record_rows(lm, encode(lm, texts[k:k + BATCH], max_length), layer))
    for rec in recorded:
        sd = sides(lm, None, layer, h, None, True, rec=rec)
        if names is None:
            names = sd.names
        T, probs = sd.T, sd.call.probs[0, h, :sd.T, :sd.T].double().cpu()
        top = probs.argmax(-1)
        chosen = [i for i in range(T) if fits(label, sd.ids, i, int(top[i]), sep_id)]
        seen += T
        if not chosen:
            continue
        idx, keys = torch.tensor(chosen), top[chosen]
        C = sd.scale * torch.einsum("aie,bie->iab", sd.q[:, idx], sd.k[:, keys])  # [rows, S, S]
        s = sd.scale * (sd.call.query[0, h, idx].double().cpu()
                        * sd.call.key[0, h // (lm.geometry.n_heads // lm.geometry.n_kv_heads), keys].double().cpu()
                        ).sum(-1)
        residual = max(residual, float((C.sum((1, 2)) - s).abs().max()))
        top_score = max(top_score, float(s.abs().max()))
        total = C.sum(0) if total is None else total + C.sum(0)
        score_sum += float(s.sum())
        rows += len(chosen)
    S = len(names)
    mean = (total / rows).numpy() if rows else np.full((S, S), np.nan)
    notes = [] if rows else [f"no row of the {len(texts)} texts has its top key where a {label} head looks"]
    return CorpusWhy(layer, h, label, names, mean, score_sum / rows if rows else float("nan"), rows, seen, len(texts),
                     residual, TOLERANCE * (1 + top_score), time.perf_counter() - started, notes)
