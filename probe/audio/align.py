"""Each output token's time in the audio from cross-attention, as Whisper's word timing does.

The decoder's query row i predicts token i + 1, so the rows from the last prompt token to the last
text token (n + 1 rows for n text tokens) are the ones that place the text tokens: row j is read as
where the decoder listens while it writes text token j (the last row: while it ends the text).
Given those rows of the alignment heads, [heads, n + 1, frames], restricted to the frames that
hold the clip:

1. each frame's column is standardised over the rows (minus its mean, over its standard deviation),
   head by head;
2. a median filter of width 7 frames smooths each row;
3. the heads are averaged into one matrix M [n + 1, frames];
4. dynamic time warping finds the monotone path through (row, frame) cells from (0, 0) to
   (n, frames - 1) of least total cost -M (steps: diagonal, down one row, right one frame);
5. row j starts at the first frame the path reaches it: text token j lasts from the start of row
   j to the start of row j + 1, in seconds at ``frame_s`` seconds per frame.

Source: Radford et al. 2022 (Whisper), the ``find_alignment`` function of its timing code; written
here anew with NumPy and SciPy.

Monotone heads, for checkpoints without ``alignment_heads``: a head's monotonicity on a clip is
the Spearman rank correlation between the row number j and the frame of row j's largest weight
(within the clip); 1 is a head whose attention walks forward through the audio token by token.
"""

from __future__ import annotations

import numpy as np

#: Width in frames of the median filter (Whisper's ``medfilt_width``).
MEDIAN_WIDTH = 7
#: Heads chosen as monotone: every head within this much Spearman correlation of the best ...
MONOTONE_SPREAD = 0.1
#: ... at most this many.
MONOTONE_MOST = 8


def median_filter(x: np.ndarray, width: int = MEDIAN_WIDTH) -> np.ndarray:
    """``x`` [..., frames] median-filtered along its last axis over ``width`` frames (odd), the
    edges mirrored without repeating the edge frame (as torch's ``reflect`` padding); a row shorter
    than ``width`` frames is returned unchanged."""
    if x.shape[-1] < width:
        return x.copy()
    from scipy.ndimage import median_filter as _median  # deferred: importing probe's audio stays light (no scipy)

    return _median(x, size=(1,) * (x.ndim - 1) + (width,), mode="mirror")


def standardised(weights: np.ndarray) -> np.ndarray:
    """[heads, rows, frames]: each frame's column minus its mean over rows, over its standard
    deviation (population); a constant column becomes 0."""
    mean = weights.mean(-2, keepdims=True)
    std = weights.std(-2, keepdims=True)
    return np.where(std > 0, (weights - mean) / np.where(std > 0, std, 1.0), 0.0)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-cost monotone path through ``cost`` [rows, frames] from (0, 0) to the last cell.

    Steps are (1, 1), (1, 0) and (0, 1); ties prefer the step right along the frames, then the
    diagonal is taken only when strictly cheapest (Whisper's rule).

    Returns:
        (row indices, frame indices) of the path's cells, in order (equal lengths).
    """
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    trace = np.zeros((n + 1, m + 1), dtype=np.int8)
    acc[0, 0] = 0.0
    trace[0, :], trace[:, 0] = 2, 1
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            acc[i, j] = cost[i - 1, j - 1] + c
            trace[i, j] = t
    i, j, path = n, m, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    path = np.array(path[::-1])
    keep = (path[:, 0] >= 0) & (path[:, 1] >= 0)
    return path[keep, 0], path[keep, 1]


def alignment_matrix(weights: np.ndarray, width: int = MEDIAN_WIDTH) -> np.ndarray:
    """[rows, frames]: ``weights`` [heads, rows, frames] standardised per frame, median-filtered
    along frames and averaged over heads (steps 1-3 of the module's method)."""
    return median_filter(standardised(np.asarray(weights, dtype=np.float64)), width).mean(0)


def token_times(weights: np.ndarray, frame_s: float, width: int = MEDIAN_WIDTH) -> tuple[np.ndarray, np.ndarray]:
    """Start and end times in seconds of n text tokens from the alignment heads' rows.

    Args:
        weights: [heads, n + 1, frames] cross-attention probabilities of the rows that place the
            text tokens (see the module), over the frames that hold the clip.
        frame_s: seconds per encoder frame.
        width: the median filter's width in frames.

    Returns:
        (starts, ends): [n] float64 seconds each; ``ends[j] == starts[j + 1]``.

    Raises:
        ValueError: fewer than two rows (no text token) or no frame.
    """
    if weights.shape[-2] < 2 or weights.shape[-1] < 1:
        raise ValueError("alignment needs at least one text token and one frame")
    rows, frames = dtw(-alignment_matrix(weights, width))
    first = np.searchsorted(rows, np.arange(weights.shape[-2]))  # the path's first cell of each row
    times = frames[first] * frame_s
    return times[:-1], times[1:]


def monotonicity(rows: np.ndarray) -> float:
    """Spearman correlation between row number and the frame of each row's largest weight, for one
    head's rows [rows, frames]; NaN with fewer than three rows or a constant argmax."""
    if rows.shape[0] < 3:
        return float("nan")
    peaks = np.asarray(rows).argmax(-1)
    if np.all(peaks == peaks[0]):
        return float("nan")
    from scipy.stats import spearmanr  # deferred: scipy.stats takes ~0.5 s to import

    return float(spearmanr(np.arange(len(peaks)), peaks).statistic)


def monotone_heads(scores: dict[tuple[int, int], float], spread: float = MONOTONE_SPREAD,
                   most: int = MONOTONE_MOST) -> list[tuple[int, int]]:
    """The (layer, head) pairs whose monotonicity is within ``spread`` of the best (at most
    ``most``, best first; NaN scores left out); the single best when every score is NaN-free but
    low. Empty when no head has a score."""
    scored = sorted(((v, k) for k, v in scores.items() if v == v), key=lambda x: (-x[0], x[1]))
    if not scored:
        return []
    best = scored[0][0]
    return [k for v, k in scored if v >= best - spread][:most]
