"""Ablation effects of every head and of every label group, on held-out text: :func:`head_effects`.

The corpus is split as ``probe prune`` splits it (:func:`probe.causal.split.split_corpus`, seed 0): the
reference half gives the heads' means (mean ablation), the held-out half every effect. effect =
objective(ablated) - objective(clean) in the objective's units (> 0: the model got worse), the
objective being ``probe prune``'s (:mod:`probe.causal.objectives`): ``clm`` nats per predicted
token, ``mlm`` nats per masked token, ``fidelity`` 1 - cosine of the mean-pooled last hidden state;
encoder-decoder models ``seq2seq``, nats per target token (:mod:`.objective`). Every head of every
site is ablated: an encoder-decoder model's encoder self, decoder self and cross heads alike.

Cost: one held-out pass per ablation set and kind: sites x heads x kinds, plus (1 + seeds) sets per
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
from ..causal.heads import normalize_heads, table_heads
from ..causal.objectives import ZERO_WITHIN
from ..causal.split import split_corpus
from ..errors import InputError
from ..patterns import CircuitProbe, circuit_probe
from ..records import AnalysisResult
from ..runs.analysis import analyze
from ..runs.pace import Passes
from ..sites import head_name
from ..text.inputs import Text, as_texts, iter_batches
from ..util import plural, progress_bar
from .ablation import (
    DEFAULT_KINDS,
    KINDS,
    ablating,
    check_kinds,
    check_model,
    head_means,
    sequence_losses,
    site_z,
    unit_counts,
)
from .groups import (
    BOOTSTRAP,
    SEEDS,
    head_groups,
    label_groups,
    paired_bootstrap,
    pool_makeup,
    random_sets,
    t_interval,
    verdict,
)
from .objective import choose_objective
from .resample import RESAMPLE_SEED, Donors, draw_donors


def effect_columns(kinds=KINDS) -> tuple[str, ...]:
    """Columns of effects.csv after ``stack``, ``kind``, ``layer``, ``head`` for the ablation ``kinds``."""
    return tuple(f"effect_{k}{s}" for k in kinds for s in ("", "_low", "_high"))


#: Every effects column (zero, mean, resample); a run has those of the kinds it measured.
EFFECT_COLUMNS = effect_columns()
#: Columns of label_effects.csv.
LABEL_COLUMNS = ("label", "ablation", "n_heads", "effect", "effect_low", "effect_high", "random_mean", "random_std",
                 "random_low", "random_high", "verdict", "pool_heads", "pool_top", "pool_top_share", "heads")
#: A baseline pool at least this much of one primary label gets a note saying so.
POOL_NOTE = 0.5


@dataclass
class EffectsResult:
    """What :func:`head_effects` measured.

    Attributes:
        heads: effects.csv: one row per head (sites in ``lm.sites`` order): ``stack``, ``kind``,
            ``layer``, ``head``, then ``effect_<kind>`` of each ablation kind measured (``zero``,
            ``mean``, ``resample``) and their 95% bootstrap ``_low`` / ``_high``.
        labels: label_effects.csv: one row per (label or head group, ablation kind), :data:`LABEL_COLUMNS`.
        objective, objective_reason, unit: what was measured and why.
        clean: the objective of the clean model on the held-out half.
        split: sizes and seed of the reference and held-out halves.
        means: [sites, P, heads, d_head] the heads' means (:func:`~probe.effects.ablation.head_means`).
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


def evaluate_sets(lm, objective, kind: str, means, held, sets: torch.Tensor, copies: int, bar=None,
                  donors: Donors | None = None) -> np.ndarray:
    """[sets, held-out sequences] per-sequence loss sums, each row with that set's heads ablated.

    Args:
        lm: the model.
        objective: a set-up :class:`~probe.causal.objectives.Objective`.
        kind: ``"zero"``, ``"mean"`` or ``"resample"``.
        means: [sites, P, heads, d_head] (``mean``), or None.
        held: the held-out batches.
        sets: [n, sites, heads] bool (True = ablated; an all-False set is the clean model).
        copies: sets per forward pass.
        bar: a progress bar updated once per pass, or None.
        donors: ``resample``: :func:`~probe.effects.resample.draw_donors` of ``held``.

    Raises:
        ValueError: ``resample`` without donors (a programming mistake).
    """
    if kind == "resample" and donors is None:
        raise ValueError("resample ablation needs donors (draw_donors)")
    out = []
    with ablating(lm, kind, means) as state:
        for b, batch in enumerate(held):
            if kind == "resample":
                state.donors = site_z(lm, donors.batches[b])  # clean: no set is armed here
            rows = []
            for start in range(0, len(sets), copies):
                rows.append(sequence_losses(lm, objective, state, batch, sets[start:start + copies]))
                if bar is not None:
                    bar.update(1)
            out.append(np.concatenate(rows, 0))
    return np.concatenate(out, 1)


