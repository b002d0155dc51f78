"""Attribution patching per head (Nanda 2023, "Attribution Patching"; Syed et al. 2023): the first-order
estimate of activation patching, for every head at once from one forward and one backward pass.

For head h's output z_h (its slice of the output projection's input, the point activation patching
patches, :mod:`.patching`): attr_h = sum over positions and features of (z_h^donor - z_h^run) * dLD/dz_h,
the gradient taken in the patched run at its own activations. Denoising (default): the run is the
corrupted one and the donor the clean one; noising: the reverse. It estimates LD_patched - LD_run and
is normalised as activation patching is (:func:`~probe.effects.patching.normalise`). All real positions,
or the metric's position only (``attribution_last``). Where LD is near-linear in z_h the two agree;
the report gives their correlation over the heads.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..architectures import site_outputs
from ..capture.hooks import measuring
from .pairs import EncodedPairs
from .patch_full import model_inputs, positions
from .patching import normalise


def _pass(lm, enc: EncodedPairs, ids: torch.Tensor, leaves: list | None) -> tuple[torch.Tensor, list]:
    """One pass on ``ids``: (LD mean over pairs, every site's z [pairs, T, heads * d_head]); with
    ``leaves`` (a list to fill) each site's z has a zero tensor added whose gradient is dLD/dz."""
    zs = []

    def hook(module, args):
        zs.append(args[0].detach())
        if leaves is None:
            return None
        leaf = torch.zeros_like(args[0], requires_grad=True)
        leaves.append(leaf)
        return (args[0] + leaf, *args[1:])

    with measuring(lm.model, eager=False) as m:
        for p in lm.model.parameters():
            p.requires_grad_(False)
        for _, o in site_outputs(lm.model, lm.spec):
            m.hooks.forward_pre(o, hook)
        with torch.set_grad_enabled(leaves is not None):
            logits = lm.model(**model_inputs(lm, enc, ids)).logits
            rows = torch.arange(len(enc), device=logits.device)
            at = logits[rows, enc.last.to(logits.device)]
            ld = at[rows, enc.answer.to(at.device)] - at[rows, enc.wrong.to(at.device)]
    return ld.mean(), zs


def attribute_heads(lm, enc: EncodedPairs, direction: str = "denoise") -> pd.DataFrame:
    """Attribution patching of every head's z_h (module docstring).

    Args:
        lm: a model :func:`~probe.effects.patching.patch_heads` patches.
        enc: the encoded pairs.
        direction: ``denoise`` (the corrupted run, clean z_h) or ``noise``.

    Returns:
        One row per head of every site: ``stack``, ``kind``, ``layer``, ``head``, ``attribution`` (all
        positions), ``attribution_last`` (the metric's position), ``attribution_raw``,
        ``attribution_raw_last`` (estimates of LD_patched - LD_run, logits). ``attrs``: ``ld_clean``,
        ``ld_corrupted``, ``normalized``.
    """
    run, donor = (enc.corrupted, enc.clean) if direction == "denoise" else (enc.clean, enc.corrupted)
    ld_donor, donor_z = _pass(lm, enc, donor, None)
    leaves: list = []
    ld_run, run_z = _pass(lm, enc, run, leaves)
    grads = torch.autograd.grad(ld_run, leaves)
    H, d = lm.geometry.n_heads, lm.geometry.d_head
    raw = np.zeros((2, len(lm.sites), H))
    for i, (a, b, g) in enumerate(zip(donor_z, run_z, grads)):
        prod = ((a - b) * g).reshape(*a.shape[:2], H, d).sum(-1).double()  # [pairs, T, heads]
        for w, where in enumerate(("all", "last")):
            keep = positions(lm, enc, i, where).to(prod.device)
            raw[w, i] = (prod * keep[..., None]).sum((0, 1)).cpu().numpy()
    ld_donor, ld_run_value = float(ld_donor), float(ld_run.detach())
    ld_clean, ld_corr = (ld_donor, ld_run_value) if direction == "denoise" else (ld_run_value, ld_donor)
    effect, normalized = normalise(raw, ld_clean - ld_corr, direction)
    S = len(lm.sites)
    frame = pd.DataFrame({"stack": np.repeat([s.stack for s in lm.sites], H),
                          "kind": np.repeat([s.kind for s in lm.sites], H),
                          "layer": np.repeat([s.layer for s in lm.sites], H), "head": np.tile(np.arange(H), S),
                          "attribution": effect[0].ravel(), "attribution_last": effect[1].ravel(),
                          "attribution_raw": raw[0].ravel(), "attribution_raw_last": raw[1].ravel()})
    frame.attrs.update(ld_clean=ld_clean, ld_corrupted=ld_corr, normalized=normalized)
    return frame


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two per-unit columns (NaN when either is constant, or with fewer than 3
    units, where it is +-1 whatever the values: Falcon's one key/value head a layer)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])
