"""Objectives: the quantity pruning tries not to hurt, per unit (token or sequence), lower = better.

- ``clm``: next-token cross-entropy (nats per predicted token), decoders with a language-model head.
- ``mlm``: masked-token cross-entropy (nats per masked token), encoders with a masked-LM head:
  15% of each sequence's real, non-special tokens (at least one) are replaced by the mask token,
  chosen with a fixed seed per sequence (``numpy.random.default_rng([seed, corpus index])``), so
  every evaluation sees the same masks. All chosen tokens become the mask token (BERT's 80/10/10
  replacement is a training device; Devlin et al. 2019, sec. 3.1).
- ``fidelity``: 1 - cosine similarity between the model's sentence embedding and the original's,
  per sequence; the embedding is the mean of the last hidden states over the real tokens (special
  tokens included), the pooling sentence-transformers uses (Reimers & Gurevych 2019, sec. 3).
  For encoders without a task head, such as all-MiniLM-L6-v2. 0 for the unpruned model.
- ``classification``: cross-entropy (nats per sequence) of a sequence-classification checkpoint
  against given labels.

Which objective a model gets by default (:func:`default_objective`): decoders ``clm``; an encoder
with labels ``classification``; an encoder whose checkpoint has a masked-LM head ``mlm``; other
encoders ``fidelity``. Each objective returns per-unit losses for one batch (differentiable with
respect to head gates); means are unit-weighted over the whole held-out part.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..architectures import base_model
from ..capture.hooks import measuring
from ..capture.maps import forward
from ..errors import InputError, ProbeError

#: Objective means within this of 0 are 0. Every objective is >= 0 by definition (a
#: cross-entropy, or 1 - cosine similarity), and float32 sums round an exact 0 (the unpruned
#: model's fidelity to itself) to a few 1e-8 on either side: such a value is reported as 0.
ZERO_WITHIN = 16 * torch.finfo(torch.float32).eps


OBJECTIVES = ("clm", "mlm", "fidelity", "classification")

#: Share of a sequence's real, non-special tokens masked by ``mlm``.
MLM_RATE = 0.15


def _wide(t: torch.Tensor) -> torch.Tensor:
    """float32 for half-precision tensors (losses are summed over many units); others as they are."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def head_kind(lm) -> str | None:
    """The task head of a loaded model: ``"causal-lm"``, ``"masked-lm"``, ``"classification"`` or None."""
    name = type(lm.model).__name__
    for suffix, kind in (("ForCausalLM", "causal-lm"), ("LMHeadModel", "causal-lm"), ("ForMaskedLM", "masked-lm"),
                         ("ForSequenceClassification", "classification")):
        if name.endswith(suffix):
            return kind
    return None


def default_objective(lm, has_labels: bool = False) -> tuple[str, str]:
    """(objective, why) for a model: see the module docstring."""
    kind = head_kind(lm)
    if kind == "classification" or (has_labels and lm.kind != "decoder"):
        return "classification", "a sequence-classification model with labels: cross-entropy against the labels"
    if lm.kind == "decoder":
        return "clm", "a decoder with a language-model head: next-token loss"
    if kind == "masked-lm":
        return "mlm", "an encoder whose checkpoint has a masked-LM head: masked-token loss"
    return "fidelity", ("an encoder without a task head: 1 - cosine similarity to the original model's "
                        "mean-pooled sentence embedding")


class Objective:
    """Base class. ``setup`` computes per-batch constants once, ``losses`` the per-unit losses.

    Attributes:
        name: one of :data:`OBJECTIVES`.
        unit: what one loss value is per (``"nats/token"``, ``"1 - cosine"``, ``"nats/sequence"``).
        at_optimum: the unpruned model is the objective's minimum, so dL/d gate = 0 there and head
            importance uses the second-order (Gauss-Newton) form (see :mod:`probe.pruning.importance`).
    """

    name = "objective"
    unit = ""
    at_optimum = False

    def setup(self, lm, batches) -> None:
        """Prepare the batches (masks, labels, reference outputs) before any gate is set."""

    def losses(self, lm, batch) -> torch.Tensor:
        """Per-unit losses [units] of one batch (differentiable)."""
        raise NotImplementedError


class CausalLM(Objective):
    name, unit = "clm", "nats/token"

    def setup(self, lm, batches) -> None:
        if head_kind(lm) != "causal-lm":
            raise InputError(f"objective 'clm' needs a decoder with a language-model head; {lm.name} is "
                             f"{type(lm.model).__name__}")

    def losses(self, lm, batch) -> torch.Tensor:
        logits = forward(lm, batch).logits  # [batch, T, vocab]
        ids = batch.input_ids.to(logits.device)
        keep = batch.real.to(logits.device)[:, 1:]
        return F.cross_entropy(_wide(logits[:, :-1][keep]), ids[:, 1:][keep], reduction="none")


