"""Activation and attribution patching of every component, beyond each head's output z: each head's
query, key, value and attention pattern, the residual stream entering each block, each MLP's output.

=============  ===============================  ============  ==========================================
component      where (read and written)         unit          tensor
=============  ===============================  ============  ==========================================
``z``          the ``"output"`` point            query head    [batch, pos, heads, d_head]
``q``          the ``"query"`` point (rotated)   query head    [batch, heads, pos, d_qk]
``k``, ``v``   the ``"key"``/``"value"`` points  key/value     [batch, kv_heads, pos, d]
                                                 head
``pattern``    the ``"pattern"`` point           query head    [batch, heads, query, key] (rows patched)
``resid``      the block's input (a pre-hook)    layer         [batch, pos, d_model]
``mlp``        the MLP's output (a hook)         layer         [batch, pos, d_model]
=============  ===============================  ============  ==========================================

The head points are the intervention point's (:mod:`probe.capture.intervene`); ``resid`` and ``mlp``
use its :meth:`~probe.capture.intervene.Intervention.before` and
:meth:`~probe.capture.intervene.Intervention.after`, on the same hooks. Where the model groups its key
and value heads, ``k`` and ``v`` are patched per key/value head (the ``unit`` column says
``kv_head``): one key/value head feeds several query heads. A patch covers every real position, or the
metric's position only (``last``; for ``pattern`` the query row, every key).

Activation patching: the run (corrupted when denoising) with the component's unit taken from the donor
run (clean when denoising), effects normalised as :func:`~probe.effects.patching.patch_heads` does
(several patched copies of the batch in one pass, the baselines of the same shape: a patch with the
run's own value gives exactly 0; each pass re-entering the unpatched run at the lowest layer it patches
where the model allows it, :mod:`.patch_layers`). Attribution patching (Nanda 2023; Syed et al. 2023): per unit, the
sum over its positions and features of (donor - run) * dLD/d(component) in the run, from one forward
and one backward pass; the first-order estimate of the same raw difference.

One-stack models (decoders, masked-LM encoders: the metric at the clean prompt's [MASK]); an
encoder-decoder model is patched for ``z`` only; ``mlp`` needs a spec naming the MLP module (not BERT's,
whose MLP output module also adds the residual and norms it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..architectures import site_block
from ..architectures.weights import block_mlp
from ..bounds import components as parse_components  # noqa: F401 (re-exported)
from ..capture.hooks import calls_function
from ..capture.intervene import intervening
from ..capture.swapped import reference_agrees
from ..errors import UnsupportedAnalysisError
from .attribution import correlation
from .pairs import EncodedPairs
from .patch_full import last_logit_diffs, model_inputs, positions
from .patch_layers import checked, recording_pass, reentering, reentry_refusal
from .patching import normalise


@dataclass(frozen=True)
class Component:
    """Where one component is read and written.

    Attributes:
        name: ``z``, ``q``, ``k``, ``v``, ``pattern``, ``resid`` or ``mlp``.
        point: the intervention point (:data:`probe.capture.interface.POINTS`), or None (``resid``,
            ``mlp``: module hooks).
        unit_axis: the tensor's head axis, or None (one unit per layer).
        pos_axis: the tensor's position axis (query rows for ``pattern``).
    """

    name: str
    point: str | None
    unit_axis: int | None
    pos_axis: int


COMPONENTS = {c.name: c for c in (
    Component("z", "output", 2, 1), Component("q", "query", 1, 2), Component("k", "key", 1, 2),
    Component("v", "value", 1, 2), Component("pattern", "pattern", 1, 2), Component("resid", None, None, 1),
    Component("mlp", None, None, 1))}


def units(lm, name: str) -> tuple[int, str]:
    """(units per layer, their kind): query heads (``head``), key/value heads (``kv_head``, where the
    model groups them) or one per layer (``layer``)."""
    comp = COMPONENTS[name]
    if comp.unit_axis is None:
        return 1, "layer"
    g = lm.geometry
    if name in ("k", "v") and g.n_kv_heads != g.n_heads:
        return g.n_kv_heads, "kv_head"
    return g.n_heads, "head"


def check_components(lm, names) -> None:
    """Raises UnsupportedAnalysisError where a component cannot be patched on ``lm``: anything but ``z``
    on an encoder-decoder model, on a model that does not call transformers' attention interface and
    that probe's reference module (which calls probe's function; swapped in by
    :func:`probe.capture.intervene.intervening`) does not reproduce (its q, k, v and pattern do not
    exist apart), or on one whose blocks or MLPs are not one per layer."""
    other = [n for n in names if n != "z"]
    if not other:
        return
    if lm.kind == "encoder-decoder":
        raise UnsupportedAnalysisError(f"{lm.name} is an encoder-decoder model: probe patches only its heads' "
                                       f"output z, not {', '.join(other)}")
    heads = [n for n in other if COMPONENTS[n].point is not None]
    if heads and not (calls_function(lm) or reference_agrees(lm)):
        raise UnsupportedAnalysisError(f"{type(lm.model).__name__} does not call transformers' attention "
                                       "interface, and probe's reference module does not reproduce it as it runs: "
                                       f"its heads' {', '.join(heads)} cannot be patched (only z)")
    if "mlp" in other and any(block_mlp(lm.model, lm.spec, s) is None for s in lm.sites):
        raise UnsupportedAnalysisError(f"{lm.name}: probe's spec of {type(lm.model).__name__} names no module whose "
                                       "output is the MLP's alone (a BERT-style block adds the residual and norms it "
                                       "inside the MLP's output module), so there is no MLP output to patch")
    if {"resid", "mlp"} & set(other):
        blocks = {id(site_block(lm.model, lm.spec, s)) for s in lm.sites}
        if len(blocks) != len(lm.sites):
            raise UnsupportedAnalysisError(f"{lm.name} shares its blocks between layers: no residual stream or "
                                           "MLP output per layer to patch")


def install(iv, lm, name: str, fn) -> None:
    """Register ``fn(i, tensor) -> tensor`` at component ``name`` of every layer ``i`` (site order) on the
    :class:`~probe.capture.intervene.Intervention` ``iv``: what it returns is what the model goes on with."""
    comp = COMPONENTS[name]
    if comp.point is not None:
        index = {site: i for i, site in enumerate(lm.sites)}
        iv.edit(comp.point, lambda site: (lambda t, call, i=index[site]: fn(i, t)))
        return
    for i, site in enumerate(lm.sites):
        if name == "resid":
            iv.before(site_block(lm.model, lm.spec, site), lambda a, kw, i=i: _on_input(a, kw, lambda t: fn(i, t)))
        else:
            iv.after(block_mlp(lm.model, lm.spec, site), lambda out, i=i: _on_output(out, lambda t: fn(i, t)))


def _on_input(args: tuple, kwargs: dict, fn) -> tuple:
    """A block's (args, kwargs) with its hidden states (first argument, or ``hidden_states``) mapped by ``fn``."""
    if args:
        return (fn(args[0]), *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}


