"""GPT-Neo's behaviour rules (the spec's ``scaling``, ``upcast`` and ``window`` fields): its scores are
not scaled, they and the softmax run in float32, and its layers alternate between global causal
attention and local attention over a sliding window (``config.attention_layers``, ``window_size``;
Black et al. 2021, EleutherAI's GPT-Neo, after the local attention of Child et al. 2019)."""

from __future__ import annotations


def no_scaling(config, d_head: int, layer: int) -> float:
    """GPT-Neo and T5: scores are not scaled (q k^T as it is; T5 folds 1/sqrt(d_head) into its
    initialisation, Raffel et al. 2020; GPT-Neo's ``_attn`` has no scale)."""
    return 1.0


def always_upcast(config) -> bool:
    """GPT-Neo: the queries and keys are cast to float32 before q k^T, so the scores and the softmax
    are float32 in every dtype (the probabilities are then cast to the values' dtype)."""
    return True


def local_window(config, layer: int) -> int | None:
    """GPT-Neo: ``window_size`` keys (the query's own included) in the layers whose entry of
    ``attention_layers`` is ``"local"``; None (every earlier key) in ``"global"`` layers."""
    types = getattr(config, "attention_layers", None) or ()
    if layer < len(types) and types[layer] == "local":
        return int(config.window_size)
    return None
