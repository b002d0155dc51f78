"""Attention rollout: which input tokens reach a position through every layer of a stack.

One layer's attention map says where a head reads from, not which *input* tokens end up in a
position after all layers: the residual stream carries each position's own state forward, and
later layers read mixtures made by earlier ones. Attention rollout (Abnar & Zuidema 2020,
"Quantifying Attention Flow in Transformers", ACL, sec. 3) follows the mixing through the stack:

- per layer l = 1..L of one stack, average the heads and add the residual as an equal share:
  ``A~_l = 0.5 * mean_h(A_l) + 0.5 * I``, rows renormalised to sum to 1;
- multiply from the first layer up: ``R_0 = I``, ``R_l = A~_l R_{l-1}``, so
  ``R = A~_L A~_{L-1} ... A~_1`` (the order matters: the last layer is applied last);
- ``R[i, j]`` is the share of position i's final state that comes from input token j; each row
  sums to 1, and a causal stack keeps its lower triangle (a product of lower-triangular maps).

Only real tokens enter: every map is cut to the sequence's own tokens before anything is
averaged, so padding in a batch changes nothing. Encoder-decoder models: rollout runs over the
encoder's self-attention only (it is not defined through cross-attention, which mixes two
sequences); the result says so in ``notes``. Models whose heads were physically removed
(``lm.pruned``) average over the heads still present in each layer; a layer with none left adds
nothing to the residual stream, so its ``A~`` is the identity.

The reported row is the position a classifier or a next-token prediction reads: row 0 ([CLS],
``<s>``, or the first token) for encoders and encoder-decoder models' encoders, the last real
token for decoders. Attention flow, the max-flow variant on the same layered maps, is
:mod:`probe.measures.flow`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..capture.maps import attention_hooks, encode, forward
from ..loading.models import LoadedModel
from ..text.inputs import Batch, Text, as_texts
from ..text.tokens import display_tokens


@dataclass
class Attribution:
    """How much of each position comes from each input token, for one sequence.

    Attributes:
        method: ``"rollout"`` or ``"flow"``.
        tokens: display labels of the sequence's real tokens (the labels reports and views use).
        matrix: [T, T] float64; row i = share of position i that comes from each input token j
            (rows sum to 1; a causal stack has exact zeros above the diagonal). Flow computed for
            the reported row only (``rows="reported"``) leaves the other rows NaN.
        row_index: the reported position: 0 for encoders (and encoder-decoder encoders), the last
            real token for decoders.
        stack: the stack the layers come from, ``"encoder"`` or ``"decoder"``.
        sites: names of the sites multiplied, first layer first (``encoder.0.self`` ...).
        notes: what the user should know (encoder stack only, heads averaged over fewer heads ...).
        raw: flow only: [T, T] maximum-flow values before the per-row normalisation (at most 1:
            a position's outgoing capacity in the last layer sums to 1); None for rollout.
    """

    method: str
    tokens: list[str]
    matrix: np.ndarray
    row_index: int
    stack: str
    sites: list[str]
    notes: list[str] = field(default_factory=list)
    raw: np.ndarray | None = None

    @property
    def row(self) -> np.ndarray:
        """[T] the reported row: ``matrix[row_index]``."""
        return self.matrix[self.row_index]

    @property
    def token(self) -> str:
        """Display label of the reported position."""
        return self.tokens[self.row_index]

    def top(self, k: int = 5) -> list[tuple[int, str, float]]:
        """The ``k`` input tokens with the largest share in the reported row: (position, label, share)."""
        order = np.argsort(-self.row, kind="stable")[:k]
        return [(int(j), self.tokens[j], float(self.row[j])) for j in order]


@dataclass
class StackMaps:
    """The residual-mixed maps of one sequence's stack, ready for rollout or flow.

    Attributes:
        tilde: [L, T, T] float64, ``A~_l`` for l = 1..L (index 0 is the first layer).
        tokens, row_index, stack, sites, notes: as :class:`Attribution`.
        weights: [L, T, T] float64, the attention weights ``mean_h A_l`` (heads present; NaN for a
            layer with every head removed), what the maps were built from.
    """

    tilde: np.ndarray
    tokens: list[str]
    row_index: int
    stack: str
    sites: list[str]
    notes: list[str]
    weights: np.ndarray | None = None

    def attribution(self, method: str, matrix: np.ndarray, raw: np.ndarray | None = None) -> Attribution:
        return Attribution(method, self.tokens, matrix, self.row_index, self.stack, self.sites,
                           list(self.notes), raw)


def head_means(probs: np.ndarray) -> np.ndarray:
    """``mean_h A_l`` per layer over the heads present (a head NaN everywhere in a layer is a removed
    head); NaN for a layer with no head left.

    Args:
        probs: [L, heads, T, T] attention probabilities, layer 1 first.

    Returns:
        [L, T, T] float64.
    """
    probs = np.asarray(probs, dtype=np.float64)
    L, _, T, _ = probs.shape
    out = np.full((L, T, T), np.nan)
    for layer in range(L):
        present = ~np.isnan(probs[layer]).all(axis=(-2, -1))
        if present.any():
            out[layer] = probs[layer][present].mean(axis=0)
    return out


def residual_maps(probs: np.ndarray) -> np.ndarray:
    """``A~_l = 0.5 * mean_h(A_l) + 0.5 * I`` per layer, rows renormalised to sum to 1.

    Args:
        probs: [L, heads, T, T] attention probabilities of one sequence's real tokens, layer 1
            first. A head that is NaN everywhere in a layer (a removed head) is left out of that
            layer's mean; a layer with no head left gets ``A~ = I``.

    Returns:
        [L, T, T] float64.
    """
    means = head_means(probs)
    eye = np.eye(means.shape[-1])
    out = np.empty(means.shape)
    for layer, mean in enumerate(means):
        mixed = 0.5 * (eye if np.isnan(mean).all() else mean) + 0.5 * eye
        out[layer] = mixed / mixed.sum(axis=-1, keepdims=True)
    return out


def rollout_matrix(tilde: np.ndarray) -> np.ndarray:
    """``R = A~_L ... A~_1`` (``R_0 = I``, ``R_l = A~_l R_{l-1}``) from [L, T, T] maps, layer 1 first.

    Returns:
        [T, T] float64; rows sum to 1 when every ``A~_l``'s rows do.
    """
    tilde = np.asarray(tilde, dtype=np.float64)
    out = np.eye(tilde.shape[-1])
    for layer in range(tilde.shape[0]):
        out = tilde[layer] @ out
    return out


def stack_of(lm: LoadedModel) -> tuple[str, bool]:
    """(stack rollout runs over, whether the model is encoder-decoder): the encoder for encoders
    and encoder-decoder models, the decoder for decoder-only models."""
    stacks = {s.stack for s in lm.sites}
    if len(stacks) > 1:
        return "encoder", True
    return next(iter(stacks)), False


def encode_for_stack(lm: LoadedModel, texts: Sequence[str | Text], max_length: int | None) -> Batch:
    """Tokenize texts into one right-padded batch. Encoder-decoder models need a target to run;
    rollout reads only the encoder, whose maps do not depend on it, so a missing target is empty.

    Raises:
        InputError: as :func:`probe.capture.maps.encode`.
    """
    items = as_texts(texts)
    if stack_of(lm)[1]:
        items = [t if t.target is not None or t.pair is not None else replace(t, target="") for t in items]
    return encode(lm, items, max_length)


@torch.no_grad()
def stack_maps(lm: LoadedModel, batch: Batch) -> list[StackMaps]:
    """Run one batch and build each sequence's ``A~`` maps (:func:`residual_maps`) of the stack
    rollout and flow run over, cut to the sequence's real tokens.

    Raises:
        CaptureError: a site returned no attention probabilities.
    """
    stack, enc_dec = stack_of(lm)
    sites = [s for s in lm.sites if s.stack == stack and s.kind == "self"]
    wanted = set(sites)
    maps: dict = {}

    def keep(site, probs):
        if site in wanted:
            if lm.pruned is not None:
                probs = lm.pruned.expand(site.layer, probs)
            maps[site] = probs.float().cpu()

    with attention_hooks(lm, keep):
        forward(lm, batch)
    notes = []
    if enc_dec:
        notes.append(f"encoder-decoder model: the encoder stack only ({len(sites)} layers); rollout and flow "
                     "are not defined through cross-attention, so the decoder is left out")
    out = []
    for r, n in enumerate(batch.lengths.tolist()):
        probs = np.stack([maps[s][r, :, :n, :n].double().numpy() for s in sites])
        out.append(StackMaps(residual_maps(probs), _labels(lm, batch, r, n), n - 1 if stack == "decoder" else 0,
                             stack, [s.name for s in sites], notes + _pruned_notes(probs), head_means(probs)))
    return out


def _labels(lm: LoadedModel, batch: Batch, r: int, n: int) -> list[str]:
    t = batch.texts[r]
    full = t.text if t.pair is None else t.text + " " + t.pair  # a sentence pair (targets live in batch.target)
    return display_tokens(lm.tokenizer, full, batch.input_ids[r, :n].tolist(),
                          [tuple(o) for o in batch.offsets[r, :n].tolist()], batch.special[r, :n].tolist())


def _pruned_notes(probs: np.ndarray) -> list[str]:
    present = ~np.isnan(probs).all(axis=(-2, -1))  # [L, heads]
    out = []
    for layer, row in enumerate(present):
        if not row.all():
            out.append(f"L{layer}: mean over the {int(row.sum())} of {row.size} heads present (removed heads "
                       "left out)" if row.any() else f"L{layer}: every head removed, A~ = I (residual only)")
    return out


def attention_rollout(lm: LoadedModel, text: str | Text | Sequence[str | Text], *,
                      max_length: int | None = None) -> Attribution | list[Attribution]:
    """Attention rollout of a text (or of each text of a list, run as one padded batch).

    ``R = A~_L ... A~_1`` with ``A~_l = 0.5 * mean_h(A_l) + 0.5 * I`` (rows renormalised), over
    the encoder's layers (encoders, encoder-decoder models) or the decoder's (decoder-only
    models); Abnar & Zuidema 2020, sec. 3 (``compute_joint_attention`` of their code). Cost: one
    forward pass and L products of [T, T] matrices.

    Args:
        lm: a loaded model.
        text: a string or :class:`~probe.text.inputs.Text`, or a list of them.
        max_length: token limit per text (default: the model's limit).

    Returns:
        An :class:`Attribution` (a list of them for a list of texts): ``.matrix`` [T, T] over the
        text's real tokens, ``.row`` the reported row (position ``.row_index``), ``.tokens``.

    Raises:
        InputError: an empty text or list, max_length below 2. CaptureError: no attention
            probabilities from a site.
    """
    single = isinstance(text, (str, Text))
    batch = encode_for_stack(lm, [text] if single else list(text), max_length)
    out = [m.attribution("rollout", rollout_matrix(m.tilde)) for m in stack_maps(lm, batch)]
    return out[0] if single else out