def _on_output(output, fn):
    """An MLP's output (a tensor, or a tuple whose first item is one) mapped by ``fn``."""
    return fn(output) if torch.is_tensor(output) else (fn(output[0]), *output[1:])


def to_layout(sel: torch.Tensor, name: str, like: torch.Tensor) -> torch.Tensor:
    """A [batch, units, pos] selection laid out as component ``name``'s tensor ``like`` (broadcastable)."""
    comp = COMPONENTS[name]
    if comp.unit_axis is None:
        out = sel[:, 0]  # [batch, pos]
    elif comp.unit_axis == 2:
        out = sel.transpose(1, 2)  # [batch, pos, units]
    else:
        out = sel  # [batch, units, pos]
    return out.reshape(*out.shape, *([1] * (like.dim() - out.dim()))).to(like.device)


def per_unit(t: torch.Tensor, name: str) -> torch.Tensor:
    """[batch, units, pos]: ``t`` (component ``name``'s layout) summed over its other axes."""
    comp = COMPONENTS[name]
    if comp.unit_axis is None:
        return t.sum(tuple(range(2, t.dim())))[:, None]
    if comp.unit_axis == 2:
        return t.sum(tuple(range(3, t.dim()))).transpose(1, 2)
    return t.sum(tuple(range(3, t.dim())))


