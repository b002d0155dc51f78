"""Mixture-of-experts routers: per layer, which experts each token went to and with which weights, and
each expert's load.

A sparse MoE layer's router scores every token against E experts and sends it to k of them (Shazeer et
al. 2017, sec. 2.1; Mixtral, Jiang et al. 2024, sec. 2.1): p = softmax(W_r x) over the E experts, the k
largest kept, their weights either renormalised to sum to 1 (Mixtral always; Qwen2-MoE, Qwen3-MoE, OLMoE
and DeepSeek-V3 where ``config.norm_topk_prob``) or left as they are, and times DeepSeek's
``routed_scaling_factor``. probe computes none of this itself: it records what the model's own router
module returned in the analysis' forward pass (transformers' routers return ``(logits [N, E], weights
[N, k], experts [N, k])`` for the N = batch x T token rows), so the experts and weights are the ones the
model used, with the config's rule already applied.

:class:`RouterLoad` (an :class:`~probe.measures.accumulators.Accumulator` that hooks the routers, found
by :func:`find_routers`) keeps, per layer: tokens routed to each expert (``load``: the share of the N k
slots of real tokens), the mean weight each expert got where chosen, and, for the first ``n_examples``
texts, every token's experts and weights (written as ``routers.csv``: :mod:`probe.report.routers`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..architectures import stack_layers
from ..text.tokens import display_tokens
from .accumulators import Accumulator


def find_routers(lm) -> list[tuple[str, int, nn.Module]]:
    """(stack, layer, router module) of every MoE layer of ``lm``: in each layer of each stack, the one
    submodule whose class name ends with ``Router`` (transformers' ``MixtralTopKRouter``,
    ``Qwen2MoeTopKRouter``, ``DeepseekV3TopkRouter`` ...); layers without one (dense layers of a model
    that mixes them) are left out. Empty for a dense model."""
    out = []
    for stack, layers in stack_layers(lm.model, lm.spec).items():
        for i, layer in enumerate(layers):
            found = [m for m in layer.modules() if type(m).__name__.lower().endswith("router")]
            if len(found) == 1:
                out.append((stack, i, found[0]))
    return out


def routing(output, k: int | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(experts [N, k] long, weights [N, k] float) from a router module's output ``(logits [N, E], weights,
    experts [N, k])`` (weights [N, k], or [N, E] with 0 off the chosen experts); None for another output."""
    if not isinstance(output, tuple) or len(output) < 3:
        return None
    logits, weights, experts = output[:3]
    if not all(isinstance(t, torch.Tensor) for t in (logits, weights, experts)) or experts.is_floating_point():
        return None
    if logits.dim() != 2 or experts.dim() != 2 or experts.shape[0] != logits.shape[0]:
        return None
    if weights.shape == logits.shape and weights.shape != experts.shape:  # dense [N, E] scores
        weights = weights.gather(1, experts)
    if weights.shape != experts.shape:
        return None
    return experts.long(), weights.float()