def site_index(lm) -> dict[tuple, int]:
    """(stack, kind, layer) -> index of the site in ``lm.sites`` (for one-stack models the layer)."""
    return {(s.stack, s.kind, s.layer): i for i, s in enumerate(lm.sites)}


def by_site(lm, heads: pd.DataFrame) -> pd.DataFrame:
    """``heads`` with ``layer`` replaced by the site index (the ablation's numbering): unchanged for
    one-stack models; an encoder-decoder model's table needs ``stack`` and ``kind``.

    Raises:
        InputError: a row naming a head outside the model (a layer or head out of range, negative
            numbers included), with the valid ranges.
    """
    H = lm.geometry.n_heads
    if lm.kind != "encoder-decoder":
        table_heads(heads, len(lm.sites), H)
        return heads
    index = site_index(lm)
    if not {"stack", "kind"} <= set(heads):
        raise InputError(f"{lm.name} is an encoder-decoder model: its heads table needs stack and kind columns")
    for r in heads.itertuples():
        layers = [s.layer for s in lm.sites if (s.stack, s.kind) == (r.stack, r.kind)]
        if not layers:
            raise InputError(f"no {r.stack} {r.kind}-attention sites in {lm.name}")
        try:
            table_heads(pd.DataFrame({"layer": [r.layer], "head": [r.head]}), max(layers) + 1, H)
        except InputError as exc:
            raise InputError(f"{r.stack} {r.kind}-attention: {exc}") from None
    out = heads.copy()
    out["layer"] = [index[(r.stack, r.kind, int(r.layer))] for r in heads.itertuples()]
    return out


def unit_name(lm, i: int, head: int) -> str:
    """The display name of head ``head`` of site ``i`` (``L4H5``; ``enc L4H5`` ... for encoder-decoder models)."""
    site = lm.sites[i]
    return head_name(site if lm.kind == "encoder-decoder" else site.layer, head)


