"""Block capture inside the reference attention: one site's attention a block of query rows at a
time (:mod:`probe.capture.blocks` swaps it in and collects the blocks)."""

from __future__ import annotations

import torch

from ..op import attention


def attend_in_blocks(module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor | None,
                     past: int, key_positions: torch.Tensor | None) -> torch.Tensor:
    """The attention output [batch, heads, T, d_head], computed ``module.query_block`` query rows at
    a time against every key; each block's probabilities [batch, heads, rows, Tk] go to
    ``module.on_block(probs, (i0, i1), T)`` and are let go.

    The same steps as the whole-map path, per block: the causal/window mask of the block's rows
    (``module.causal_mask`` of the keys up to the block's last query; later keys are masked, so
    their probabilities are exactly 0 and their scores are not computed), the position bias of
    its query positions (T5's bucket of j - i; ALiBi's depends on the key only), scores, masked
    softmax and probs @ v (the rows of a softmax are independent: each block holds those rows
    of the whole map).

    Args:
        module: the site's :class:`~probe.capture.reference.module.ReferenceAttention` (its steps: mask, bias,
            scale; its ``query_block`` and ``on_block``).
        q: [batch, heads, T, d_head] after norms and RoPE; k, v: [batch, heads, Tk, d_head] after
            repeating grouped key/value heads.
        padding: [batch, 1, 1, Tk] keep-mask of real keys, or None.
        past: tokens in the key/value cache before this pass.
        key_positions: [batch, Tk] positions among the real tokens (ALiBi), or None.
    """
    B, nh, T, _ = q.shape
    Tk = k.size(-2)
    y = torch.empty(B, nh, T, v.size(-1), dtype=v.dtype, device=q.device)
    step = max(1, int(module.query_block))
    for i0 in range(0, T, step):
        i1 = min(T, i0 + step)
        seen = Tk - (T - i1)  # keys at or before the block's last query
        tri = module.causal_mask(i1 - i0, seen, q.device)  # (rows, seen): the block's rows are the last of seen
        n = Tk if tri is None else seen  # keys that may have weight
        keep = None if padding is None else padding[..., :n]
        if tri is not None:
            keep = tri[None, None] if keep is None else keep & tri  # (B|1, 1, rows, n)
        bias = module.position_bias(i1 - i0, n, past + i0, None if key_positions is None else key_positions[:, :n],
                                    q.device, (q[:, :, i0:i1], k[:, :, :n]))
        kp = None if key_positions is None else key_positions[:, :n]
        inner = module.spec.position_bias.inner_bias(module, i1 - i0, n, past + i0, kp, q.device)
        if bias is not None and not module.upcast:
            bias = bias.to(q.dtype)
        out, probs = attention(q[:, :, i0:i1], k[:, :, :n], v[:, :, :n], mask=keep, scale=module.score_scale(),
                               softmax_dtype=module.softmax_dtype, upcast=module.upcast, softcap=module.softcap,
                               bias=bias, fused_bias=module.spec.position_bias.fused,
                               divide_keys=module.spec.divide_keys, inner_bias=inner)
        y[:, :, i0:i1] = out
        if n < Tk:  # later keys: exactly 0
            probs = torch.cat([probs, probs.new_zeros(*probs.shape[:3], Tk - n)], dim=-1)
        module.on_block(probs, (i0, i1), T)
        del probs
    return y