def _metric(lm, enc: EncodedPairs, inputs: dict, name: str, fn, copies: int, at: bool = False):
    """[copies, pairs] LD of one pass with ``fn`` installed at ``name`` (float64); ``at``: (LD, [copies *
    pairs, vocab] the metric-position logits)."""
    with intervening(lm) as iv:
        install(iv, lm, name, fn)
        logits = lm.model(**inputs).logits
    rows = torch.arange(copies * len(enc), device=logits.device)
    last = logits[rows, enc.last.repeat(copies).to(logits.device)]
    ld = last_logit_diffs(last, enc, copies)
    return (ld, last) if at else ld


def record(store: dict):
    """An ``fn`` for :func:`install` storing each layer's tensor (detached) and returning it unchanged."""
    def fn(i, t):
        store[i] = t.detach()
        return t
    return fn


@torch.no_grad()
def component_logit_diffs(lm, enc: EncodedPairs, name: str, jobs: list, *, run: str, donor: str,
                          per_pass: int, progress=None) -> tuple[np.ndarray, np.ndarray, dict]:
    """LD of patched runs, one per job (layer index, unit, ``all`` or ``last``), by passes of ``per_pass``
    copies; as :func:`~probe.effects.patch_layers.layer_head_logit_diffs` for any component: each pass
    re-enters the unpatched run at the lowest layer it patches where the model allows it
    (:func:`~probe.effects.patch_layers.reentry_refusal`, checked per run), else whole passes, the same
    numbers.

    Returns:
        ``(ld_patched [jobs], ld_base [jobs], means)``: ``means`` the clean and corrupted runs' mean LD.
    """
    k = max(1, min(per_pass, len(jobs)))
    ids = {"clean": enc.clean, "corrupted": enc.corrupted}
    inputs = {n: model_inputs(lm, enc, ids[n], k) for n in ids}
    same = lambda i, t: t  # noqa: E731
    lds = {n: _metric(lm, enc, inputs[n], name, same, k) for n in ids if n != run}
    recorded = None
    if reentry_refusal(lm) is None:
        (lds[run], at), recorded, _ = recording_pass(lm, k, len(enc),
                                                     lambda: _metric(lm, enc, inputs[run], name, same, k, at=True))
        if recorded is not None:
            recorded = checked(lm, recorded, at, lambda: _metric(lm, enc, inputs[run], name, same, k, at=True)[1])[0]
    else:
        lds[run] = _metric(lm, enc, inputs[run], name, same, k)
    means = {n: float(v[0].mean()) for n, v in lds.items()}
    base = lds[run].mean(1).numpy()
    values: dict = {}
    _metric(lm, enc, inputs[donor], name, record(values), k)  # the same pass shape: exact own values
    U = units(lm, name)[0]
    patched, bases = np.zeros(len(jobs)), np.zeros(len(jobs))
    for s in range(0, len(jobs), k):
        chunk = list(range(s, min(s + k, len(jobs))))
        sels: dict = {}
        for c, j in enumerate(chunk):
            i, unit, where = jobs[j]
            pos = positions(lm, enc, i, where)
            sel = sels.setdefault(i, torch.zeros(k * len(enc), U, pos.shape[1], dtype=torch.bool))
            sel[c * len(enc):(c + 1) * len(enc), unit] = pos

        def patch(i, t, sels=sels):
            if i not in sels:
                return t
            return torch.where(to_layout(sels[i], name, t), values[i].to(t.dtype), t)
        with reentering(lm, recorded, min(jobs[j][0] for j in chunk)):  # blocks below it: the recorded run
            patched[chunk] = _metric(lm, enc, inputs[run], name, patch, k).mean(1).numpy()[: len(chunk)]
        bases[chunk] = base[: len(chunk)]
        if progress:
            progress(chunk[-1] + 1, len(jobs))
    return patched, bases, means


