"""Syntactic heads: does a head's most-attended word find a word's gold dependency head?
(docs/statistics.md, "Syntax"; Clark et al. 2019, sec. 4.2 and Table 1.)

For each dependency (dependent d, gold head g, relation rel) of an aligned sentence and each
attention head, in both directions:

- ``dep->head``: correct when d's most-attended *other* word (word-level attention,
  :mod:`probe.linguistic.words`) is g;
- ``head->dep``: correct when g's most-attended other word is d (a head with two dependents of one
  relation can be right for at most one of them).

Accuracy per (relation, direction, head) with a 95% Wilson interval; the baseline is the best fixed
offset per relation and direction (always predict the word at relative position k, k in -5..5,
k != 0, the k chosen on the same data, as Clark et al. do). ``all`` pools every dependency.

Decisions:

- Relations are UD DEPRELs without subtype (``nmod:poss`` counts as ``nmod``); the root has no head
  word and is not scored. Relations with fewer than ``min_count`` (100) dependencies are not
  reported on their own (they still count in ``all``).
- Words are surface tokens (:mod:`probe.linguistic.conllu`): the two syntactic words of a
  multiword token share one word-level row and column, and so do words that one model token joins
  (:mod:`probe.linguistic.words`: ".)" in byte-level BPE). A dependency inside one such unit
  (n't -> did in "didn't") cannot be scored and is counted (``within_one_unit``); positions and
  the baseline's offsets are counted in surface words.
- Ties in the argmax go to the leftmost word. In a causal site a word sees only the words before it:
  the argmax is over those, and the first word (which sees no other word) predicts nothing, so a
  decoder cannot find a head to the right of its dependent (``reachable`` says how often the gold
  word is to the left).
- A head gets ``syntactic:<rel>`` when, in either direction, its accuracy is at least ``margin``
  (10 points) above that direction's baseline; strength = accuracy / (baseline + margin).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..measures.accumulators import Accumulator, present_heads
from ..sites import Site
from ..text.inputs import Batch
from .intervals import accuracy, wilson
from .words import batch_words, pooling, word_matrix

DIRECTIONS = ("dep->head", "head->dep")
#: Offsets of the fixed-offset baseline.
MAX_OFFSET = 5
OFFSETS = tuple(k for k in range(-MAX_OFFSET, MAX_OFFSET + 1) if k != 0)
#: Relations with fewer scored dependencies are not reported on their own.
MIN_COUNT = 100
#: Accuracy above the baseline (fraction) that earns ``syntactic:<rel>``.
MARGIN = 0.10
ALL = "all"


@dataclass
class SyntaxResult:
    """What :class:`SyntaxAccumulator` measured.

    Attributes:
        table: the rows of syntax.csv: ``relation``, ``direction``, ``kind`` ('head' or 'baseline'),
            ``layer``, ``head`` (empty for baselines), ``offset`` (baselines: the best k), ``n``,
            ``accuracy``, ``ci_low``, ``ci_high`` (95% Wilson); relations with >= ``min_count``
            dependencies and ``all``.
        counts: sentences seen/aligned/unaligned by reason, words joined into another word's unit by
            a token (``merged_words``), dependencies scored and left out inside one unit.
        best: per relation and direction, the best head next to the baseline (Clark et al.'s Table 1).
        reachable: per relation and direction, the share of dependencies whose target word is left of
            the query word (the most a causal model can get right).
        margin: the label's margin over the baseline.
    """

    table: pd.DataFrame
    counts: dict
    best: pd.DataFrame
    reachable: dict
    margin: float = MARGIN


class SyntaxAccumulator(Accumulator):
    """Scores every head on the texts whose ``meta`` has ``"syntax"`` (:mod:`probe.linguistic.conllu`).

    Args:
        sites: the model's attention sites, in order (``lm.sites``).
        n_heads: query heads per site.
        min_count: dependencies a relation needs to be reported (default 100).
        margin: accuracy over the baseline for the label (default 0.10).
        unaligned: reasons -> sentences already left out before the analysis (e.g. the reader's
            ``text mismatch``), so that the counts cover the whole file.
    """

    name = "syntax"
    title = "syntax scoring"
    model_kinds = ("encoder", "decoder")  # one-stack models
    site_kinds = ("self",)

    def __init__(self, sites: list[Site], n_heads: int, *, min_count: int = MIN_COUNT, margin: float = MARGIN,
                 unaligned: dict | None = None) -> None:
        self.sites = list(sites)
        self.n_heads = n_heads
        self.min_count = min_count
        self.margin = margin
        self._site_pos = {s: i for i, s in enumerate(self.sites)}
        self.relations: list[str] = []
        self._rel: dict[str, int] = {}
        self.correct = np.zeros((len(self.sites), 0, 2, n_heads), dtype=np.int64)
        self.absent = np.zeros((len(self.sites), n_heads), dtype=bool)  # heads removed by pruning
        self.n = np.zeros(0, dtype=np.int64)
        self.offset_counts = np.zeros((0, len(OFFSETS)), dtype=np.int64)  # by d = head - dependent
        self.left = np.zeros((0, 2), dtype=np.int64)  # target word left of the query word
        self.unaligned: Counter = Counter(unaligned or {})
        self.prior = sum(self.unaligned.values())  # sentences left out before reaching the loop
        self.seen = self.aligned = self.merged_words = 0
        self.within_unit: Counter = Counter()  # relation -> dependencies inside one word unit
        self._batch: dict | None = None

    def _rel_id(self, rel: str) -> int:
        if rel not in self._rel:
            self._rel[rel] = len(self.relations)
            self.relations.append(rel)
            self.correct = np.concatenate(
                [self.correct, np.zeros((len(self.sites), 1, 2, self.n_heads), np.int64)], axis=1)
            self.n = np.append(self.n, 0)
            self.offset_counts = np.vstack([self.offset_counts, np.zeros((1, len(OFFSETS)), np.int64)])
            self.left = np.vstack([self.left, np.zeros((1, 2), np.int64)])
        return self._rel[rel]

    def begin_batch(self, batch: Batch) -> None:
        self._batch = None
        rows, pairs = [], []
        for row, text in enumerate(batch.texts):
            meta = text.meta.get("syntax")
            if meta is None:
                continue
            self.seen += 1
            words = batch_words(batch)
            if words.status[row] is not None:
                self.unaligned[words.status[row]] += 1
                continue
            self.aligned += 1
            self.merged_words += words.merged(row)
            sub = len(rows)
            rows.append(row)
            surface, group = meta["surface"], words.group[row]
            for i, (h, rel) in enumerate(zip(meta["heads"], meta["relations"])):
                if h < 0:
                    continue
                d, g = surface[i], surface[h]  # surface words: positions and offsets
                if group[d] == group[g]:
                    self.within_unit[rel] += 1
                    continue
                r = self._rel_id(rel)
                pairs.append((sub, group[d], group[g], r))
                self.n[r] += 1
                if -MAX_OFFSET <= g - d <= MAX_OFFSET:
                    self.offset_counts[r, OFFSETS.index(g - d)] += 1
                self.left[r, 0] += g < d
                self.left[r, 1] += d < g
        if pairs:
            words = batch_words(batch)
            n_words = torch.tensor([words.n_words[r] for r in rows])
            token_word = words.token_word[rows]
            names = torch.zeros(len(rows), int(n_words.max()), dtype=torch.bool)  # words naming a unit
            for i, r in enumerate(rows):
                names[i, :n_words[i]] = torch.tensor([g == w for w, g in enumerate(words.group[r])])
            self._batch = {"rows": torch.tensor(rows), "pairs": torch.tensor(pairs, dtype=torch.long),
                           "token_word": token_word, "n_words": n_words,
                           "pooled": pooling(token_word, int(n_words.max())),
                           "allowed": {causal: candidates(names, causal) for causal in (False, True)}}

    def update(self, site: Site, probs: torch.Tensor, batch: Batch) -> None:
        self.absent[self._site_pos[site]] |= ~present_heads(probs).cpu().numpy()
        w = self._batch
        if w is None:
            return
        dev = probs.device
        m = word_matrix(probs[w["rows"].to(dev)], w["token_word"], int(w["n_words"].max()), w["pooled"])
        pred = predictions(m, w["allowed"][site.causal].to(dev)).cpu()  # [b, heads, N]
        b, d, g, r = w["pairs"].unbind(1)
        dep_head = pred[b, :, d] == g[:, None]  # [pairs, heads]
        head_dep = pred[b, :, g] == d[:, None]
        add = torch.zeros(len(self.relations), 2, self.n_heads, dtype=torch.long)
        add[:, 0].index_add_(0, r, dep_head.long())
        add[:, 1].index_add_(0, r, head_dep.long())
        self.correct[self._site_pos[site]] += add.numpy()

    def end_batch(self, batch: Batch) -> None:
        self._batch = None

    def merge(self, other: SyntaxAccumulator) -> SyntaxAccumulator:
        if other.sites != self.sites or other.n_heads != self.n_heads:
            raise ValueError("cannot merge syntax results of models with different sites or head counts")
        for rel in other.relations:
            j, i = other._rel[rel], self._rel_id(rel)
            self.correct[:, i] += other.correct[:, j]
            self.n[i] += other.n[j]
            self.offset_counts[i] += other.offset_counts[j]
            self.left[i] += other.left[j]
        self.absent |= other.absent
        self.unaligned.update(other.unaligned)
        self.seen += other.seen
        self.prior += other.prior
        self.aligned += other.aligned
        self.merged_words += other.merged_words
        self.within_unit.update(other.within_unit)
        return self

    def _reported(self) -> list[tuple[str, np.ndarray, int, np.ndarray, np.ndarray]]:
        """(relation, correct [sites, 2, heads], n, offset counts, left [2]) for each reported relation."""
        if not self.n.sum():
            return []
        out = [(ALL, self.correct.sum(1), int(self.n.sum()), self.offset_counts.sum(0), self.left.sum(0))]
        order = sorted(range(len(self.relations)), key=lambda i: (-self.n[i], self.relations[i]))
        out += [(self.relations[i], self.correct[:, i], int(self.n[i]), self.offset_counts[i], self.left[i])
                for i in order if self.n[i] >= self.min_count]
        return out

    def table(self) -> pd.DataFrame:
        """The syntax.csv rows (see :class:`SyntaxResult`)."""
        S, H = len(self.sites), self.n_heads
        layers = np.repeat([s.layer for s in self.sites], H)
        frames = []
        for rel, correct, n, offs, _ in self._reported():
            for k, direction in enumerate(DIRECTIONS):
                c = correct[:, k].ravel()
                low, high = wilson(c, np.full(S * H, n))
                heads = pd.DataFrame({
                    "relation": rel, "direction": direction, "kind": "head", "layer": layers,
                    "head": np.tile(np.arange(H), S), "offset": pd.NA, "n": n, "accuracy": accuracy(c, n),
                    "ci_low": low, "ci_high": high})
                heads.loc[self.absent.ravel(), ["accuracy", "ci_low", "ci_high"]] = np.nan  # removed heads
                frames.append(heads)
                # dep->head predicts d + k (correct when g - d = k); head->dep predicts g + k (k = d - g)
                by_k = offs if k == 0 else offs[::-1]
                j = int(np.argmax(by_k))
                low, high = wilson([by_k[j]], [n])
                frames.append(pd.DataFrame({
                    "relation": [rel], "direction": direction, "kind": "baseline", "layer": pd.NA, "head": pd.NA,
                    "offset": OFFSETS[j], "n": n, "accuracy": accuracy([by_k[j]], [n]), "ci_low": low,
                    "ci_high": high}))
        cols = ["relation", "direction", "kind", "layer", "head", "offset", "n", "accuracy", "ci_low", "ci_high"]
        if not frames:
            return pd.DataFrame(columns=cols)
        out = pd.concat(frames, ignore_index=True)[cols]
        for c in ("layer", "head", "offset"):
            out[c] = out[c].astype("Int64")
        return out

    def result(self) -> SyntaxResult:
        table = self.table()
        reachable = {rel: {DIRECTIONS[k]: (float(left[k] / n) if n else float("nan")) for k in range(2)}
                     for rel, _, n, _, left in self._reported()}
        return SyntaxResult(table, self.counts(), best_heads(table), reachable, self.margin)

    def counts(self) -> dict:
        """Sentences seen, aligned and unaligned (by reason); dependencies scored and left out."""
        return {"sentences": self.seen + self.prior, "merged_words": self.merged_words,
                "aligned": self.aligned, "unaligned": dict(self.unaligned),
                "dependencies": int(self.n.sum()), "within_one_unit": sum(self.within_unit.values()),
                "within_one_unit_by_relation": dict(self.within_unit.most_common()),
                "relations": len(self.relations),
                "reported_relations": int((self.n >= self.min_count).sum())}

    def head_labels(self) -> list[tuple[int, int, str, float]]:
        """``syntactic:<rel>`` for heads at least ``margin`` above the baseline in either direction."""
        t = self.table()
        if t.empty:
            return []
        base = t[t["kind"] == "baseline"].set_index(["relation", "direction"])["accuracy"]
        heads = t[(t["kind"] == "head") & (t["relation"] != ALL)].copy()
        heads["baseline"] = [base[(r, d)] for r, d in zip(heads["relation"], heads["direction"])]
        won = heads[heads["accuracy"] - heads["baseline"] >= self.margin - 1e-9]
        best: dict[tuple[int, int, str], float] = {}
        for r in won.itertuples():
            key = (int(r.layer), int(r.head), f"syntactic:{r.relation}")
            best[key] = max(best.get(key, 0.0), float(r.accuracy / (r.baseline + self.margin)))
        return [(*key, strength) for key, strength in sorted(best.items())]

    def columns(self) -> pd.DataFrame | None:
        """Per head: ``syntax_relation`` (direction included) where it gains most over the baseline,
        and ``syntax_gain`` (accuracy - baseline), for heads.csv."""
        t = self.table()
        if t.empty:
            return None
        base = t[t["kind"] == "baseline"].set_index(["relation", "direction"])["accuracy"]
        heads = t[(t["kind"] == "head") & (t["relation"] != ALL)].copy()
        if heads.empty:
            return None
        heads["gain"] = heads["accuracy"].to_numpy() - np.array(
            [base[(r, d)] for r, d in zip(heads["relation"], heads["direction"])])
        top = heads.sort_values("gain", ascending=False).groupby(["layer", "head"], as_index=False).first()
        return pd.DataFrame({"layer": top["layer"].astype(int), "head": top["head"].astype(int),
                             "syntax_relation": top["relation"] + " " + top["direction"],
                             "syntax_gain": top["gain"].astype(float)})


def candidates(names: torch.Tensor, causal: bool) -> torch.Tensor:
    """[batch, N, N] bool: word unit j may be word i's prediction: another unit of the sentence
    (``names`` [batch, N]: word j names its unit), and in a causal site one before i."""
    N = names.shape[1]
    idx = torch.arange(N)
    allowed = (idx[None, :] != idx[:, None])[None] & names[:, None, :]
    if causal:
        allowed = allowed & (idx[None, :] < idx[:, None])[None]
    return allowed


def predictions(m: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Most-attended other word of each word: [batch, heads, N] from word-level attention
    [batch, heads, N, N] and :func:`candidates` [batch, N, N]; -1 where a row has no candidate
    (the first word of a causal site). Ties go to the leftmost word."""
    scores = m.masked_fill(~allowed[:, None], float("-inf"))
    best, pred = scores.max(-1)
    return torch.where(torch.isinf(best), torch.full_like(pred, -1), pred)


def best_heads(table: pd.DataFrame) -> pd.DataFrame:
    """Per relation and direction: the best head (highest accuracy, then highest ci_low) with its
    interval, next to the baseline's accuracy and offset (the shape of Clark et al.'s Table 1)."""
    cols = ["relation", "direction", "n", "layer", "head", "accuracy", "ci_low", "ci_high",
            "baseline", "baseline_offset", "gain"]
    if table.empty:
        return pd.DataFrame(columns=cols)
    heads = table[table["kind"] == "head"].sort_values(["accuracy", "ci_low"], ascending=False)
    top = heads.groupby(["relation", "direction"], sort=False).head(1)
    base = table[table["kind"] == "baseline"][["relation", "direction", "accuracy", "offset"]].rename(
        columns={"accuracy": "baseline", "offset": "baseline_offset"})
    out = top.merge(base, on=["relation", "direction"])
    out["gain"] = out["accuracy"] - out["baseline"]
    order = {rel: i for i, rel in enumerate(dict.fromkeys(table["relation"]))}
    out = out.sort_values(["relation", "direction"], key=lambda s: s.map(order) if s.name == "relation" else s)
    return out[cols].reset_index(drop=True)
