"""The intermediate steps of one head in a reference attention pass (``probe.capture.reference.module``'s
``record_steps``), computed with the same functions the pass runs."""

from __future__ import annotations

import torch

from ...errors import ProbeError
from ..op import masked_softmax, scaled_scores


def record_steps(module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None,
                 bias: torch.Tensor | None, inner: torch.Tensor | None = None) -> None:
    """Keep one head's steps of this pass in ``module.steps`` (batch row 0, every query), with the same
    functions :func:`~probe.capture.op.attention` runs (so the numbers are the module's own).

    Args:
        module: the site's :class:`~probe.capture.reference.module.ReferenceAttention` (its ``step_request``
            head, scale, softcap, softmax dtype and spec).
        q: [batch, heads, T, d_head] after q/k norms and RoPE; k, v: [batch, heads, Tk, d_head]
            after repeating grouped key/value heads; keep: [batch|1, 1, T|1, Tk] or None;
            bias: [batch|1, heads, T|1, Tk] or None; inner: the bias added before scaling, the same
            shape, or None (Falcon's ALiBi; ``steps["bias"]`` then holds inner * scale + bias).

    ``steps``: ``q`` [T, d_head], ``k``/``v`` [Tk, d_head] (of key/value head ``kv_head``), ``score``
    (q . k, unscaled) [T, Tk], ``bias`` [T, Tk] (zeros where none), ``scaled`` (softcap(score *
    scale) + bias, before masking) [T, Tk], ``keep`` [T, Tk] bool, ``probs`` [T, Tk], ``scale``,
    ``softcap``.

    Raises:
        ProbeError: the head is out of range.
    """
    h = module.step_request
    if not 0 <= h < module.n_head:
        raise ProbeError(f"no head {h} at this site ({module.n_head} heads)")
    T, Tk = q.size(2), k.size(-2)
    qh, kh = q[:1, h:h + 1], k[:1, h:h + 1]  # (1, 1, T, hs), (1, 1, Tk, hs)
    b = None if bias is None else bias[:1, h:h + 1].expand(1, 1, T, Tk)
    ib = None if inner is None else inner[:1, h:h + 1].expand(1, 1, T, Tk)
    scaled = scaled_scores(qh, kh, module.score_scale(), upcast=module.upcast, softcap=module.softcap, bias=b,
                           fused_bias=module.spec.position_bias.fused, divide_keys=module.spec.divide_keys,
                           inner_bias=ib)  # (1, 1, T, Tk)
    if ib is not None:
        b = ib * module.score_scale() + (0 if b is None else b)
    row = None if keep is None else keep[:1, :1].expand(1, 1, T, Tk)
    probs = masked_softmax(scaled, row, module.softmax_dtype).to(v.dtype)
    work = torch.float32 if module.upcast else q.dtype
    module.steps = dict(
        q=qh[0, 0].detach(), k=kh[0, 0].detach(), v=v[0, h].detach(), kv_head=h * module.n_kv_head // module.n_head,
        score=(qh.to(work) @ kh.to(work).transpose(-2, -1))[0, 0].detach(),
        bias=torch.zeros(T, Tk, device=q.device) if b is None else b[0, 0].detach(),
        scaled=scaled[0, 0].detach(), probs=probs[0, 0].detach(),
        keep=torch.ones(T, Tk, dtype=torch.bool, device=q.device) if row is None else row[0, 0].detach(),
        scale=float(module.score_scale()), softcap=module.softcap)