@dataclass
class RouterResult:
    """What :class:`RouterLoad` measured.

    Attributes:
        layers: (stack, layer) of each MoE layer, in order.
        n_experts: experts per layer (E). top_k: experts per token (k).
        tokens: real tokens routed (per layer, the same count).
        counts: [layers, E] real tokens sent to each expert.
        weight_sums: [layers, E] sum of the weights each expert got where chosen.
        weight_totals: [layers] sum over real tokens of the k weights (1 per token where renormalised).
        norm_topk_prob: the config's ``norm_topk_prob`` (None where the config has none: Mixtral
            renormalises always). scaling: the config's ``routed_scaling_factor`` or None.
        tokens_frame: one row per (example token, layer): ``example``, ``position``, ``token``, ``stack``,
            ``layer``, ``expert_1`` .. ``expert_k`` (by weight, largest first), ``weight_1`` .. ``weight_k``.
        notes: router outputs that could not be read.
    """

    layers: list[tuple[str, int]]
    n_experts: int
    top_k: int
    tokens: int
    counts: np.ndarray
    weight_sums: np.ndarray
    weight_totals: np.ndarray
    norm_topk_prob: bool | None = None
    scaling: float | None = None
    tokens_frame: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: list[str] = field(default_factory=list)

    @property
    def renormalised(self) -> bool:
        """Whether the top-k weights were renormalised: the config's ``norm_topk_prob`` where it has one, else
        whether every layer's weights summed to 1 per token (Mixtral's router always renormalises)."""
        if self.norm_topk_prob is not None:
            return bool(self.norm_topk_prob)
        return bool(self.tokens) and bool(np.allclose(self.weight_totals / self.tokens, 1.0, atol=1e-4))

    def load(self) -> pd.DataFrame:
        """One row per (layer, expert): ``stack``, ``layer``, ``expert``, ``tokens`` (routed to it),
        ``load`` (its share of the tokens x k slots; a balanced router gives 1 / E), ``mean_weight``
        (its mean weight where chosen; NaN where never chosen)."""
        rows = []
        slots = max(1, self.tokens * self.top_k)
        for x, (stack, layer) in enumerate(self.layers):
            for e in range(self.n_experts):
                c = int(self.counts[x, e])
                rows.append({"stack": stack, "layer": layer, "expert": e, "tokens": c, "load": c / slots,
                             "mean_weight": self.weight_sums[x, e] / c if c else float("nan")})
        return pd.DataFrame(rows)

    def record(self) -> dict:
        """JSON: the settings, per layer the experts' load and mean weights, and the imbalance (largest load
        x E: 1 = balanced)."""
        frame = self.load()
        per_layer = []
        for x, (stack, layer) in enumerate(self.layers):
            f = frame[(frame["stack"] == stack) & (frame["layer"] == layer)]
            per_layer.append({"stack": stack, "layer": layer, "load": [round(float(v), 6) for v in f["load"]],
                              "mean_weight": [None if v != v else round(float(v), 6) for v in f["mean_weight"]],
                              "imbalance": round(float(f["load"].max() * self.n_experts), 6),
                              "mean_weight_total": round(float(self.weight_totals[x] / max(1, self.tokens)), 6)})
        return {"experts": self.n_experts, "top_k": self.top_k, "tokens": self.tokens,
                "norm_topk_prob": self.norm_topk_prob, "renormalised": self.renormalised,
                "routed_scaling_factor": self.scaling,
                "layers": per_layer, "notes": list(self.notes)}