class MaskedLM(Objective):
    name, unit = "mlm", "nats/masked token"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def setup(self, lm, batches) -> None:
        if head_kind(lm) != "masked-lm":
            raise InputError(f"objective 'mlm' needs an encoder loaded with its masked-LM head; {lm.name} is "
                             f"{type(lm.model).__name__} (a checkpoint without that head: use --objective fidelity)")
        mask_id = getattr(lm.tokenizer, "mask_token_id", None)
        if mask_id is None:
            raise InputError(f"objective 'mlm' needs a tokenizer with a mask token; {lm.name}'s has none")
        for batch in batches:
            batch._cache["probe.mlm"] = self._mask(batch, mask_id)

    def _mask(self, batch, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = batch.input_ids.clone()
        chosen = torch.zeros_like(ids, dtype=torch.bool)
        for row, index in enumerate(batch.index):
            candidates = (batch.real[row] & ~batch.special[row]).nonzero().flatten().tolist()
            if not candidates:
                continue
            rng = np.random.default_rng([self.seed, int(index)])
            n = max(1, round(MLM_RATE * len(candidates)))
            chosen[row, rng.choice(candidates, size=n, replace=False)] = True
        ids[chosen] = mask_id
        return ids, chosen

    def losses(self, lm, batch) -> torch.Tensor:
        ids, chosen = batch._cache["probe.mlm"]
        logits = forward(lm, batch, input_ids=ids).logits
        chosen = chosen.to(logits.device)
        return F.cross_entropy(_wide(logits[chosen]), batch.input_ids.to(logits.device)[chosen], reduction="none")


def sentence_embedding(lm, batch) -> torch.Tensor:
    """[batch, d_model] mean of the last hidden states over real tokens (sentence-transformers' pooling)."""
    inputs = batch.model_inputs()
    if lm.kind != "encoder":
        inputs["use_cache"] = False
    return mean_pool(base_model(lm.model)(**inputs).last_hidden_state, batch.real)


def mean_pool(hidden: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """[batch, d_model] the mean of ``hidden`` [batch, T, d_model] over the real tokens (``real`` [batch, T]
    bool, :attr:`probe.text.inputs.Batch.real`): :func:`sentence_embedding`'s pooling, in ``hidden``'s dtype."""
    real = real.to(hidden.device)[:, :, None].to(hidden.dtype)
    return (hidden * real).sum(1) / real.sum(1).clamp(min=1)


class Fidelity(Objective):
    name, unit, at_optimum = "fidelity", "1 - cosine", True

    def setup(self, lm, batches) -> None:
        with torch.no_grad(), measuring(lm.model, eager=False):
            for batch in batches:
                batch._cache["probe.fidelity"] = F.normalize(_wide(sentence_embedding(lm, batch)), dim=-1)

    def vector(self, lm, batch) -> torch.Tensor:
        """[batch, d_model] unit-length sentence embeddings of the model as gated now."""
        return F.normalize(_wide(sentence_embedding(lm, batch)), dim=-1)

    def losses(self, lm, batch) -> torch.Tensor:
        ref = batch._cache.get("probe.fidelity")
        if ref is None:
            raise ProbeError("fidelity: setup() was not run on this batch")
        return 1.0 - (self.vector(lm, batch) * ref.to(batch.input_ids.device)).sum(-1)


class Classification(Objective):
    name, unit = "classification", "nats/sequence"

    def setup(self, lm, batches) -> None:
        if head_kind(lm) != "classification":
            raise InputError(f"objective 'classification' needs a sequence-classification checkpoint; {lm.name} "
                             f"is {type(lm.model).__name__}")
        for batch in batches:
            labels = [t.meta.get("label") for t in batch.texts]
            if any(label is None for label in labels):
                raise InputError("objective 'classification' needs a label for every sequence (--labels FILE)")
            batch._cache["probe.labels"] = torch.tensor(labels, dtype=torch.long)

    def losses(self, lm, batch) -> torch.Tensor:
        logits = forward(lm, batch).logits  # [batch, classes]
        return F.cross_entropy(_wide(logits), batch._cache["probe.labels"].to(logits.device), reduction="none")


def make_objective(name: str, seed: int = 0) -> Objective:
    """The objective called ``name``.

    Raises:
        InputError: an unknown name.
    """
    table = {"clm": CausalLM, "mlm": lambda: MaskedLM(seed), "fidelity": Fidelity, "classification": Classification}
    if name not in table:
        raise InputError(f"unknown objective {name!r}; choose from {', '.join(OBJECTIVES)}")
    return table[name]()


def label_ids(lm, labels) -> list[int]:
    """Class ids of ``labels`` (ids, or names from the model's ``id2label``).

    Raises:
        InputError: a label that is neither a class id nor a class name of the model.
    """
    config = lm.model.config
    names = {str(v): int(k) for k, v in (getattr(config, "id2label", None) or {}).items()}
    n = int(getattr(config, "num_labels", len(names) or 0))
    out = []
    for i, label in enumerate(labels):
        text = str(label).strip()
        if text in names:
            out.append(names[text])
        elif text.lstrip("-").isdigit() and 0 <= int(text) < n:
            out.append(int(text))
        else:
            raise InputError(f"label {i + 1} ({text!r}) is not a class of the model: use a class id 0-{n - 1} or a "
                             f"name ({', '.join(sorted(names))})")
    return out
