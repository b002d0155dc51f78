"""Deliberately broken variants of :class:`ReferenceAttention`, one overridden step each.

``probe verify --mutant NAME`` swaps one of these in to show that verification catches the classic
bugs of hand-written attention (inverted causal mask, no transpose, 1/sqrt(d_model)): each must FAIL wherever it
changes anything. Production code takes no test-only parameters; the bug lives only here.
"""

from __future__ import annotations

import torch

from ...architectures import ALIBI, DISENTANGLED, FALCON_ALIBI, get_spec, head_geometry
from ...architectures.disentangled import position_terms
from ...errors import InputError, ProbeError
from .module import ReferenceAttention


class ScaleDModel(ReferenceAttention):
    """Scores scaled by 1/sqrt(d_model) instead of 1/sqrt(d_head); GPT-2's 1/(layer + 1) kept."""

    mutant = "scale-d-model"

    def score_scale(self) -> float:
        rule = self.spec.scaling
        per_layer = rule(self.config, self.d_head, self.layer_idx) / rule(self.config, self.d_head, 0)
        return self.d_model ** -0.5 * per_layer


class NoScale(ReferenceAttention):
    """Scores not scaled at all."""

    mutant = "no-scale"

    def score_scale(self) -> float:
        return 1.0


class NoPaddingMask(ReferenceAttention):
    """Padding keys not masked."""

    mutant = "no-padding-mask"

    def padding_mask(self, padding):
        return None


class NoCausalMask(ReferenceAttention):
    """Decoder queries see future tokens (no causal mask)."""

    mutant = "no-causal-mask"

    def causal_mask(self, n_query, n_key, device):
        return None


class CausalInverted(ReferenceAttention):
    """A boolean causal mask with inverted polarity: queries see only the future."""

    mutant = "causal-inverted"

    def causal_mask(self, n_query, n_key, device):
        right = super().causal_mask(n_query, n_key, device)
        return None if right is None else ~right


class MergeWithoutTranspose(ReferenceAttention):
    """Heads merged with a reshape of [batch, heads, T, d_head], no transpose."""

    mutant = "merge-without-transpose"

    def merge(self, y: torch.Tensor) -> torch.Tensor:
        B, nh, T, hs = y.shape
        return y.reshape(B, T, nh * hs)  # mixes tokens and heads


class AlibiSign(ReferenceAttention):
    """ALiBi's bias added with the wrong sign: distant keys favoured instead of penalised."""

    mutant = "alibi-sign"
    alibi_sign = -1.0


class C2pSign(ReferenceAttention):
    """DeBERTa's content-to-position term read at j - i instead of i - j (the relative position's sign flipped)."""

    mutant = "c2p-sign"
    c2p_sign = -1


#: name -> (what is wrong, the class).
MUTANTS: dict[str, tuple[str, type[ReferenceAttention]]] = {
    cls.mutant: (cls.__doc__.strip().splitlines()[0], cls)
    for cls in (ScaleDModel, NoScale, NoPaddingMask, NoCausalMask, MergeWithoutTranspose, CausalInverted,
                AlibiSign, C2pSign)
}

_CAUSAL = ("no-causal-mask", "causal-inverted")


def mutant_class(name: str | None) -> type[ReferenceAttention]:
    """The module class of a mutant (``ReferenceAttention`` for None).

    Raises:
        ProbeError: unknown mutant name.
    """
    if name is None:
        return ReferenceAttention
    if name not in MUTANTS:
        raise ProbeError(f"unknown mutant {name!r}; choose from {', '.join(MUTANTS)}")
    return MUTANTS[name][1]


def check_mutant(name: str | None) -> str | None:
    """A mutant name from :data:`MUTANTS` (or None), checked before a model is loaded.

    Raises:
        InputError: an unknown name (the message lists the known ones).
    """
    if name is not None and name not in MUTANTS:
        raise InputError(f"unknown mutant {name!r}; choose from {', '.join(MUTANTS)}")
    return name


def mutant_applies(name: str, model_or_lm) -> tuple[bool, str]:
    """Whether a mutant changes anything on this architecture, and why not if it does not.

    Causal mutants apply to decoders only; ``no-scale`` needs a model whose scale is not 1
    (GPT-2 with ``scale_attn_weights=False`` and no per-layer scaling has none).

    Raises:
        ProbeError: unknown mutant name.
    """
    mutant_class(name)
    model = getattr(model_or_lm, "model", model_or_lm)
    config = model.config
    spec = get_spec(config)
    if name in _CAUSAL and not any(s.causal for s in spec.site_specs):
        return False, f"{name} applies to decoders only"
    alibi = spec.position_bias is ALIBI or (spec.position_bias is FALCON_ALIBI and getattr(config, "alibi", False))
    if name == "alibi-sign" and not alibi:
        return False, "the model has no ALiBi bias"
    if name == "c2p-sign" and (spec.position_bias is not DISENTANGLED or "c2p" not in position_terms(config)
                               or not getattr(config, "relative_attention", False)):
        return False, "the model has no content-to-position term (DeBERTa's c2p)"
    if name == "no-scale":
        geo = head_geometry(config)
        if all(spec.scaling(config, geo.d_head, i) == 1.0 for i in range(geo.n_layers)):
            return False, "the model does not scale its scores"
    return True, ""
