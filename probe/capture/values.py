"""Value-weighted (norm-based) attention: how much each key's value moves, not only how much it is read.

Kobayashi et al. 2020 ("Attention is Not Only a Weight", EMNLP, sec. 3) write one head's output at
query i as sum_j A[i, j] f_h(x_j), with f_h(x_j) = (x_j W_V^g + b_V^g) W_O^h the value vector of key
j carried through the head's slice of the output projection (row vectors; g = g(h) = floor(h / (H /
KV)) the value head a query head reads under grouped key/value heads; the output bias b_O belongs to
no head and is left out). The norm-weighted map is N[i, j] = A[i, j] ||f_h(x_j)|| and its row-normalized
form N~ = N / sum_k N[i, k]; a row whose N sums to 0 has no N~ (statistics leave it out).

The norms need no [query, key] computation: ||f_h(x_j)||^2 = v G_h v^T with v = x_j W_V^g + b_V^g (the
value projection's own output, read by a hook) and G_h = W_O^h W_O^h^T [d_head, d_head], computed once per
layer from the output projection's weights. The value projection's input x_j is the normed residual
(pre-norm models), the layer input (BERT), or the encoder's output (cross-attention).

Data flow: a forward hook on each site's value projection (:func:`add_value_hooks`) keeps its
values [batch, kv_heads, key, d_head] until the site's probabilities arrive; :class:`ValueTracker`
then turns them into :class:`ValueNorms` (per head and key, and per head and query row: the norm of
the head's output, ``norm_mass``) for the accumulators that read them (:mod:`probe.measures.stats`).
A model that runs probe's attention function also hands each call's head outputs z_i = sum_j A[i, j]
v_j to the tracker, and ``norm_mass`` is read from them (``head_output_norms``: float32 and float64
models, no output editor) instead of a second product of the probabilities with the values.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn

from ..architectures import ArchSpec, needs_weights, site_block, site_spec
from ..sites import Site
from .hooks import Hooks
from .interface import has_editors, site_listeners


def value_states(spec: ArchSpec, output: torch.Tensor, n_heads: int, d_head: int) -> torch.Tensor:
    """The values x W_V + b_V [batch, kv_heads, key, d_head] in the output of a site's value projection.

    Args:
        spec: the architecture (its projection layout, :attr:`~probe.architectures.ArchSpec.layout`).
        output: [batch, key, width] what the module named by the site spec's ``v`` (or fused ``qkv``)
            returned: values only; GPT-2's q | k | v; GPT-NeoX / BLOOM per head [heads, 3, d_head];
            Phi-3's q (heads * d_head) | k | v (kv_heads * d_head each); Falcon's per key/value head
            [kv_heads, heads / kv_heads + 2, d_head] (the group's queries, its key, its value).
        n_heads: query heads the module holds now (the width of the output projection's input /
            d_head; fewer in a physically pruned model).
        d_head: features per head.
    """
    return spec.layout.values(output, n_heads, d_head)


def output_gram(spec: ArchSpec, o: nn.Module, d_head: int) -> torch.Tensor:
    """G_h = W_O^h W_O^h^T [heads, d_head, d_head] (float32) of one output projection.

    W_O^h [d_head, d_model] is head h's block of the output projection's input: the columns
    ``weight[:, h*d_head:(h+1)*d_head]`` of an ``nn.Linear`` ([out, in]), the rows of a GPT-2 ``Conv1D``
    ([in, out]). ||v W_O^h||^2 = v G_h v^T. A weight kept off the device between forward passes
    (accelerate's CPU or disk offload: a ``meta`` tensor) is read by running the module itself on
    the unit vectors: W_O = o(I) - o(0).
    """
    w = spec.layout.output_rows(o).float()  # [heads * d_head, d_model]
    w = w.reshape(-1, d_head, w.shape[-1])
    return w @ w.transpose(1, 2)


#: The store of :func:`shared_grams` in force (None: each :class:`ValueTracker` computes its own).
_SHARED: ContextVar[dict | None] = ContextVar("probe_shared_grams", default=None)


@contextmanager
def shared_grams(store: dict) -> Iterator[dict]:
    """Context manager: every :class:`ValueTracker` inside reads G_h (:func:`output_gram`) from ``store``
    and files those it computes there, so that runs after the first (the live page's edits: one
    :func:`probe.analyze` per text) do not compute them again.

    An entry is used only for the same output projection holding the same weight tensor with the same
    data and version counter (an in-place change through the tensor, a new or cut weight: computed again);
    a weight kept off the device (``meta``) is never filed. The caller keeps ``store`` (a dict it owns).
    """
    token = _SHARED.set(store)
    try:
        yield store
    finally:
        _SHARED.reset(token)


def _weight_state(o: nn.Module, d_head: int) -> tuple | None:
    """What a filed G_h of ``o`` must still match (None: not filed, a weight off the device)."""
    w = getattr(o, "weight", None)
    if not isinstance(w, torch.Tensor) or w.is_meta:
        return None
    return (w._version, w.data_ptr(), tuple(w.shape), w.dtype, w.device, d_head)


def value_norms(v: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """||f_h(x_j)|| [batch, heads, key] (hidden-state units) from values and the output projection's Gram.

    Args:
        v: [batch, kv_heads, key, d_head] values x_j W_V^g + b_V^g (:func:`value_states`).
        gram: [heads, d_head, d_head] G_h (:func:`output_gram`); query head h reads value head
            floor(h / (heads / kv_heads)) (Hugging Face's ``repeat_kv`` order).
    """
    B, KV, T, d = v.shape
    g = gram.shape[0] // KV
    vf = v.float()[:, :, None]  # [B, KV, 1, T, d]
    vg = vf @ gram.reshape(KV, g, d, d).to(vf.device)  # [B, KV, g, T, d]
    sq = (vg * vf).sum(-1)  # [B, KV, g, T]
    return sq.clamp(min=0).sqrt().reshape(B, KV * g, T)


def output_norms(probs: torch.Tensor, v: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """||sum_j A[i, j] f_h(x_j)|| [batch, heads, query]: the norm of each head's output at each query
    row, b_O left out (z_i G_h z_i^T with z_i = sum_j A[i, j] v_j).

    Args:
        probs: [batch, heads, query, key] attention probabilities (0 at masked keys).
        v: [batch, kv_heads, key, d_head] values.
        gram: [heads, d_head, d_head].
    """
    B, H, Tq, Tk = probs.shape
    KV, d = v.shape[1], v.shape[-1]
    vf = v.float()
    z = (probs.float().reshape(B, KV, (H // KV) * Tq, Tk) @ vf).reshape(B, H, Tq, d)
    sq = ((z @ gram.to(z.device)) * z).sum(-1)
    return sq.clamp(min=0).sqrt()


#: Dtypes in which each head's output handed by probe's attention function is used for ``norm_mass``
#: as it is (:func:`head_output_norms`); a half-precision output (rounded to the dtype) is not: the
#: norms are computed again from the probabilities in float32 (:func:`output_norms`).
WIDE = (torch.float32, torch.float64)


def head_output_norms(z: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """:func:`output_norms` from each head's output z_i = sum_j A[i, j] v_j as probe's attention
    function computed it (:attr:`probe.capture.interface.Call.output`): no second product with the
    values. [batch, heads, query].

    Args:
        z: [batch, query, heads, d_head] each head's output before the output projection.
        gram: [heads, d_head, d_head].
    """
    zf = z.float().transpose(1, 2)  # [B, H, Tq, d]
    sq = ((zf @ gram.to(zf.device)) * zf).sum(-1)
    return sq.clamp(min=0).sqrt()


def norm_weighted(probs: torch.Tensor, norms: torch.Tensor,
                  out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """N~ = row-normalized A[i, j] ||f_h(x_j)||, and the rows that have none.

    Args:
        probs: [batch, heads, query, key] attention probabilities.
        norms: [batch, heads, key] ||f_h(x_j)|| (:func:`value_norms`).
        out: a float32 tensor of ``probs``' shape to write N~ into, or None (a new one).

    Returns:
        ``(tilde, empty)``: tilde [batch, heads, query, key] float32, every row summing to 1 except
        rows whose N sums to 0 (all 0 there; ``empty`` [batch, heads, query] bool marks them). NaN
        stays NaN (the removed heads of a pruned model).
    """
    a, nf = probs.float(), norms.float()
    total = (a @ nf[..., None])[..., 0]  # [B, H, Tq]: sum_j A[i, j] ||f(x_j)||
    empty = total == 0
    scale = 1.0 / torch.where(total > 0, total, torch.full_like(total, float("inf")))  # 0 on empty rows
    tilde = torch.mul(a, nf[:, :, None, :], out=out)
    tilde *= scale[..., None]
    return tilde, empty


@dataclass
class ValueNorms:
    """What value-weighted statistics read of one site and batch (original head numbering).

    Attributes:
        norms: [batch, heads, key] ||f_h(x_j)||, hidden-state units (NaN for removed heads).
        mass: [batch, heads, query] ||sum_j A[i, j] f_h(x_j)||, the norm of the head's output at each
            query row, b_O left out (NaN for removed heads); under block capture the block's query
            rows only (the rows of the probabilities handed with it).
    """

    norms: torch.Tensor
    mass: torch.Tensor


def value_module(model: nn.Module, spec: ArchSpec, site: Site) -> nn.Module:
    """The module whose output holds a site's values (its ``v`` projection, or the fused ``qkv``)."""
    paths = site_spec(spec, site)
    return site_block(model, spec, site).get_submodule(paths.v or paths.qkv)


def add_value_hooks(hooks: Hooks, model: nn.Module, spec: ArchSpec, sites: list[Site],
                    callback: Callable[[Site, torch.Tensor], None]) -> None:
    """Register, into ``hooks``, one forward hook per site on its value projection calling
    ``callback(site, output)`` with the module's output [batch, key, width] (before the site's
    attention module returns: every value projection lies inside its attention module)."""
    def make(site: Site):
        def hook(module, args, output):
            callback(site, output.detach())
        return hook

    for site in sites:
        hooks.forward(value_module(model, spec, site), make(site))


class ValueTracker:
    """Values of the sites of one forward pass, turned into :class:`ValueNorms` when each site's
    probabilities arrive (:func:`probe.runs.analysis.run`).

    G_h is computed once per site (the weights do not change during a run).

    Args:
        lm: the loaded model (a :class:`~probe.core.LoadedModel`); a pruned one's heads are put back in
            the original numbering with NaN for removed heads.
    """

    def __init__(self, lm) -> None:
        self.lm = lm
        self.d_head = lm.geometry.d_head
        self._values: dict[Site, torch.Tensor] = {}
        self._kept: dict[Site, tuple[torch.Tensor, torch.Tensor]] = {}  # block capture: (values, norms)
        self._grams: dict[Site, torch.Tensor] = {}
        self._outputs: dict[Site, torch.Tensor] = {}  # probe's function: each head's output of the last call

    def hook(self, hooks: Hooks) -> None:
        """Register the value hooks of every site into ``hooks`` (a discovered spec: the values
        [batch, kv_heads, key, d_head] probe's attention function received, :mod:`probe.capture.interface`).
        Every call of probe's function also leaves each head's output (float32 or float64 models), from
        which ``mass`` is read without a second product of the probabilities with the values."""
        if self.lm.spec.discovered:
            needs_weights(self.lm.spec, "value-weighted statistics", ("o",))

        def keep(site: Site, call) -> None:
            if self.lm.spec.discovered and (call.rows is None or call.rows[0] == 0):
                self._values[site] = call.value.detach()
            # each head's output as the function computed it (this call or block), unless an editor changed it
            if call.output.dtype in WIDE and not has_editors(call.module, "output"):
                self._outputs[site] = call.output.detach()
        # every model that runs probe's attention function hands its calls here (a hand-spec model under
        # eager attention never calls it: its values come from the value projection's hook below)
        site_listeners(hooks, self.lm.model, self.lm.spec, keep)
        if self.lm.spec.discovered:
            return
        add_value_hooks(hooks, self.lm.model, self.lm.spec, self.lm.sites, self._values.__setitem__)

    def gram(self, site: Site) -> torch.Tensor:
        """G_h [heads now in the module, d_head, d_head] of a site (cached for the run; across runs inside
        :func:`shared_grams`)."""
        if site not in self._grams:
            paths = site_spec(self.lm.spec, site)
            o = site_block(self.lm.model, self.lm.spec, site).get_submodule(paths.o)
            shared, state = _SHARED.get(), None
            if shared is not None and (state := _weight_state(o, self.d_head)) is not None:
                filed = shared.get(id(o))
                if filed is not None and filed[0]() is o and filed[1]() is o.weight and filed[2] == state:
                    self._grams[site] = filed[3]
                    return filed[3]
            gram = output_gram(self.lm.spec, o, self.d_head)
            if state is not None:
                shared[id(o)] = (weakref.ref(o), weakref.ref(o.weight), state, gram)
            self._grams[site] = gram
        return self._grams[site]

    def take(self, site: Site, probs: torch.Tensor, original_numbering: bool = True) -> ValueNorms:
        """The :class:`ValueNorms` of ``site`` for the probabilities it just returned ([batch, heads now
        in the module, query, key]); the kept values are let go. ``original_numbering``: a pruned
        model's heads in the original numbering (NaN for removed heads), else as its modules hold them.

        Raises:
            RuntimeError: the site's value projection did not run in this forward pass.
        """
        return self.take_block(site, probs, None, original_numbering)

    def take_block(self, site: Site, probs: torch.Tensor, rows: tuple[int, int, int] | None,
                   original_numbering: bool = True) -> ValueNorms:
        """:meth:`take` for one block of query rows (block capture, :mod:`probe.capture.blocks`).

        Args:
            probs: [batch, heads now in the module, i1 - i0, key] the block's probabilities.
            rows: ``(i0, i1, n_query)``: the block's query rows of ``n_query``; the site's values are
                kept until the last block (i1 == n_query). None: the whole map (as :meth:`take`).

        Returns:
            :class:`ValueNorms` with ``norms`` [batch, heads, key] and ``mass`` [batch, heads, i1 - i0]
            (the block's rows).

        Raises:
            RuntimeError: the site's value projection did not run in this forward pass.
        """
        gram = self.gram(site)
        if site not in self._kept:  # the first (or only) block: values and their norms, once per site
            output = self._values.pop(site, None)
            if output is None:
                raise RuntimeError(f"site {site.name}: its value projection did not run before its attention returned")
            v = output if output.dim() == 4 else value_states(self.lm.spec, output, gram.shape[0], self.d_head)
            self._kept[site] = (v, value_norms(v, gram))
        v, norms = self._kept[site] if rows is not None and rows[1] < rows[2] else self._kept.pop(site)
        if rows is not None and site.causal and site.kind != "cross":  # keys after the block's last row: A = 0
            n_keys = probs.shape[-1] - (rows[2] - rows[1])
            probs, v = probs[..., :n_keys], v[..., :n_keys, :]
        z = self._outputs.pop(site, None)
        mass = output_norms(probs, v, gram) if z is None or z.shape[1] != probs.shape[2] else head_output_norms(z, gram)
        if self.lm.pruned is not None and original_numbering:
            norms, mass = self.lm.pruned.expand(site.layer, norms), self.lm.pruned.expand(site.layer, mass)
        return ValueNorms(norms, mass)


def value_weighting_for(lm, value_weighted: bool, labels_by: str) -> tuple[bool, str | None]:
    """Whether a run of ``lm`` keeps the value-weighted statistics, and the note where they are left out.

    They need each head's slice of the output projection (G_h above). A discovered spec that did not
    find it (gated or differential attention: the heads' output is gated or combined before any
    linear map that reads [batch, T, heads x d_head]) is measured without them: the attention
    statistics need no output projection. Labels by norm read them, so they are refused there.

    Returns:
        ``(value_weighted, note)``: ``value_weighted`` unchanged and None, or False and the note.

    Raises:
        UnsupportedArchitectureError: ``labels_by="norm"`` on such a model (one line).
    """
    if not value_weighted or "o" not in lm.spec.missing:
        return value_weighted, None
    if labels_by == "norm":
        needs_weights(lm.spec, "labels by norm (value-weighted statistics)", ("o",))
    if lm.spec.capture_only:
        return False, (f"value-weighted statistics (the _by_norm columns, norm_mass) left out: {lm.spec.family}'s "
                       "attention is its own code, and probe reads only the maps it returns (no value or output "
                       "projection); the attention statistics do not need them")
    return False, (f"value-weighted statistics (the _by_norm columns, norm_mass) left out: they need the output "
                   f"projection weights of {lm.spec.family}, which probe did not find (and check) in its attention "
                   "modules (gated or differential attention); the attention statistics do not need them")
