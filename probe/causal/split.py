"""The corpus split every causal measurement shares: a scoring (or reference) part and a held-out part.

Pruning scores heads on one part and measures its curves on the other; ablation takes its means and
reference texts from one part and measures on the other. The same split (a fixed seed) means the two
commands measure on the same held-out texts.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..util import plural

#: Fewest sequences in each part of the split.
MIN_PART = 2


def split_corpus(n: int, held_out: float = 0.5, seed: int = 0) -> tuple[list[int], list[int]]:
    """Indices of the scoring part and of the held-out part of ``n`` texts (disjoint, sorted).

    A permutation with ``numpy.random.default_rng(seed)``; the held-out part has
    round(n * held_out) texts.

    Raises:
        InputError: either part would have fewer than :data:`MIN_PART` texts.
    """
    n_out = round(n * held_out)
    if n_out < MIN_PART or n - n_out < MIN_PART:
        raise InputError(f"corpus too small to split: {plural(n, 'sequence')}; it needs at least {2 * MIN_PART} "
                         f"({MIN_PART} to score or take means on and {MIN_PART} held out to measure on)")
    perm = np.random.default_rng(seed).permutation(n)
    return sorted(perm[n_out:].tolist()), sorted(perm[:n_out].tolist())
