"""The objective of an encoder-decoder model's ablation effects, and the choice of objective.

``seq2seq``: the model's next-token cross-entropy on its targets, nats per target token: the decoder
reads the start token and the target (teacher forcing), and position i predicts target token i + 1,
at every real decoder position but the last (the same count of predicted tokens as ``clm`` on the
target alone). One-stack models use ``probe prune``'s objectives (:mod:`probe.causal.objectives`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..capture.maps import forward
from ..causal.objectives import Objective, default_objective, make_objective
from ..errors import InputError

#: The objectives an ablation measures: ``probe prune``'s, and ``seq2seq`` for encoder-decoder models.
EFFECT_OBJECTIVES = ("clm", "mlm", "fidelity", "seq2seq")


class Seq2SeqLM(Objective):
    """Teacher-forced target loss of an encoder-decoder model with a language-model head."""

    name, unit = "seq2seq", "nats/target token"

    def setup(self, lm, batches) -> None:
        if lm.kind != "encoder-decoder" or lm.model.get_output_embeddings() is None:
            raise InputError(f"objective 'seq2seq' needs an encoder-decoder model with a language-model head; "
                             f"{lm.name} is {type(lm.model).__name__}")
        if any(b.target is None for b in batches):
            raise InputError("objective 'seq2seq' needs a target for every source (Text(source, target=...))")

    def losses(self, lm, batch) -> torch.Tensor:
        logits = forward(lm, batch).logits  # [batch, T_target, vocab]
        ids = batch.target.input_ids.to(logits.device)
        keep = batch.target.real.to(logits.device)[:, 1:]
        wide = logits[:, :-1][keep]
        return F.cross_entropy(wide.float() if wide.dtype in (torch.float16, torch.bfloat16) else wide,
                               ids[:, 1:][keep], reduction="none")


def choose_objective(lm, name: str | None, seed: int = 0) -> tuple[Objective, str, str]:
    """(objective, its name, why) for an ablation of ``lm``: ``name`` when given, else ``seq2seq``
    for an encoder-decoder model and ``probe prune``'s default for the others.

    Raises:
        InputError: an unknown name.
    """
    if name is None and lm.kind == "encoder-decoder":
        return Seq2SeqLM(), "seq2seq", "an encoder-decoder model: the loss on its targets (teacher forcing)"
    if name == "seq2seq":
        return Seq2SeqLM(), "seq2seq", "given"
    if name is not None and name not in EFFECT_OBJECTIVES:
        raise InputError(f"unknown objective {name!r}; choose from {', '.join(EFFECT_OBJECTIVES)}")
    name, reason = (name, "given") if name else default_objective(lm)
    return make_objective(name, seed=seed), name, reason