def _frame(lm, name: str, columns: dict) -> pd.DataFrame:
    U, kind = units(lm, name)
    S = len(lm.sites)
    head = np.tile(np.arange(U), S) if kind != "layer" else np.full(S, -1)
    return pd.DataFrame({"component": name, "unit": kind, "stack": np.repeat([s.stack for s in lm.sites], U),
                         "kind": np.repeat([s.kind for s in lm.sites], U),
                         "layer": np.repeat([s.layer for s in lm.sites], U), "head": head, **columns})


def patch_component(lm, enc: EncodedPairs, name: str, *, direction: str = "denoise", per_pass: int | None = None,
                    progress=None) -> pd.DataFrame:
    """Activation patching of one component, every unit, all real positions and the metric's.

    Args:
        lm: a model :func:`~probe.effects.patching.patch_heads` patches (one stack; see
            :func:`check_components`).
        enc: the encoded pairs.
        name: a key of :data:`COMPONENTS`.
        direction: ``denoise`` or ``noise``.
        per_pass: patched copies of the batch per forward pass (default 2 x units).
        progress: a callable ``(done, total)`` or None.

    Returns:
        One row per unit: ``component``, ``unit`` (``head``, ``kv_head`` or ``layer``), ``stack``,
        ``kind``, ``layer``, ``head`` (-1 for a layer), ``effect``, ``effect_last``, ``raw``, ``raw_last``
        (as :func:`~probe.effects.patching.patch_heads`); ``attrs``: ``ld_clean``, ``ld_corrupted``,
        ``normalized``.

    Raises:
        UnsupportedAnalysisError: :func:`check_components`.
    """
    check_components(lm, [name])
    U = units(lm, name)[0]
    S = len(lm.sites)
    jobs = [(i, u, where) for i in range(S) for where in ("all", "last") for u in range(U)]
    run, donor = ("corrupted", "clean") if direction == "denoise" else ("clean", "corrupted")
    ld_p, ld_base, means = component_logit_diffs(lm, enc, name, jobs, run=run, donor=donor,
                                                 per_pass=per_pass or 2 * U, progress=progress)
    raw = (ld_p - ld_base).reshape(S, 2, U).transpose(1, 0, 2)  # [where, layers, units]
    effect, normalized = normalise(raw, means["clean"] - means["corrupted"], direction)
    frame = _frame(lm, name, {"effect": effect[0].ravel(), "effect_last": effect[1].ravel(),
                              "raw": raw[0].ravel(), "raw_last": raw[1].ravel()})
    frame.attrs.update(ld_clean=means["clean"], ld_corrupted=means["corrupted"], normalized=normalized)
    return frame