def _mask(lm, heads: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[sites, heads] bool: True at the (site index, head) pairs of ``heads`` (checked: never wrapped)."""
    normalize_heads(heads, len(lm.sites), lm.geometry.n_heads)
    m = torch.zeros(len(lm.sites), lm.geometry.n_heads, dtype=torch.bool)
    for i, h in heads:
        m[i, h] = True
    return m


def _plan(lm, groups: dict, seeds: int) -> tuple[list[list], list[tuple[str, int]]]:
    """Every set to ablate: the clean model, each head alone, each group and its random sets;
    with (label, seed) tags for the group rows (seed -1: the group itself)."""
    S, H = len(lm.sites), lm.geometry.n_heads
    sets = [[]] + [[(i, h)] for i in range(S) for h in range(H)]
    tags = []
    for label, members in groups.items():
        sets.append(members)
        tags.append((label, -1))
        for seed, chosen in enumerate(random_sets(members, S, H, seeds)):
            sets.append(chosen)
            tags.append((label, seed))
    return sets, tags


def _label_rows(lm, groups, tags, kind, effect, low, high, first: int, primary: dict) -> list[dict]:
    """label_effects.csv rows of one ablation kind; the group rows start at index ``first``;
    ``primary``: (site index, head) -> primary label (the baseline pool's makeup)."""
    rows = []
    for label, members in groups.items():
        n_pool, top, share = pool_makeup(primary, members, len(lm.sites), lm.geometry.n_heads)
        own = first + tags.index((label, -1))
        rand = [first + i for i, (lab, seed) in enumerate(tags) if lab == label and seed >= 0]
        mean, std, r_low, r_high = t_interval(effect[rand])
        rows.append({"label": label, "ablation": kind, "n_heads": len(members), "effect": effect[own],
                     "effect_low": low[own], "effect_high": high[own], "random_mean": mean, "random_std": std,
                     "random_low": r_low, "random_high": r_high, "verdict": verdict(low[own], r_high),
                     "pool_heads": n_pool, "pool_top": top, "pool_top_share": share,
                     "heads": " ".join(unit_name(lm, a, b) for a, b in members)})
    return rows


def _groups(lm, heads: pd.DataFrame | bool, clusters: bool) -> tuple[dict, dict]:
    """(label or head group -> its (site index, head) pairs, (site index, head) -> primary label) of a
    heads table (False: none)."""
    if heads is False:
        return {}, {}
    table = by_site(lm, heads)
    groups = label_groups(table)
    if clusters:
        groups.update(head_groups(table))
    primary = {} if "label" not in table else dict(zip(zip(table["layer"].astype(int), table["head"].astype(int)),
                                                         table["label"]))
    return groups, primary


def _frame(lm) -> pd.DataFrame:
    """effects.csv's key columns ``stack``, ``kind``, ``layer``, ``head``: every head, ``lm.sites`` order."""
    H, sites = lm.geometry.n_heads, lm.sites
    return pd.DataFrame({"stack": np.repeat([s.stack for s in sites], H), "kind": np.repeat([s.kind for s in sites], H),
                         "layer": np.repeat([s.layer for s in sites], H), "head": np.tile(np.arange(H), len(sites))})


def _donor_notes(donors: Donors | None) -> list[str]:
    """The note on held-out sequences left out of the resample effects (none: no note)."""
    if donors is None or not donors.missing:
        return []
    return [f"resample ablation: {plural(donors.missing, 'held-out sequence')} had no reference text at least as "
            "long to take a donor from, and are left out of the resample effects"]


def _pool_notes(labels: pd.DataFrame) -> list[str]:
    """A note per label whose random baseline is drawn mostly (:data:`POOL_NOTE`) from heads of one primary label."""
    notes = []
    for r in labels.drop_duplicates("label").itertuples():
        if r.pool_top_share >= POOL_NOTE and r.pool_top != r.label:
            notes.append(f"{r.label}: its random baseline is drawn from the {r.pool_heads} heads outside the group, "
                         f"{r.pool_top_share:.0%} of them primarily '{r.pool_top}': its verdict compares the group "
                         f"with mostly {r.pool_top} heads, not with heads of every kind")
    return notes


def labelled_heads(lm, texts: Sequence[str | Text], *, batch_size: int = 16, max_length: int | None = None,
                   progress: bool = False) -> AnalysisResult:
    """The usual analysis of ``texts`` (:func:`probe.runs.analysis.analyze`; on decoders with the circuit
    probe, :func:`probe.patterns.circuit_probe`, whose scores give the ``induction`` label): its
    ``heads`` table has the labels the groups are made of."""
    finished = [circuit_probe(lm, sink_texts=texts)] if CircuitProbe.refusal(lm) is None else []
    return analyze(lm, texts, batch_size=batch_size, max_length=max_length, progress=progress, finished=finished)


def head_effects(lm, texts: Sequence[str | Text], *, heads: pd.DataFrame | None | bool = None,
                 objective: str | None = None, kinds: Sequence[str] = DEFAULT_KINDS, seeds: int = SEEDS,
                 held_out: float = 0.5, split_seed: int = 0, resample_seed: int = RESAMPLE_SEED, batch_size: int = 16,
                 max_length: int | None = None, copies: int = 8, clusters: bool = False,
                 progress: bool = False, estimate=None) -> EffectsResult:
    """Ablation effects of every head, and of every label group against random heads.

    Args:
        lm: a complete :class:`~probe.loading.models.LoadedModel` (encoder, decoder or encoder-decoder: every
            site's heads), left unchanged.
        texts: the corpus, split into a reference half (means, donors) and a held-out half (effects);
            an encoder-decoder model's texts have targets (``Text(source, target=...)``).
        heads: a heads table with ``layer``, ``head`` and ``labels`` (``analyze(...).heads``; with
            ``stack`` and ``kind`` for an encoder-decoder model); None: :func:`labelled_heads` of
            ``texts`` is run for it; False: no label groups (``labels`` is empty).
        objective: ``clm``, ``mlm``, ``fidelity`` or ``seq2seq`` (default: ``seq2seq`` for
            encoder-decoder models, else chosen from the model as ``probe prune`` does).
        kinds: the ablations: any of ``zero``, ``mean``, ``resample``.
        seeds: random sets per group (>= 5).
        held_out: share of the texts held out (effects); the rest is the reference half.
        split_seed: seed of the split (``probe prune``'s).
        resample_seed: seed of the resample donors (:mod:`~probe.effects.resample`).
        batch_size: sequences per batch.
        max_length: token limit per sequence (default: the model's).
        copies: ablation sets per forward pass (the batch repeated ``copies`` times).
        clusters: also ablate each head group (``group`` or ``cluster`` column) against random heads.
        progress: a progress bar on stderr, counting the passes.
        estimate: a callable given one line once the second ablation pass has run, the time the others
            will take where it reaches 10 s (:class:`probe.runs.pace.Passes`), or None.

    Returns:
        An :class:`EffectsResult` (``heads`` = effects.csv, ``labels`` = label_effects.csv).

    Raises:
        UnsupportedAnalysisError: a physically pruned model.
        InputError: a heads table naming a head outside the model (before any pass), fewer than 5
            seeds, an unknown ablation kind, a corpus too small to split, an objective the model
            cannot serve, resample without any donor.
    """
    t0 = time.perf_counter()
    check_model(lm)
    kinds = check_kinds(kinds)
    if heads is not None and heads is not False:
        by_site(lm, heads)  # every head of the table inside the model, before any pass
    validate.positive_int("copies", copies)
    validate.positive_int("seeds", seeds, 5)
    ref, held, split = split_batches(lm, texts, held_out, split_seed, batch_size, max_length)
    obj, name, reason = choose_objective(lm, objective, seed=split_seed)
    obj.setup(lm, held)
    means = head_means(lm, ref)
    donors = draw_donors(lm, held, ref, seed=resample_seed, max_length=max_length) if "resample" in kinds else None
    if heads is None:
        heads = labelled_heads(lm, texts, batch_size=batch_size, max_length=max_length).heads
    groups, primary = _groups(lm, heads, clusters)
    sets, tags = _plan(lm, groups, seeds)
    masks = torch.stack([_mask(lm, s) for s in sets])
    units = np.concatenate([unit_counts(obj, b) for b in held])
    passes = len(kinds) * len(held) * -(-len(sets) // copies)
    bar = progress_bar(total=passes, desc="ablation passes", leave=False) if progress else None
    counter = Passes(passes, "ablation passes", estimate, bar)  # the bar's updates, and the time left said once
    first, frame = 1 + len(lm.sites) * lm.geometry.n_heads, _frame(lm)
    label_rows, clean = [], None
    try:
        for kind in kinds:
            sums = evaluate_sets(lm, obj, kind, means, held, masks, copies, counter, donors)
            keep = donors.keep if kind == "resample" else np.ones(len(units), dtype=bool)
            if not keep.any():
                raise InputError("resample ablation: no held-out sequence has a reference text at least as long")
            clean = float(sums[0].sum() / units.sum()) if clean is None else clean  # every sequence (not only kept)
            effect, low, high = paired_bootstrap((sums[1:] - sums[0])[:, keep], units[keep])
            effect, low, high = (np.concatenate([[0.0], v]) for v in (effect, low, high))
            frame[f"effect_{kind}"], frame[f"effect_{kind}_low"], frame[f"effect_{kind}_high"] = (
                effect[1:first], low[1:first], high[1:first])
            label_rows += _label_rows(lm, groups, tags, kind, effect, low, high, first, primary)
    finally:
        if bar is not None:
            bar.close()
    labels = pd.DataFrame(label_rows, columns=list(LABEL_COLUMNS))
    notes = _donor_notes(donors) + (_pool_notes(labels) if primary else [])
    clean = 0.0 if abs(clean) < ZERO_WITHIN else clean  # fidelity of the model to itself
    return EffectsResult(heads=frame, labels=labels, objective=name, objective_reason=reason, unit=obj.unit,
                         clean=clean, split=split, means=means,
                         settings={"kinds": list(kinds), "seeds": seeds, "bootstrap": BOOTSTRAP, "copies": copies,
                                   "batch_size": batch_size, "max_length": max_length, "sets": len(sets),
                                   "passes": passes, "clusters": clusters,
                                   "resample_seed": resample_seed if donors is not None else None},
                         timings={"effects_s": round(time.perf_counter() - t0, 3)}, notes=notes)
