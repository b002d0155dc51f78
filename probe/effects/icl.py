"""The in-context learning score (Olsson et al. 2022, "In-context learning" key concept): how much
better a decoder predicts token 500 of a text than token 50, and whether ablating the induction
heads takes that away.

l_k = -ln p(x_k | x_<k), k 1-based over the model input (a BOS token the tokenizer adds counts),
nats. ``icl_score`` = the mean over windows of l_500 - l_50 (< 0: the model learns in context).
Windows: the corpus texts in order, joined by the EOS token (by a blank line where there is none),
cut into consecutive windows of 512 input positions (BOS first where the tokenizer adds one); a last
window shorter than 500 is dropped; at least 50 windows. The clean score's interval: the 95%
percentile bootstrap over windows (1,000 resamples, seed 0). Under ablation (S = the induction
group, against random sets as for the induction loss) the score rising toward 0 means in-context
learning was lost.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..capture.maps import forward
from ..causal.objectives import Objective
from ..errors import InputError
from ..patterns.circuits import adds_bos, ids_batch
from ..text.inputs import Text
from .ablation import DEFAULT_KINDS
from .groups import SEEDS, paired_bootstrap, random_sets, t_interval
from .measure import _mask, evaluate_sets

#: Window length (input positions), the late and early token (1-based), the fewest windows.
WINDOW, LATE, EARLY, MIN_WINDOWS = 512, 500, 50, 50


class LossGap(Objective):
    """Per sequence l_late - l_early (1-based input positions): one unit per window, nats."""

    name, unit = "icl_score", "nats"

    def __init__(self, late: int = LATE, early: int = EARLY) -> None:
        self.late, self.early = late, early

    def losses(self, lm, batch) -> torch.Tensor:
        logits = forward(lm, batch).logits.float()
        ids = batch.input_ids.to(logits.device)

        def loss(k: int) -> torch.Tensor:  # token k (1-based) is index k - 1, predicted at k - 2
            return F.cross_entropy(logits[:, k - 2], ids[:, k - 1], reduction="none")

        return loss(self.late) - loss(self.early)


def windows(tokenizer, texts: Sequence[str | Text], length: int = WINDOW, late: int = LATE) -> list[list[int]]:
    """The corpus as consecutive token windows (see the module docstring)."""
    strings = [t.text if isinstance(t, Text) else str(t) for t in texts]
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        stream = tokenizer("\n\n".join(strings), add_special_tokens=False)["input_ids"]
    else:
        stream = []
        for s in strings:
            stream += tokenizer(s, add_special_tokens=False)["input_ids"] + [eos]
    lead = [tokenizer.bos_token_id] if adds_bos(tokenizer) else []
    step = length - len(lead)
    out = [lead + stream[i:i + step] for i in range(0, len(stream), step)]
    return [w for w in out if len(w) >= late]


def icl_claim(lm, texts: Sequence[str | Text], group: list[tuple[int, int]], means: torch.Tensor, *,
              seeds: int = SEEDS, copies: int = 4, batch_size: int = 8, length: int = WINDOW, late: int = LATE,
              early: int = EARLY, min_windows: int = MIN_WINDOWS, max_windows: int | None = None) -> dict:
    """``icl_score`` of a decoder clean, with ``group`` ablated, and with random sets.

    Args:
        lm: a decoder with a language-model head and at least 512 positions.
        texts: running text (at least 50 windows of 512 tokens: about 25,000 tokens).
        group: the heads to ablate (the induction group).
        means: from :func:`~probe.effects.ablation.head_means`.
        seeds: random sets (>= 5).
        copies: sets per pass.
        batch_size: windows per batch.
        length: window length (default 512, the definition's).
        late: the late token, 1-based (default 500).
        early: the early token, 1-based (default 50).
        min_windows: the fewest windows accepted (the definition's 50; fewer only for a measurement
            whose cost forces it, said with its result).
        max_windows: use only the first this many windows (None: all).

    Returns:
        ``{"windows", "clean": {"icl_score", "low", "high"}, "zero": {...}, "mean": {...}}``, each kind
        ``{"ablated", "delta", "random_mean", "random_std", "random_low", "random_high", "lost"}`` (nats);
        ``lost``: delta > max(2 x random mean, random 95% high).

    Raises:
        InputError: the model takes fewer than ``length`` positions, or the corpus gives fewer than
            ``min_windows`` windows.
    """
    if lm.max_length < length:
        raise InputError(f"icl_score needs windows of {length} tokens; {lm.name} takes {lm.max_length}")
    rows = windows(lm.tokenizer, texts, length, late)[:max_windows]
    if len(rows) < min_windows:
        raise InputError(f"icl_score needs at least {min_windows} windows of {length} tokens (about "
                         f"{min_windows * length:,} tokens of text); the corpus gives {len(rows)}")
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    chunks = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
    held = [ids_batch(c, pad, [Text(f"window {i}") for i in range(len(c))], adds_bos(lm.tokenizer)) for c in chunks]
    g = lm.geometry
    masks = torch.stack([_mask(lm, s) for s in [[], group] + random_sets(group, g.n_layers, g.n_heads, seeds)])
    out = {"windows": len(rows), "seeds": seeds}
    for kind in DEFAULT_KINDS:
        values = evaluate_sets(lm, LossGap(late, early), kind, means, held, masks, copies)  # [sets, windows]
        clean, low, high = paired_bootstrap(values[:1], np.ones(values.shape[1]))
        out["clean"] = {"icl_score": float(clean[0]), "low": float(low[0]), "high": float(high[0])}
        scores = values.mean(1)
        delta = scores[1:] - scores[0]
        mean, std, r_low, r_high = t_interval(delta[1:])
        out[kind] = {"ablated": float(scores[1]), "delta": float(delta[0]), "random_mean": mean, "random_std": std,
                     "random_low": r_low, "random_high": r_high, "lost": bool(delta[0] > max(2 * mean, r_high))}
    return out
