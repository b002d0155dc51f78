"""Falcon's behaviour rules (the spec's ``rope``, ``kv_heads`` and ``note`` fields): its configs choose
rotary positions or ALiBi (``alibi``), and multi-head, multi-query (``multi_query``) or grouped
(``new_decoder_architecture``, ``num_kv_heads``) key/value heads."""

from __future__ import annotations

from .spec import _query_heads, _rope_single


def rope_unless_alibi(config, layer: int) -> dict | None:
    """Falcon: RoPE unless the config asks for ALiBi (``alibi=True``; then no rotation, None)."""
    return None if getattr(config, "alibi", False) else _rope_single(config, layer)


def kv_heads_multi_query(config) -> int:
    """Falcon: ``num_kv_heads`` groups with ``new_decoder_architecture``, one shared key/value head
    with ``multi_query`` (Shazeer 2019), else one per query head."""
    if getattr(config, "new_decoder_architecture", False):
        return config.num_kv_heads
    return 1 if getattr(config, "multi_query", False) else _query_heads(config)


def alibi_note(config) -> str | None:
    """Falcon with ALiBi: what the captured maps are (docs/verification.md, "Falcon with ALiBi")."""
    if not getattr(config, "alibi", False):
        return None
    return ("falcon with alibi=True: transformers' eager attention, whose probabilities probe captures, adds the "
            "ALiBi bias twice; the model's sdpa outputs add it once, so its maps show twice the sdpa recency bias")
