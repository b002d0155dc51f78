"""Ablation effects of every head and of every label group, on held-out text: :func:`head_effects`.

The corpus is split as ``probe prune`` splits it (:func:`probe.pruning.split_corpus`, seed 0): the
reference half gives the heads' means (mean ablation), the held-out half every effect. effect =
objective(ablated) - objective(clean) in the objective's units (> 0: the model got worse), the
objective being ``probe prune``'s (:mod:`probe.pruning.objectives`): ``clm`` nats per predicted
token, ``mlm`` nats per masked token, ``fidelity`` 1 - cosine of the mean-pooled last hidden state.

Cost: one held-out pass per ablation set and kind: L x H heads x 2 kinds, plus (1 + seeds) sets per
label and kind; ``copies`` sets share one forward pass (the batch repeated along its batch
dimension), which saves per-pass overhead, not arithmetic.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from .. import validate
from ..analysis import AnalysisResult, analyze
from ..inputs import Text, as_texts, iter_batches
from ..patterns import CircuitProbe, circuit_probe
from ..pruning.curves import ZERO_WITHIN
from ..pruning.experiment import split_corpus
from ..pruning.objectives import default_objective, make_objective
from ..sites import head_name
from ..util import progress_bar
from .ablation import KINDS, ablating, check_model, head_means, sequence_losses, unit_counts
from .groups import BOOTSTRAP, SEEDS, head_groups, label_groups, paired_bootstrap, random_sets, t_interval, verdict

#: Columns of effects.csv after ``stack``, ``kind``, ``layer``, ``head``.
EFFECT_COLUMNS = tuple(f"effect_{k}{s}" for k in KINDS for s in ("", "_low", "_high"))
#: Columns of label_effects.csv.
LABEL_COLUMNS = ("label", "ablation", "n_heads", "effect", "effect_low", "effect_high", "random_mean", "random_std",
                 "random_low", "random_high", "verdict", "heads")


@dataclass
class EffectsResult:
    """What :func:`head_effects` measured.

    Attributes:
        heads: effects.csv: one row per head: ``stack``, ``kind``, ``layer``, ``head``, then
            ``effect_zero``, ``effect_mean`` and their 95% bootstrap ``_low`` / ``_high``.
        labels: label_effects.csv: one row per (label or head group, ablation kind), :data:`LABEL_COLUMNS`.
        objective, objective_reason, unit: what was measured and why.
        clean: the objective of the clean model on the held-out half.
        split: sizes and seed of the reference and held-out halves.
        means: [layers, P, heads, d_head] the heads' means (:func:`~probe.effects.ablation.head_means`).
        settings, timings, notes: the run's arguments, phase seconds, what the user should know.
    """

    heads: pd.DataFrame
    labels: pd.DataFrame
    objective: str
    objective_reason: str
    unit: str
    clean: float
    split: dict
    means: torch.Tensor
    settings: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    induction: dict | None = None

    def record(self) -> dict:
        """The run.json entry (no per-head values: those are in effects.csv)."""
        labels = self.labels.drop(columns=["heads"]).to_dict("records")
        return {"objective": self.objective, "objective_reason": self.objective_reason, "unit": self.unit,
                "clean": self.clean, "split": self.split, "settings": self.settings, "labels": labels,
                "induction": self.induction, "notes": self.notes, "timings_s": self.timings}


def split_batches(lm, texts, held_out: float, seed: int, batch_size: int, max_length):
    """(reference batches, held-out batches, split record): ``probe prune``'s split; each text's
    meta gets its corpus ``index`` (the masked-LM objective's seed)."""
    items = as_texts(validate.texts(texts))
    items = [Text(t.text, t.words, {**t.meta, "index": i}, t.pair, target=t.target) for i, t in enumerate(items)]
    ref_idx, held_idx = split_corpus(len(items), held_out, seed)
    ref, held = (list(iter_batches(lm, [items[i] for i in part], batch_size=batch_size, max_length=max_length))
                 for part in (ref_idx, held_idx))
    return ref, held, {"reference": len(ref_idx), "held_out": len(held_idx), "seed": seed}


def evaluate_sets(lm, objective, kind: str, means, held, sets: torch.Tensor, copies: int, bar=None) -> np.ndarray:
    """[sets, held-out sequences] per-sequence loss sums, each row with that set's heads ablated.

    Args:
        lm: the model.
        objective: a set-up :class:`~probe.pruning.objectives.Objective`.
        kind: ``"zero"`` or ``"mean"``.
        means: [layers, P, heads, d_head] (``mean``), or None.
        held: the held-out batches.
        sets: [n, layers, heads] bool (True = ablated; an all-False set is the clean model).
        copies: sets per forward pass.
        bar: a progress bar updated once per pass, or None.
    """
    out = []
    with ablating(lm, kind, means) as state:
        for batch in held:
            rows = []
            for start in range(0, len(sets), copies):
                rows.append(sequence_losses(lm, objective, state, batch, sets[start:start + copies]))
                if bar is not None:
                    bar.update(1)
            out.append(np.concatenate(rows, 0))
    return np.concatenate(out, 1)


def _mask(lm, heads: Sequence[tuple[int, int]]) -> torch.Tensor:
    g = lm.geometry
    m = torch.zeros(g.n_layers, g.n_heads, dtype=torch.bool)
    for layer, h in heads:
        m[layer, h] = True
    return m


def _plan(lm, groups: dict, seeds: int) -> tuple[list[list], list[tuple[str, int]]]:
    """Every set to ablate: the clean model, each head alone, each group and its random sets;
    with (label, seed) tags for the group rows (seed -1: the group itself)."""
    g = lm.geometry
    sets = [[]] + [[(layer, h)] for layer in range(g.n_layers) for h in range(g.n_heads)]
    tags = []
    for label, members in groups.items():
        sets.append(members)
        tags.append((label, -1))
        for seed, chosen in enumerate(random_sets(members, g.n_layers, g.n_heads, seeds)):
            sets.append(chosen)
            tags.append((label, seed))
    return sets, tags


def _label_rows(groups, tags, kind, effect, low, high, first: int) -> list[dict]:
    """label_effects.csv rows of one ablation kind; the group rows start at index ``first``."""
    rows = []
    for label, members in groups.items():
        own = first + tags.index((label, -1))
        rand = [first + i for i, (lab, seed) in enumerate(tags) if lab == label and seed >= 0]
        mean, std, r_low, r_high = t_interval(effect[rand])
        rows.append({"label": label, "ablation": kind, "n_heads": len(members), "effect": effect[own],
                     "effect_low": low[own], "effect_high": high[own], "random_mean": mean, "random_std": std,
                     "random_low": r_low, "random_high": r_high, "verdict": verdict(low[own], r_high),
                     "heads": " ".join(head_name(a, b) for a, b in members)})
    return rows


def labelled_heads(lm, texts: Sequence[str | Text], *, batch_size: int = 16, max_length: int | None = None,
                   progress: bool = False) -> AnalysisResult:
    """The usual analysis of ``texts`` (:func:`probe.analysis.analyze`; on decoders with the circuit
    probe, :func:`probe.patterns.circuit_probe`, whose scores give the ``induction`` label): its
    ``heads`` table has the labels the groups are made of."""
    finished = [circuit_probe(lm, sink_texts=texts)] if CircuitProbe.refusal(lm) is None else []
    return analyze(lm, texts, batch_size=batch_size, max_length=max_length, progress=progress, finished=finished)


def head_effects(lm, texts: Sequence[str | Text], *, heads: pd.DataFrame | None | bool = None,
                 objective: str | None = None, seeds: int = SEEDS, held_out: float = 0.5, split_seed: int = 0,
                 batch_size: int = 16, max_length: int | None = None, copies: int = 8, clusters: bool = False,
                 progress: bool = False) -> EffectsResult:
    """Zero and mean ablation effects of every head, and of every label group against random heads.

    Args:
        lm: a one-stack :class:`~probe.models.LoadedModel` (encoder or decoder), left unchanged.
        texts: the corpus, split into a reference half (means) and a held-out half (effects).
        heads: a heads table with ``layer``, ``head`` and ``labels`` (``analyze(...).heads``); None:
            :func:`labelled_heads` of ``texts`` is run for it; False: no label groups (``labels`` is empty).
        objective: ``clm``, ``mlm`` or ``fidelity`` (default: chosen from the model, as ``probe prune``).
        seeds: random sets per group (>= 5).
        held_out: share of the texts held out (effects); the rest is the reference half (means).
        split_seed: seed of the split (``probe prune``'s).
        batch_size: sequences per batch.
        max_length: token limit per sequence (default: the model's).
        copies: ablation sets per forward pass (the batch repeated ``copies`` times).
        clusters: also ablate each head group (``group`` or ``cluster`` column) against random heads.
        progress: a progress bar on stderr, counting the passes.

    Returns:
        An :class:`EffectsResult` (``heads`` = effects.csv, ``labels`` = label_effects.csv).

    Raises:
        InputError: an encoder-decoder or physically pruned model, fewer than 5 seeds, a corpus too
            small to split, an objective the model cannot serve.
    """
    t0 = time.perf_counter()
    check_model(lm)
    validate.positive_int("copies", copies)
    validate.positive_int("seeds", seeds, 5)
    ref, held, split = split_batches(lm, texts, held_out, split_seed, batch_size, max_length)
    name, reason = (objective, "given") if objective else default_objective(lm)
    obj = make_objective(name, seed=split_seed)
    obj.setup(lm, held)
    means = head_means(lm, ref)
    if heads is None:
        heads = labelled_heads(lm, texts, batch_size=batch_size, max_length=max_length).heads
    groups = label_groups(heads) if heads is not False else {}
    if clusters and heads is not False:
        groups.update(head_groups(heads))
    sets, tags = _plan(lm, groups, seeds)
    masks = torch.stack([_mask(lm, s) for s in sets])
    units = np.concatenate([unit_counts(obj, b) for b in held])
    passes = len(KINDS) * len(held) * -(-len(sets) // copies)
    bar = progress_bar(total=passes, desc="ablation passes", leave=False) if progress else None
    g, first = lm.geometry, 1 + lm.geometry.n_layers * lm.geometry.n_heads
    frame = pd.DataFrame({"stack": [s.stack for s in lm.sites for _ in range(g.n_heads)],
                          "kind": [s.kind for s in lm.sites for _ in range(g.n_heads)],
                          "layer": np.repeat(np.arange(g.n_layers), g.n_heads),
                          "head": np.tile(np.arange(g.n_heads), g.n_layers)})
    label_rows, clean = [], None
    try:
        for kind in KINDS:
            sums = evaluate_sets(lm, obj, kind, means, held, masks, copies, bar)
            clean = float(sums[0].sum() / units.sum())
            clean = 0.0 if abs(clean) < ZERO_WITHIN else clean  # fidelity of the model to itself
            effect, low, high = paired_bootstrap(sums[1:] - sums[0], units)
            effect, low, high = (np.concatenate([[0.0], v]) for v in (effect, low, high))
            frame[f"effect_{kind}"], frame[f"effect_{kind}_low"], frame[f"effect_{kind}_high"] = (
                effect[1:first], low[1:first], high[1:first])
            label_rows += _label_rows(groups, tags, kind, effect, low, high, first)
    finally:
        if bar is not None:
            bar.close()
    labels = pd.DataFrame(label_rows, columns=list(LABEL_COLUMNS))
    return EffectsResult(heads=frame, labels=labels, objective=name, objective_reason=reason, unit=obj.unit,
                         clean=clean, split=split, means=means,
                         settings={"seeds": seeds, "bootstrap": BOOTSTRAP, "copies": copies, "batch_size": batch_size,
                                   "max_length": max_length, "sets": len(sets), "passes": passes,
                                   "clusters": clusters},
                         timings={"effects_s": round(time.perf_counter() - t0, 3)})
