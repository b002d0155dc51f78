"""A :class:`probe.qk.Why` as tables: the largest source pairs of the top keys (``why.csv``), and each
source's share on the query side and on the key side."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .pattern import pair_effects
from .score import Why

#: The row that holds every pair not listed, so that a key's rows add up to its score.
REST = "(other pairs)"
#: The row of a position bias (no source pair).
POSITION_BIAS = "(position bias)"


def top_pairs(w: Why, key: int, n: int) -> list[tuple[int, int]]:
    """The ``n`` source pairs (query source, key source) with the largest |C_ij[a, b]| at ``key``."""
    M = np.abs(w.matrix(key))
    order = np.argsort(-M, axis=None, kind="stable")[:n]
    return [tuple(int(x) for x in np.unravel_index(k, M.shape)) for k in order]


def pairs_frame(w: Why, keys: int = 5, pairs: int = 10) -> pd.DataFrame:
    """The ``pairs`` largest source pairs of each of the ``keys`` most attended keys, then one row of the
    other pairs (and one of the position bias, if any), so that each key's ``contribution`` adds up to
    its score s_ij (+ the position bias).

    Returns:
        Columns ``head``, ``query``, ``key``, ``key_token``, ``attention`` (A_ij), ``score`` (s_ij),
        ``query_source``, ``key_source``, ``contribution`` (C_ij[a, b], score units), ``share``
        (C / s, signed), ``abs_share`` (|C| / sum |C| over the key's pairs), and the pattern effects of
        removing the pair (:func:`probe.qk.pattern.pair_effects`: ``dA_first``, ``dA_exact``,
        ``dA_without_query_source``, ``dA_without_key_source``; empty on the rest rows).
    """
    rows = []
    for key in w.top_keys(keys):
        M, s = w.matrix(key), float(w.scores[key])
        chosen = top_pairs(w, key, pairs)
        effects = pair_effects(w, key, chosen)
        total_abs = float(np.abs(M).sum())
        common = {"head": w.name, "query": w.query, "key": key, "key_token": w.tokens[key],
                  "attention": float(w.pattern[key]), "score": s}
        listed = 0.0
        for n, (a, b) in enumerate(chosen):
            c = float(M[a, b])
            listed += c
            rows.append({**common, "query_source": w.sources[a], "key_source": w.sources[b], "contribution": c,
                         "share": c / s if s else np.nan, "abs_share": abs(c) / total_abs if total_abs else np.nan,
                         **{name: float(v[n]) for name, v in effects.items()}})
        rest = float(M.sum()) - listed
        rows.append({**common, "query_source": REST, "key_source": REST, "contribution": rest,
                     "share": rest / s if s else np.nan, "abs_share": np.nan})
        if w.position_bias is not None:
            rows.append({**common, "query_source": POSITION_BIAS, "key_source": POSITION_BIAS,
                         "contribution": float(w.position_bias[key]), "share": np.nan, "abs_share": np.nan})
    return pd.DataFrame(rows)


def source_shares(w: Why, key: int) -> pd.DataFrame:
    """Per source: ``query_side`` sum_b C_ij[a, b] and ``key_side`` sum_a C_ij[a, b] at ``key`` (each adds
    up to s_ij over the sources), largest |query_side| + |key_side| first."""
    M = w.matrix(key)
    frame = pd.DataFrame({"source": w.sources, "query_side": M.sum(1), "key_side": M.sum(0)})
    order = np.argsort(-(frame["query_side"].abs() + frame["key_side"].abs()).to_numpy(), kind="stable")
    return frame.iloc[order].reset_index(drop=True)