class RouterLoad(Accumulator):
    """Records every MoE router's experts and weights for the real tokens of each batch (module docstring).

    Args:
        lm: the loaded model (its routers: :func:`find_routers`).
        n_examples: the first texts (corpus positions 0 .. n_examples - 1) whose every token's routing is kept.
    """

    name = "routers"
    title = "the MoE routers"
    row_blocks = True  # the routers run once per forward pass, whole or in blocks of query rows
    hooks_model = True  # :func:`probe.runs.analysis.run` calls :meth:`hook` with hooks it removes
    transient = ("_routers", "_tokenizer", "_pending")

    def __init__(self, lm, n_examples: int = 3) -> None:
        config = lm.model.config
        self._routers = find_routers(lm)
        self._tokenizer = lm.tokenizer
        self.layers = [(s, i) for s, i, _ in self._routers]
        self.n_examples = n_examples
        self.n_experts = int(next((getattr(config, a) for a in ("num_local_experts", "num_experts", "n_routed_experts")
                                   if isinstance(getattr(config, a, None), int)), 0))
        self.top_k = int(getattr(config, "num_experts_per_tok", 0) or 0)
        self.norm_topk_prob = getattr(config, "norm_topk_prob", None)
        self.scaling = getattr(config, "routed_scaling_factor", None)
        L = len(self.layers)
        self.counts = np.zeros((L, max(1, self.n_experts)), dtype=np.int64)
        self.weight_sums = np.zeros((L, max(1, self.n_experts)))
        self.weight_totals = np.zeros(L)
        self.tokens = 0
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(self, hooks) -> None:
        """Register a forward hook on every router into ``hooks`` (a :class:`probe.capture.hooks.Hooks`)."""
        for x, (_, _, module) in enumerate(self._routers):
            hooks.forward(module, lambda m, args, out, x=x: self._take(x, out))

    def _take(self, x: int, output) -> None:
        got = routing(output)
        if got is None:
            note = f"the router of layer {self.layers[x][1]} returned something probe cannot read; left out"
            if note not in self.notes:
                self.notes.append(note)
            return
        self._pending[x] = (got[0].detach().cpu(), got[1].detach().cpu())

    def begin_batch(self, batch) -> None:
        self._pending = {}

    def end_batch(self, batch) -> None:
        """Fold in the routers' outputs of this batch: rows of real tokens only (rows are batch x T, row-major)."""
        real = batch.real.cpu()
        B, T = real.shape
        flat = real.reshape(-1)
        if self._pending:
            self.tokens += int(flat.sum())
        labels = {}
        for b in range(B):
            if batch.index[b] < self.n_examples:
                n = int(real[b].sum())
                ids = batch.input_ids[b, :n].tolist()
                offsets = [tuple(o) for o in batch.offsets[b, :n].tolist()]
                labels[b] = display_tokens(self._tokenizer, batch.texts[b].text, ids, offsets,
                                           batch.special[b, :n].tolist())
        for x, (experts, weights) in sorted(self._pending.items()):
            if experts.shape[0] != B * T:
                continue
            e, w = experts[flat], weights[flat]
            if self.n_experts <= int(e.max()):
                self._grow(int(e.max()) + 1)
            np.add.at(self.counts[x], e.reshape(-1).numpy(), 1)
            np.add.at(self.weight_sums[x], e.reshape(-1).numpy(), w.reshape(-1).double().numpy())
            self.weight_totals[x] += float(w.double().sum())
            self.top_k = e.shape[1]
            order = weights.argsort(dim=1, descending=True, stable=True)
            ee, ww = experts.gather(1, order).view(B, T, -1), weights.gather(1, order).view(B, T, -1)
            stack, layer = self.layers[x]
            for b, toks in labels.items():
                for i, tok in enumerate(toks):
                    row = {"example": int(batch.index[b]), "position": i, "token": tok, "stack": stack, "layer": layer}
                    row.update({f"expert_{j + 1}": int(v) for j, v in enumerate(ee[b, i].tolist())})
                    row.update({f"weight_{j + 1}": float(v) for j, v in enumerate(ww[b, i].tolist())})
                    self.rows.append(row)
        self._pending = {}

    def _grow(self, n: int) -> None:
        pad = n - self.counts.shape[1]
        self.counts = np.pad(self.counts, ((0, 0), (0, pad)))
        self.weight_sums = np.pad(self.weight_sums, ((0, 0), (0, pad)))
        self.n_experts = n

    def update(self, site, probs, batch, **_) -> None:
        """Nothing: the routers are read by their hooks (:meth:`hook`)."""

    def merge(self, other: RouterLoad) -> RouterLoad:
        if other.counts.shape[1] > self.counts.shape[1]:
            self._grow(other.counts.shape[1])
        self.counts[:, :other.counts.shape[1]] += other.counts
        self.weight_sums[:, :other.weight_sums.shape[1]] += other.weight_sums
        self.weight_totals += other.weight_totals
        self.tokens += other.tokens
        self.rows += other.rows
        self.notes += [n for n in other.notes if n not in self.notes]
        return self

    def result(self) -> RouterResult:
        frame = pd.DataFrame(self.rows).sort_values(["example", "layer", "position"], kind="stable") \
            .reset_index(drop=True) if self.rows else pd.DataFrame()
        return RouterResult(self.layers, self.n_experts, self.top_k, self.tokens, self.counts, self.weight_sums,
                            self.weight_totals, self.norm_topk_prob, self.scaling, frame, list(self.notes))