def attribute_component(lm, enc: EncodedPairs, name: str, direction: str = "denoise") -> pd.DataFrame:
    """Attribution patching of one component, every unit (module docstring): one pass of the donor,
    one forward and backward pass of the run; parameters' ``requires_grad``, training flags and hooks
    restored afterwards.

    Returns:
        One row per unit as :func:`patch_component`'s, with ``attribution``, ``attribution_last``,
        ``attribution_raw``, ``attribution_raw_last`` (estimates of LD_patched - LD_run, logits).
    """
    check_components(lm, [name])
    run, donor = (enc.corrupted, enc.clean) if direction == "denoise" else (enc.clean, enc.corrupted)
    donor_values: dict = {}
    with torch.no_grad():
        ld_donor = float(_metric(lm, enc, model_inputs(lm, enc, donor), name, record(donor_values), 1).mean())
    leaves, run_values = {}, {}

    def lead(i, t):
        run_values[i] = t.detach()
        leaves[i] = torch.zeros_like(t, requires_grad=True)
        return t + leaves[i]

    with intervening(lm) as iv, torch.enable_grad():
        for p in lm.model.parameters():
            p.requires_grad_(False)
        install(iv, lm, name, lead)
        logits = lm.model(**model_inputs(lm, enc, run)).logits
        rows = torch.arange(len(enc), device=logits.device)
        at = logits[rows, enc.last.to(logits.device)]
        ld = (at[rows, enc.answer.to(at.device)] - at[rows, enc.wrong.to(at.device)]).mean()
        order = sorted(leaves)
        grads = dict(zip(order, torch.autograd.grad(ld, [leaves[i] for i in order])))
    U, S = units(lm, name)[0], len(lm.sites)
    raw = np.zeros((2, S, U))
    for i in range(S):
        prod = per_unit(((donor_values[i] - run_values[i]) * grads[i]).double(), name)  # [pairs, units, pos]
        for w, where in enumerate(("all", "last")):
            raw[w, i] = (prod * positions(lm, enc, i, where).to(prod.device)[:, None]).sum((0, 2)).cpu().numpy()
    ld_run = float(ld.detach())
    ld_clean, ld_corr = (ld_donor, ld_run) if direction == "denoise" else (ld_run, ld_donor)
    effect, normalized = normalise(raw, ld_clean - ld_corr, direction)
    frame = _frame(lm, name, {"attribution": effect[0].ravel(), "attribution_last": effect[1].ravel(),
                              "attribution_raw": raw[0].ravel(), "attribution_raw_last": raw[1].ravel()})
    frame.attrs.update(ld_clean=ld_clean, ld_corrupted=ld_corr, normalized=normalized)
    return frame


def measure_components(lm, enc: EncodedPairs, names, z: pd.DataFrame, *, direction: str = "denoise",
                       attribution: bool = False, say=None) -> pd.DataFrame:
    """Every component of ``names`` patched (and attributed when ``attribution``), one frame.

    Args:
        names: keys of :data:`COMPONENTS`; ``z`` is taken from ``z``, the frame
            :func:`~probe.effects.patching.patch_heads` measured (with the ``attribution`` columns of
            :func:`~probe.effects.patch_run.measure` when ``attribution``).
        say: a callable given one line as each component ends, or None.

    Returns:
        The rows of :func:`patch_component` for each component in order (with the attribution columns
        when ``attribution``); ``attrs["correlations"]``: component -> ``correlation``,
        ``correlation_last`` of attribution against activation patching over its units (with
        ``attribution``).

    Raises:
        UnsupportedAnalysisError: :func:`check_components`.
    """
    check_components(lm, names)
    frames = []
    for name in names:
        if name == "z":
            frame = z.copy()
            frame.insert(0, "unit", "head")
            frame.insert(0, "component", "z")
        else:
            frame = patch_component(lm, enc, name, direction=direction)
            if attribution:
                attr = attribute_component(lm, enc, name, direction)
                for col in ("attribution", "attribution_last", "attribution_raw", "attribution_raw_last"):
                    frame[col] = attr[col].to_numpy()
        frames.append(frame)
        if say is not None:
            say(f"component {name}: {len(frame)} units patched")
    out = pd.concat(frames, ignore_index=True)
    if attribution:
        out.attrs["correlations"] = {
            f["component"].iloc[0]: {"correlation": correlation(f["effect"], f["attribution"]),
                                     "correlation_last": correlation(f["effect_last"], f["attribution_last"])}
            for f in frames}
    return out
