"""The projection layout, decoded once: how one attention site's query, key, value and output
projections hold their heads (:attr:`probe.architectures.ArchSpec.qkv_layout` and ``conv1d``).

Each layout is an object (:func:`projection_layout`, reached as ``spec.layout``) that reads the
weights in one convention, splits a fused projection's output into q, k and v, counts the heads a
projection holds and cuts heads out of the weights. Nothing outside ``probe/architectures/`` reads
the layout string; analyses take weights from :mod:`probe.architectures.weights`.

- ``separate``: three ``nn.Linear`` (paths ``q``, ``k``, ``v``), weight [heads * d_head, d_model].
- ``conv1d``: one GPT-2 ``Conv1D`` (path ``qkv``), weight [d_model, 3 * heads * d_head], output
  q | k | v along the last dimension.
- ``per_head``: one ``nn.Linear`` whose output is laid out per head, [heads, 3, d_head] (GPT-NeoX,
  BLOOM ``query_key_value``).
- ``stacked``: one ``nn.Linear`` whose output is q (heads * d_head) | k | v (kv_heads * d_head each)
  (Phi-3 ``qkv_proj``).
- ``grouped``: one ``nn.Linear`` whose output is laid out per key/value head,
  [kv_heads, heads / kv_heads + 2, d_head]: the group's query heads, then its key, then its value
  (Falcon ``query_key_value``: [heads, 3, d_head] with one key/value head per query head, q | k | v
  with one shared key/value head).

The output projection is an ``nn.Linear`` (weight [d_model, heads * d_head]) or, with ``conv1d``, a
``Conv1D`` (weight [heads * d_head, d_model]).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

import torch
from torch import nn

#: How the query/key/value projections are stored (see :attr:`ArchSpec.qkv_layout`).
QKV_LAYOUTS = ("separate", "conv1d", "per_head", "stacked", "grouped")

#: ``role -> module`` of one site: ``"q"``, ``"k"``, ``"v"`` or ``"qkv"`` (those the layout uses).
Modules = Callable[[str], nn.Module]


def take_blocks(t: torch.Tensor, dim: int, slots: Sequence[int | None], size: int) -> torch.Tensor:
    """Blocks ``slots`` (each ``size`` wide along ``dim``) of ``t``, concatenated; None gives zeros."""
    parts = []
    for s in slots:
        if s is None:
            shape = list(t.shape)
            shape[dim] = size
            parts.append(t.new_zeros(shape))
        else:
            parts.append(t.narrow(dim, s * size, size))
    return torch.cat(parts, dim).contiguous()


def _set(module: nn.Module, name: str, value: torch.Tensor) -> None:
    old = getattr(module, name)
    setattr(module, name, nn.Parameter(value, requires_grad=old.requires_grad))


def _rows(w: torch.Tensor, n: int, d_head: int) -> torch.Tensor:
    """``nn.Linear`` weight rows [n * d_head, d_model] -> [n, d_model, d_head]."""
    return w.detach().reshape(n, d_head, -1).transpose(1, 2)


def _bias(b: torch.Tensor | None, n: int, d_head: int) -> torch.Tensor | None:
    return None if b is None else b.detach().reshape(n, d_head)


class ProjectionLayout:
    """One layout's rules (subclasses per layout); ``conv1d``: the output projection is a ``Conv1D``.

    Tensors are returned detached in the weights' own dtype: callers choose the precision.
    """

    name = ""
    #: :meth:`cut_qkv` can remove heads from this layout.
    cuttable = True

    def __init__(self, conv1d: bool = False) -> None:
        self.conv1d = conv1d

    def qkv_weights(self, get: Modules, H: int, KV: int, dh: int) -> tuple[torch.Tensor, ...]:
        """(W_Q [H, d_model, dh], W_K [KV, d_model, dh], W_V [KV, d_model, dh]): x @ W_Q[h] is head h's query."""
        raise NotImplementedError

    def qkv_biases(self, get: Modules, H: int, KV: int, dh: int) -> tuple[torch.Tensor | None, ...]:
        """(b_Q [H, dh], b_K [KV, dh], b_V [KV, dh]), each None where the projection has no bias."""
        raise NotImplementedError

    def project(self, get: Modules, x: torch.Tensor, nh: int, nkv: int, hs: int) -> tuple[torch.Tensor, ...]:
        """x [batch, T, d_model] -> q [batch, nh, T, hs], k, v [batch, nkv, T, hs] (the modules' own forward)."""
        raise NotImplementedError

    def values(self, output: torch.Tensor, n_heads: int, d_head: int) -> torch.Tensor:
        """The values x W_V + b_V [batch, kv_heads, key, d_head] in the output [batch, key, width] of the
        module named ``v`` (or the fused ``qkv``); ``n_heads``: query heads the module holds now."""
        raise NotImplementedError

    def head_counts(self, get: Modules, hs: int, n_kv: Callable[[], int]) -> tuple[int, int]:
        """(query heads, key/value heads) the projections hold, from their widths (pruned models too);
        ``n_kv()`` gives the key/value heads where the widths cannot tell them apart."""
        raise NotImplementedError

    def cut_qkv(self, get: Modules, q: list, kv: list, old_q: int, old_kv: int, d: int) -> None:
        """Keep only query slots ``q`` and key/value slots ``kv`` (indices into the current heads, None:
        a zero placeholder) of the projections, in place; ``old_q``/``old_kv``: heads held now."""
        raise NotImplementedError

    def output_rows(self, o: nn.Module) -> torch.Tensor:
        """The output projection as W [heads * d_head, d_model] (y = z W + b). A weight kept off the
        device between passes (accelerate's offload: a ``meta`` tensor) is read by running the module
        on the unit vectors: W = o(I) - o(0)."""
        weight = o.weight
        if weight.is_meta:
            n_in = weight.shape[0] if self.conv1d else weight.shape[1]
            eye = torch.eye(n_in, dtype=weight.dtype)[None]
            return (o(eye) - o(torch.zeros_like(eye[:, :1])))[0].detach()
        return weight.detach() if self.conv1d else weight.detach().t()

    def cut_output(self, o: nn.Module, q: list, d: int) -> None:
        """Keep only the output projection's input slots ``q`` (its output and bias stay), in place."""
        if self.conv1d:  # Conv1D weight [in, out]: rows
            _set(o, "weight", take_blocks(o.weight, 0, q, d))
            o.nx = len(q) * d
        else:
            _set(o, "weight", take_blocks(o.weight, 1, q, d))
            o.in_features = len(q) * d


