"""Position biases added to attention scores: ALiBi and T5's bucketed relative position bias.

* ALiBi (Press et al. 2022, "Train Short, Test Long", sec. 3): head h adds -m_h * (i - j) to the
  score of query i and key j, with slopes m_h a geometric sequence. For n heads, n a power of 2:
  m_h = 2^(-8 h / n), h = 1..n. Otherwise (sec. 3, footnote; BLOOM's implementation): the 2^k
  slopes of the largest power of two 2^k < n, then every other slope of the 2^(k+1) sequence
  (2^(-4 h / 2^k) for odd h = 1, 3, ...) until there are n.
  Because the softmax of a row does not change when a constant is added to the whole row,
  -m (i - j) and +m j give the same probabilities; probe adds m * j (j = the key's position among
  the real tokens), the form BLOOM uses, so the scores equal the model's to the last bit.
* T5 (Raffel et al. 2020, sec. 2.1): each head adds a learned scalar per bucket of the relative
  position j - i; 32 buckets by default, half for exact small offsets and half logarithmically
  spaced up to ``max_distance`` (beyond which offsets share the last bucket); bidirectional
  (encoder) buckets split into "key before" and "key after" halves, causal (decoder) ones count
  only keys before the query. The learned values live in the first layer of each stack and are
  shared by all its layers; probe computes the bucket of every (query, key) pair itself and looks
  the values up in that embedding.
* DeBERTa's disentangled attention (He et al. 2021, sec. 3.1; DeBERTa-v2/v3's log-bucketed
  positions): content-to-position and position-to-content terms computed from the queries, the
  keys and the stack's relative position embeddings (:mod:`probe.architectures.disentangled`).
  Unlike ALiBi and T5 this bias depends on the queries and keys, so the reference hands them
  to the rule.

:class:`PositionBias` is the rule an architecture spec chooses once (:data:`NO_POSITION_BIAS`,
:data:`ALIBI`, :data:`T5_RELATIVE`); the reference attention calls it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .disentangled import disentangled_bias, position_terms, relative_table


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi slopes m_h, [n_heads] float32 (Press et al. 2022, sec. 3).

    Raises:
        ValueError: n_heads below 1.
    """
    if n_heads < 1:
        raise ValueError(f"ALiBi needs at least one head, got {n_heads}")
    k = 2 ** math.floor(math.log2(n_heads))  # largest power of two <= n_heads

    def geometric(n: int, powers: range) -> torch.Tensor:  # (2^(-8/n))^h in float32
        return torch.pow(torch.tensor(2.0 ** (-8.0 / n), dtype=torch.float32),
                         torch.tensor(list(powers), dtype=torch.int32))

    slopes = geometric(k, range(1, k + 1))
    if k != n_heads:  # every other slope (odd powers) of the 2k-head sequence
        slopes = torch.cat([slopes, geometric(2 * k, range(1, 1 + 2 * min(k, n_heads - k), 2))])
    return slopes


