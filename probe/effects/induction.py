"""The induction claim (Olsson et al. 2022, "In-context Learning and Induction Heads", Argument 3):
ablating the heads labelled ``induction`` raises the loss on repeated random tokens far more than
ablating as many random heads.

Input: the decoder-circuits sequences (:func:`probe.patterns.circuits.repeated_random_tokens`:
16 x r_1..r_n r_1..r_n, n = 25, seed 0, BOS first where the tokenizer adds one). Positions t count
from the first random token; l_t = -ln p(token at t | tokens before), nats.

- ``induction_loss``: mean of l_t over t = n+1 .. 2n-1 (the second half, where copying is possible;
  t = n cannot be copied: nothing before r_1 predicts it);
- ``random_loss`` (control): mean of l_t over t = 1 .. n-1 (the first half: nothing to copy).

The group S: the heads labelled ``induction`` (none: the 5 heads with the highest ``induction``
score, said so). Delta_S = induction_loss(S ablated) - induction_loss(clean); its random baseline
as in :mod:`probe.effects.groups` (k = |S| heads outside S, seeds 0 .. n-1; mean, std, t
interval). The claim holds when Delta_S > max(2 x random mean, random 95% high). Mean ablation
(the heads' means over the corpus's reference half) is the claim's; zero is given too.
"""

from __future__ import annotations

import pandas as pd
import torch
import torch.nn.functional as F

from ..capture.maps import forward
from ..causal.heads import table_heads
from ..causal.objectives import Objective
from ..errors import InputError
from ..patterns.circuits import BATCH, N_TOKENS, SEED, ids_batch, repeated_random_tokens
from ..sites import head_name
from ..text.inputs import Text
from .ablation import DEFAULT_KINDS
from .groups import SEEDS, random_sets, t_interval
from .measure import _mask, evaluate_sets

#: Heads taken when none is labelled ``induction``.
TOP_WHEN_NONE = 5


class PositionLoss(Objective):
    """Mean next-token loss of each sequence over the input positions ``first .. last`` (predicted
    tokens, inclusive): one unit per sequence, nats/token."""

    name, unit = "position_loss", "nats/token"

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last

    def losses(self, lm, batch) -> torch.Tensor:
        logits = forward(lm, batch).logits[:, self.first - 1:self.last].float()  # predicts first .. last
        target = batch.input_ids.to(logits.device)[:, self.first:self.last + 1]
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
        return nll.reshape(target.shape).mean(1)


def induction_group(heads: pd.DataFrame) -> tuple[list[tuple[int, int]], str]:
    """(S, how it was chosen): the ``induction``-labelled heads, else the top 5 by ``induction`` score.

    Raises:
        InputError: no head is labelled and the table has no ``induction`` column (not a decoder run).
    """
    if "labels" not in heads:
        raise InputError("the induction claim needs a heads table with a labels column (analyze(...).heads)")
    labelled = heads[heads["labels"].astype(str).str.split(";").apply(lambda ls: "induction" in ls)]
    if len(labelled):
        return [(int(r.layer), int(r.head)) for r in labelled.itertuples()], "labelled induction"
    if "induction" not in heads:
        raise InputError("the induction claim needs the decoder circuit probe's induction scores")
    top = heads.nlargest(TOP_WHEN_NONE, "induction")
    return [(int(r.layer), int(r.head)) for r in top.itertuples()], f"no head labelled induction: top {TOP_WHEN_NONE}"


def induction_claim(lm, heads: pd.DataFrame, means: torch.Tensor, *, n: int = N_TOKENS, seeds: int = SEEDS,
                    copies: int = 8) -> dict:
    """The induction claim of one decoder: clean and ablated induction loss, against random sets.

    Args:
        lm: a decoder with a language-model head.
        heads: its heads table (``labels``, ``induction``).
        means: [layers, 2, heads, d_head] from :func:`probe.effects.ablation.head_means` (corpus reference half).
        n: random tokens per half.
        seeds: random sets (>= 5).
        copies: sets per forward pass.

    Returns:
        ``{"group", "chosen", "n", "clean": {"induction_loss", "random_loss"}, "zero": {...}, "mean": {...}}``,
        each kind ``{"ablated", "delta", "random_mean", "random_std", "random_low", "random_high",
        "supported"}`` (losses in nats/token).

    Raises:
        InputError: a heads table naming a head outside the model, or without labels or scores.
    """
    g = lm.geometry
    table_heads(heads, g.n_layers, g.n_heads)
    group, chosen = induction_group(heads)
    ids, offset = repeated_random_tokens(lm.tokenizer, n, BATCH, SEED)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    texts = [Text(f"repeated random tokens {i}") for i in range(BATCH)]
    held = [ids_batch(ids.tolist(), pad, texts, bool(offset))]
    sets = [[], group] + random_sets(group, g.n_layers, g.n_heads, seeds)
    masks = torch.stack([_mask(lm, s) for s in sets])
    second, first_half = PositionLoss(offset + n + 1, offset + 2 * n - 1), PositionLoss(offset + 1, offset + n - 1)
    out = {"group": [head_name(a, b) for a, b in group], "chosen": chosen, "n": n, "seeds": seeds,
           "clean": {"random_loss": float(evaluate_sets(lm, first_half, "zero", None, held, masks[:1], 1).mean())}}
    for kind in DEFAULT_KINDS:
        losses = evaluate_sets(lm, second, kind, means, held, masks, copies).mean(1)  # [sets] nats/token
        out["clean"]["induction_loss"] = float(losses[0])
        delta = losses[1:] - losses[0]
        mean, std, low, high = t_interval(delta[1:])
        out[kind] = {"ablated": float(losses[1]), "delta": float(delta[0]), "random_mean": mean, "random_std": std,
                     "random_low": low, "random_high": high,
                     "supported": bool(delta[0] > max(2 * mean, high))}
    return out


def claim_lines(claim: dict) -> list[str]:
    """Plain-text summary lines of :func:`induction_claim`."""
    c = claim["clean"]
    lines = [f"induction claim on {len(claim['group'])} heads ({claim['chosen']}): induction_loss clean "
             f"{c['induction_loss']:.3f} nats/token (random_loss control {c['random_loss']:.3f})"]
    for kind in DEFAULT_KINDS:
        k = claim[kind]
        lines.append(f"  {kind} ablation: {k['ablated']:.3f} ({k['delta']:+.3f}); {claim['seeds']} random sets "
                     f"{k['random_mean']:+.3f} +- {k['random_std']:.3f} (95% high {k['random_high']:.3f}): "
                     + ("supported" if k["supported"] else "not supported"))
    icl = claim.get("icl")
    if icl:
        c = icl["clean"]
        lines.append(f"icl_score over {icl['windows']} windows: clean {c['icl_score']:+.3f} nats "
                     f"[{c['low']:+.3f}, {c['high']:+.3f}]")
        for kind in DEFAULT_KINDS:
            k = icl[kind]
            lines.append(f"  {kind} ablation: {k['ablated']:+.3f} ({k['delta']:+.3f}); random sets "
                         f"{k['random_mean']:+.3f} +- {k['random_std']:.3f} (95% high {k['random_high']:.3f}): "
                         + ("in-context learning lost" if k["lost"] else "not lost"))
    return lines