class Separate(ProjectionLayout):
    """Three ``nn.Linear``: q, k, v."""

    name = "separate"

    def qkv_weights(self, get, H, KV, dh):
        return tuple(_rows(get(r).weight, n, dh) for r, n in (("q", H), ("k", KV), ("v", KV)))

    def qkv_biases(self, get, H, KV, dh):
        return tuple(_bias(get(r).bias, n, dh) for r, n in (("q", H), ("k", KV), ("v", KV)))

    def project(self, get, x, nh, nkv, hs):
        B, T, _ = x.shape
        q, k, v = get("q")(x), get("k")(x), get("v")(x)
        return _heads(q, k, v, B, T, nh, nkv, hs)

    def values(self, output, n_heads, d_head):
        B, T, _ = output.shape
        return output.reshape(B, T, -1, d_head).transpose(1, 2)

    def head_counts(self, get, hs, n_kv):
        return get("q").weight.shape[0] // hs, get("k").weight.shape[0] // hs

    def cut_qkv(self, get, q, kv, old_q, old_kv, d):
        for role, idx in (("q", q), ("k", kv), ("v", kv)):
            mod = get(role)
            _set(mod, "weight", take_blocks(mod.weight, 0, idx, d))
            if mod.bias is not None:
                _set(mod, "bias", take_blocks(mod.bias, 0, idx, d))
            mod.out_features = len(idx) * d