def alibi_bias(slopes: torch.Tensor, key_positions: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    """ALiBi as added to the scores: ``sign * m_h * j`` for every key j, [batch, heads, 1, key].

    Args:
        slopes: [heads] (:func:`alibi_slopes`).
        key_positions: [batch, key] position of each key among the real tokens (padding keys:
            anything; they are masked).
        sign: +1 for the correct bias (equivalent to -m (i - j) after the softmax); -1 is the
            ``alibi-sign`` bug (distant keys favoured).
    """
    return (sign * slopes[None, :, None, None] * key_positions[:, None, None, :].float())


def t5_buckets(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int,
               max_distance: int) -> torch.Tensor:
    """T5's bucket of each relative position j - i (an integer tensor of any shape), in [0, num_buckets).

    Bidirectional: keys after the query use the upper half of the buckets. Within a half, offsets
    below half of its buckets get one bucket each; larger ones share logarithmically wider
    buckets, reaching the last at ``max_distance``.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)  # only keys before (or at) the query count
    exact = num_buckets // 2
    small = distance < exact
    log_ratio = torch.log(distance.float() / exact) / math.log(max_distance / exact)
    large = exact + (log_ratio * (num_buckets - exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(small, distance, large)


def t5_bias(table: torch.Tensor, n_query: int, n_key: int, past: int, bidirectional: bool,
            num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's relative position bias, [1, heads, query, key].

    Args:
        table: the learned values, [num_buckets, heads] (the first layer's
            ``relative_attention_bias.weight``).
        n_query, n_key: the queries are positions past .. past + n_query - 1 of n_key keys.
    """
    q = torch.arange(n_query, device=table.device)[:, None] + past  # (Tq, 1)
    k = torch.arange(n_key, device=table.device)[None, :]  # (1, Tk)
    buckets = t5_buckets(k - q, bidirectional, num_buckets, max_distance)  # (Tq, Tk)
    return table[buckets].permute(2, 0, 1)[None]  # (1, heads, Tq, Tk)


@dataclass(frozen=True)
class PositionBias:
    """How an architecture biases its attention scores, chosen once in its spec
    (:attr:`~probe.architectures.spec.ArchSpec.position_bias`), as ``scaling`` and ``window`` are.

    Called as ``bias(module, n_query, n_key, past, key_positions, device, content)`` with ``module``
    the attention module computing the scores (it provides ``n_head``, ``alibi_sign``, ``config``,
    ``is_cross``, ``is_causal``, ``bias_table`` and, for DeBERTa, ``rel_embeddings``, ``c2p_sign``
    and its projections, like transformers' attention functions take ``module`` first) and
    ``content`` the ``(q, k)`` pair, q [batch, heads, query, d_head] and k [batch, heads, key, d_head]
    (None where the rule does not read it); returns [batch|1, heads, query|1, key] or None.

    Attributes:
        name: ``"none"``, ``"alibi"`` or ``"t5"``.
        compute: the function above.
        fused: the original adds it inside the score GEMM (``baddbmm``; BLOOM), which the
            reference copies for the same rounding.
        inner: a bias added to q k^T before the scaling, called like ``compute``, or None (Falcon's
            eager ALiBi in transformers 5.0-5.24 adds one there as well as after; the function may
            return None where the installed release adds none).
    """

    name: str
    compute: Callable[..., torch.Tensor | None]
    fused: bool = False
    inner: Callable[..., torch.Tensor | None] | None = None

    def inner_bias(self, module, n_query: int, n_key: int, past: int, key_positions: torch.Tensor | None,
                   device) -> torch.Tensor | None:
        """The bias added before the scaling, [batch|1, heads, query|1, key], or None."""
        return None if self.inner is None else self.inner(module, n_query, n_key, past, key_positions, device)

    def __call__(self, module, n_query: int, n_key: int, past: int, key_positions: torch.Tensor | None,
                 device, content: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | None:
        return self.compute(module, n_query, n_key, past, key_positions, device, content)


def _no_bias(module, n_query, n_key, past, key_positions, device, content=None) -> None:
    return None


def _alibi(module, n_query, n_key, past, key_positions, device, content=None) -> torch.Tensor:
    """ALiBi's m_h * j (j = the key's position among the real tokens; 0..n_key-1 without padding)."""
    if key_positions is None:
        key_positions = torch.arange(n_key, device=device)[None]  # (1, Tk)
    return alibi_bias(alibi_slopes(module.n_head).to(device), key_positions, module.alibi_sign)


def _t5(module, n_query, n_key, past, key_positions, device, content=None) -> torch.Tensor | None:
    """T5's learned bias of the bucket of j - i, on self-attention sites (its table lives in the
    stack's first layer); cross-attention has none."""
    table = module.bias_table
    if module.is_cross or table is None:
        return None
    c = module.config
    return t5_bias(table.weight, n_query, n_key, past, not module.is_causal, c.relative_attention_num_buckets,
                   c.relative_attention_max_distance)


def _disentangled(module, n_query, n_key, past, key_positions, device, content=None) -> torch.Tensor | None:
    """DeBERTa-v2/v3's c2p and p2c terms (None without ``relative_attention``): the stack's relative
    table through the layer's projections (its own key/query projections with ``share_att_key``,
    else ``pos_key_proj`` / ``pos_query_proj``), split into heads [heads, 2 * span, d_head]."""
    c = module.config
    if not getattr(c, "relative_attention", False) or content is None:
        return None
    q, k = content
    table = relative_table(*module.rel_embeddings, c)  # (2*span, d_model)
    share = getattr(c, "share_att_key", False)

    def heads(role: str, own: str):
        if role not in position_terms(c):
            return None
        x = (module.projection(own) if share else module.get_submodule(f"pos_{own}_proj"))(table)
        return x.view(x.size(0), module.n_head, -1).transpose(0, 1)  # (nh, 2*span, hs)
    return disentangled_bias(q, k, heads("p2c", "query"), heads("c2p", "key"), c, past, module.c2p_sign)


#: No bias (most architectures).
NO_POSITION_BIAS = PositionBias("none", _no_bias)
#: BLOOM's ALiBi (Press et al. 2022), added inside the score GEMM as BLOOM does.
ALIBI = PositionBias("alibi", _alibi, fused=True)
#: T5's bucketed relative position bias (Raffel et al. 2020).
T5_RELATIVE = PositionBias("t5", _t5)
#: DeBERTa-v2/v3's disentangled attention (He et al. 2021).
DISENTANGLED = PositionBias("disentangled", _disentangled)
