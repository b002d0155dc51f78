"""What removing one source pair does to the attention pattern, to first order and exactly.

The scores of a row are s_ij (the pre-cap score, :class:`probe.qk.Why`); the pattern is
A_ij = softmax_j(f(s_ij) + bias_ij) over the kept keys, f(s) = cap tanh(s / cap) with soft-capping
(Gemma 2), else f(s) = s. Removing the pair (a, b) changes every key's score by dS_ij = -C_ij[a, b].
To first order (the softmax's Jacobian, dA_ij / dz_ik = A_ij (delta_jk - A_ik)),

    dA_ij = A_ij (dz_ij - sum_k A_ik dz_ik),   dz_ij = f'(s_ij) dS_ij,  f'(s) = 1 - tanh^2(s / cap),

and exactly, the row's softmax recomputed from s - C[a, b]. Beside them, the exact effect of removing
writer a from the query (all its pairs: s - sum_b C[a, b]) and writer b from the key
(s - sum_a C[a, b]), norms frozen as in the decomposition. Where the first-order and the exact
changes agree the linear reading of the pattern holds; where they differ the softmax saturates.
"""

from __future__ import annotations

import numpy as np

from .score import Why


def _logits(w: Why, s: np.ndarray) -> np.ndarray:
    """f(s) + bias at the kept keys, -inf elsewhere; s [..., keys]."""
    z = w.softcap * np.tanh(s / w.softcap) if w.softcap else s
    if w.position_bias is not None:
        z = z + w.position_bias
    return np.where(w.keep, z, -np.inf)


def softmax_row(w: Why, s: np.ndarray) -> np.ndarray:
    """The row's pattern [..., keys] for scores ``s`` [..., keys] (the model's own masking, cap and bias)."""
    z = _logits(w, s)
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def first_order(w: Why, dS: np.ndarray) -> np.ndarray:
    """dA [..., keys] = A (dz - sum_k A_k dz_k) for a change ``dS`` [..., keys] of the pre-cap scores."""
    A = softmax_row(w, w.scores)
    dz = dS * (1.0 - np.tanh(w.scores / w.softcap) ** 2) if w.softcap else dS
    dz = np.where(w.keep, dz, 0.0)
    return A * (dz - (A * dz).sum(-1, keepdims=True))


def pair_effects(w: Why, key: int, pairs: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    """For each source pair (a, b) (indices into ``w.sources``), the change of A_i,key when it is removed.

    Args:
        w: a :class:`~probe.qk.Why`.
        key: the key position j.
        pairs: (query source, key source) indices.

    Returns:
        ``dA_first`` (first order), ``dA_exact`` (the pair removed, softmax recomputed),
        ``dA_without_query_source`` (writer a removed from the query), ``dA_without_key_source``
        (writer b removed from the key): each [pairs], probabilities.
    """
    C = w.contributions
    base = softmax_row(w, w.scores)[key]
    a = np.array([p[0] for p in pairs], dtype=int)
    b = np.array([p[1] for p in pairs], dtype=int)
    if not len(pairs):
        empty = np.zeros(0)
        return {"dA_first": empty, "dA_exact": empty, "dA_without_query_source": empty, "dA_without_key_source": empty}
    pair = C[a, b]  # [pairs, keys]
    return {"dA_first": first_order(w, -pair)[:, key],
            "dA_exact": softmax_row(w, w.scores - pair)[:, key] - base,
            "dA_without_query_source": softmax_row(w, w.scores - C[a].sum(1))[:, key] - base,
            "dA_without_key_source": softmax_row(w, w.scores - C[:, b].sum(0))[:, key] - base}