class Conv1D(ProjectionLayout):
    """GPT-2: one ``Conv1D``, weight [d_model, q | k | v] (columns), y = x W + b."""

    name = "conv1d"

    def qkv_weights(self, get, H, KV, dh):
        w = get("qkv").weight.detach()
        return tuple(w[:, i * H * dh:(i + 1) * H * dh].reshape(-1, H, dh).transpose(0, 1) for i in range(3))

    def qkv_biases(self, get, H, KV, dh):
        b = get("qkv").bias
        return (None,) * 3 if b is None else tuple(t.detach().reshape(H, dh) for t in b.split(H * dh))

    def project(self, get, x, nh, nkv, hs):
        B, T, _ = x.shape
        q, k, v = get("qkv")(x).split(nh * hs, dim=2)  # (B, T, nh*hs) each
        return _heads(q, k, v, B, T, nh, nkv, hs)

    def values(self, output, n_heads, d_head):
        B, T, width = output.shape
        return output[..., 2 * (width // 3):].reshape(B, T, -1, d_head).transpose(1, 2)

    def head_counts(self, get, hs, n_kv):
        n = get("qkv").weight.shape[1] // 3 // hs  # Conv1D weight [in, 3 * heads * d_head]
        return n, n

    def cut_qkv(self, get, q, kv, old_q, old_kv, d):
        mod = get("qkv")
        sizes = [old_q * d, old_kv * d, old_kv * d]
        for name, dim in (("weight", 1), ("bias", 0)):
            tq, tk, tv = torch.split(getattr(mod, name), sizes, dim)
            _set(mod, name, torch.cat([take_blocks(tq, dim, q, d), take_blocks(tk, dim, kv, d),
                                       take_blocks(tv, dim, kv, d)], dim))
        mod.nf = (len(q) + 2 * len(kv)) * d


class PerHead(ProjectionLayout):
    """GPT-NeoX, BLOOM: one ``nn.Linear`` whose output is [heads, 3, d_head] (rows: blocks of 3 d_head)."""

    name = "per_head"

    def qkv_weights(self, get, H, KV, dh):
        w = get("qkv").weight.detach().reshape(H, 3, dh, -1).transpose(2, 3)
        return w[:, 0], w[:, 1], w[:, 2]

    def qkv_biases(self, get, H, KV, dh):
        b = get("qkv").bias
        if b is None:
            return (None,) * 3
        b = b.detach().reshape(H, 3, dh)
        return b[:, 0], b[:, 1], b[:, 2]

    def project(self, get, x, nh, nkv, hs):
        B, T, _ = x.shape
        qkv = get("qkv")(x).view(B, T, nh, 3 * hs).transpose(1, 2)  # (B, nh, T, 3*hs)
        return qkv.chunk(3, dim=-1)  # (B, nh, T, hs) each

    def values(self, output, n_heads, d_head):
        B, T, _ = output.shape
        return output.reshape(B, T, -1, 3, d_head)[..., 2, :].reshape(B, T, -1, d_head).transpose(1, 2)

    def head_counts(self, get, hs, n_kv):
        n = get("qkv").weight.shape[0] // (3 * hs)  # Linear weight [heads * 3 * d_head, in]
        return n, n

    def cut_qkv(self, get, q, kv, old_q, old_kv, d):
        if q != kv:
            raise ValueError("the per-head fused layout has no grouped key/value heads")
        mod = get("qkv")
        _set(mod, "weight", take_blocks(mod.weight, 0, q, 3 * d))
        if mod.bias is not None:
            _set(mod, "bias", take_blocks(mod.bias, 0, q, 3 * d))
        mod.out_features = len(q) * 3 * d


class Stacked(ProjectionLayout):
    """Phi-3: one ``nn.Linear`` whose rows are q (heads * d_head) | k | v (kv_heads * d_head each)."""

    name = "stacked"

    def qkv_weights(self, get, H, KV, dh):
        w = get("qkv").weight
        return tuple(_rows(t, n, dh) for t, n in zip(w.split([H * dh, KV * dh, KV * dh]), (H, KV, KV)))

    def qkv_biases(self, get, H, KV, dh):
        b = get("qkv").bias
        if b is None:
            return (None,) * 3
        return tuple(_bias(t, n, dh) for t, n in zip(b.split([H * dh, KV * dh, KV * dh]), (H, KV, KV)))

    def project(self, get, x, nh, nkv, hs):
        B, T, _ = x.shape
        qkv = get("qkv")(x)  # (B, T, (nh + 2*nkv)*hs)
        q, k, v = qkv[..., :nh * hs], qkv[..., nh * hs:(nh + nkv) * hs], qkv[..., (nh + nkv) * hs:]
        return _heads(q, k, v, B, T, nh, nkv, hs)

    def values(self, output, n_heads, d_head):
        B, T, width = output.shape
        n_kv = (width // d_head - n_heads) // 2
        return output[..., (n_heads + n_kv) * d_head:].reshape(B, T, -1, d_head).transpose(1, 2)

    def head_counts(self, get, hs, n_kv):
        total = get("qkv").weight.shape[0] // hs  # Linear weight [(heads + 2 * kv_heads) * d_head, in]
        kv = n_kv()
        return total - 2 * kv, kv

    def cut_qkv(self, get, q, kv, old_q, old_kv, d):
        mod = get("qkv")
        sizes = [old_q * d, old_kv * d, old_kv * d]
        for name in ("weight", "bias"):
            t = getattr(mod, name)
            if t is None:
                continue
            tq, tk, tv = torch.split(t, sizes, 0)
            _set(mod, name, torch.cat([take_blocks(tq, 0, q, d), take_blocks(tk, 0, kv, d),
                                       take_blocks(tv, 0, kv, d)], 0))
        mod.out_features = (len(q) + 2 * len(kv)) * d


class Grouped(ProjectionLayout):
    """Falcon: one ``nn.Linear`` whose rows are, per key/value head g, its heads / kv_heads query
    heads, then its key, then its value ([kv_heads, heads / kv_heads + 2, d_head]); query head
    g * (heads / kv_heads) + r is group g's slot r."""

    name = "grouped"
    cuttable = False

    def qkv_weights(self, get, H, KV, dh):
        w = get("qkv").weight.detach().reshape(KV, H // KV + 2, dh, -1).transpose(2, 3)  # [KV, rep+2, in, dh]
        return w[:, :-2].reshape(H, -1, dh), w[:, -2], w[:, -1]

    def qkv_biases(self, get, H, KV, dh):
        b = get("qkv").bias
        if b is None:
            return (None,) * 3
        b = b.detach().reshape(KV, H // KV + 2, dh)
        return b[:, :-2].reshape(H, dh), b[:, -2], b[:, -1]

    def project(self, get, x, nh, nkv, hs):
        B, T, _ = x.shape
        qkv = get("qkv")(x).view(B, T, nkv, nh // nkv + 2, hs)
        q = qkv[:, :, :, :-2].reshape(B, T, nh * hs)
        k, v = qkv[:, :, :, -2].reshape(B, T, nkv * hs), qkv[:, :, :, -1].reshape(B, T, nkv * hs)
        return _heads(q, k, v, B, T, nh, nkv, hs)

    def values(self, output, n_heads, d_head):
        B, T, width = output.shape
        n_kv = (width // d_head - n_heads) // 2
        v = output.reshape(B, T, n_kv, n_heads // n_kv + 2, d_head)[..., -1, :]
        return v.reshape(B, T, -1, d_head).transpose(1, 2)

    def head_counts(self, get, hs, n_kv):
        total = get("qkv").weight.shape[0] // hs  # Linear weight [(heads + 2 * kv_heads) * d_head, in]
        kv = n_kv()
        return total - 2 * kv, kv

    def cut_qkv(self, get, q, kv, old_q, old_kv, d):
        raise ValueError("the grouped fused layout (Falcon) does not support cutting heads")


def _heads(q, k, v, B: int, T: int, nh: int, nkv: int, hs: int) -> tuple[torch.Tensor, ...]:
    """[B, T, n * hs] -> [B, n, T, hs] for q (n = nh), k and v (n = nkv)."""
    q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
    v = v.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
    return q, k, v


_CLASSES = {cls.name: cls for cls in (Separate, Conv1D, PerHead, Stacked, Grouped)}


@cache
def projection_layout(name: str, conv1d: bool = False) -> ProjectionLayout:
    """The layout object of ``name`` (one of :data:`QKV_LAYOUTS`); ``conv1d``: a ``Conv1D`` output projection.

    Raises:
        ValueError: an unknown layout name.
    """
    if name not in _CLASSES:
        raise ValueError(f"qkv_layout must be one of {QKV_LAYOUTS}, got {name!r}")
    return _CLASSES[name](conv1d)
