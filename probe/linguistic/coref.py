"""Coreference heads: does a head's word-level attention from a pronoun pick its antecedent?
(docs/statistics.md, "Coreference"; Clark et al. 2019, sec. 5.2.)

For each example (a pronoun p and two candidate names A and B, exactly one of them p's antecedent)
and each head: the head answers A when its word-level attention from p to A exceeds that to B
(:mod:`probe.linguistic.words`: mean over p's tokens of the attention summed over the candidate's
tokens), else B. Accuracy is the share of examples answered correctly, with a 95% Wilson interval.

Decisions:

- Multi-word names: the attention to a name is summed over all of its words (the total attention
  the pronoun gives the name as marked, e.g. "Cheryl Cassidy"), not taken from one head word: GAP
  marks names, not syntactic heads, and the sum needs no parser.
- Only the marked mention of each candidate counts (GAP gives one offset per name).
- Examples with no single antecedent (GAP rows with both or neither name TRUE) are counted and left
  out, as are examples whose mentions share a word and texts that are not aligned
  (:data:`probe.linguistic.words.REASONS`).
- Decoders attend only backwards: in a causal model, an example with a candidate at or after the
  pronoun is left out and counted ("candidate after the pronoun"), so every scored example lets the
  head see both names; baselines are scored on the same examples. Encoders score every example.
  (``preceding_only`` overrides the choice.)
- Baselines: ``nearest`` answers the candidate closer to the pronoun in words (the distance from the
  pronoun to the nearest word of the name; a tie goes to the candidate before the pronoun);
  ``first`` answers the candidate that appears first.
- A head gets the label ``coreference`` when the lower end of its interval is above the best
  baseline's accuracy; its strength is that lower end / the best baseline's accuracy.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..measures.accumulators import Accumulator, present_heads
from ..sites import Site
from ..text.inputs import Batch
from .intervals import accuracy, wilson
from .words import batch_words

BASELINES = ("nearest", "first")

#: Why a usable-looking example is left out (besides unaligned texts).
SKIPS = {
    "no single antecedent": "both or neither candidate is the pronoun's antecedent",
    "overlapping mentions": "the pronoun and the names share a word",
    "candidate after the pronoun": "a decoder cannot attend to a name at or after the pronoun",
}


def baseline_answers(pronoun: list[int], a: list[int], b: list[int]) -> dict[str, bool]:
    """Whether each baseline answers A (True) or B (False); positions are word indices."""
    def distance(m):
        return min(abs(w - q) for w in m for q in pronoun)

    da, db = distance(a), distance(b)
    if da != db:
        nearest_a = da < db
    else:  # one before and one after the pronoun, equally far: the one before
        nearest_a = min(a) < min(b)
    return {"nearest": nearest_a, "first": min(a) < min(b)}


def prepare(meta: dict, preceding_only: bool, group: list[int] | None = None) -> tuple[str | None, dict]:
    """Check one example's ``meta["coref"]``: (skip reason or None, the example's word indices).

    ``group`` maps each word to its word unit (:class:`probe.linguistic.words.BatchWords`); the
    attention is read from units, the baselines and the causal rule from the words themselves.
    """
    p, a, b = list(meta["pronoun"]), list(meta["a"]), list(meta["b"])
    unit = (lambda ws: sorted({group[w] for w in ws})) if group is not None else sorted
    pu, au, bu = unit(p), unit(a), unit(b)
    if not p or not a or not b or set(pu) & set(au) or set(pu) & set(bu) or set(au) & set(bu):
        return "overlapping mentions", {}
    if bool(meta["a_coref"]) == bool(meta["b_coref"]):
        return "no single antecedent", {}
    if preceding_only and max(a + b) >= min(p):
        return "candidate after the pronoun", {}
    return None, {"pronoun": pu, "a": au, "b": bu, "truth_a": bool(meta["a_coref"]),
                  "baselines": baseline_answers(p, a, b), "id": meta.get("id", "")}


@dataclass
class CorefView:
    """One scored example kept for drawing: the pronoun's word-level attention row per head.

    Attributes:
        id, text: the example.
        words: the text's words (strings).
        pronoun, a, b: the mentions' word units (:class:`probe.linguistic.words.BatchWords`; the
            index of each unit's first word).
        truth_a: A is the antecedent.
        baselines: baseline -> answers A.
        rows: [sites, heads, words] attention from the pronoun to each word (float32; special
            tokens' columns left out).
    """

    id: str
    text: str
    words: list[str]
    pronoun: list[int]
    a: list[int]
    b: list[int]
    truth_a: bool
    baselines: dict
    rows: np.ndarray

    def answers_a(self) -> np.ndarray:
        """[sites, heads] bool: each head answers A (attention to A > attention to B)."""
        return self.rows[..., self.a].sum(-1) > self.rows[..., self.b].sum(-1)


@dataclass
class CorefResult:
    """What :class:`CorefAccumulator` measured.

    Attributes:
        table: ``kind`` ('head', 'nearest', 'first'), ``layer``, ``head`` (empty for baselines),
            ``n``, ``accuracy``, ``ci_low``, ``ci_high`` (95% Wilson); the rows of coref.csv.
        counts: examples seen, scored, unaligned by reason, skipped by reason.
        preceding_only: examples with a candidate after the pronoun were left out.
        views: a few scored examples with the pronoun's attention rows (for the report).
    """

    table: pd.DataFrame
    counts: dict
    preceding_only: bool
    views: list[CorefView] = field(default_factory=list)

    @property
    def heads(self) -> pd.DataFrame:
        """The head rows of :attr:`table`."""
        return self.table[self.table["kind"] == "head"]

    @property
    def baselines(self) -> pd.DataFrame:
        """The baseline rows of :attr:`table`, by kind."""
        return self.table[self.table["kind"] != "head"].set_index("kind")

    def best_baseline(self) -> float:
        """The best baseline's accuracy (NaN with no scored example)."""
        values = self.baselines["accuracy"]
        return float(values.max()) if values.notna().any() else float("nan")

    def best(self, k: int = 5) -> pd.DataFrame:
        """The ``k`` heads of highest accuracy."""
        return self.heads.sort_values(["accuracy", "ci_low"], ascending=False).head(k)

    def labelled(self) -> pd.DataFrame:
        """Heads whose interval's lower end is above the best baseline's accuracy."""
        best = self.best_baseline()
        return self.heads[self.heads["ci_low"] > best] if not np.isnan(best) else self.heads.iloc[:0]


class CorefAccumulator(Accumulator):
    """Scores every head on the texts whose ``meta`` has ``"coref"`` (:mod:`probe.linguistic.gap`).

    Args:
        sites: the model's attention sites, in order (``lm.sites``).
        n_heads: query heads per site.
        preceding_only: leave out examples with a candidate at or after the pronoun (default: when
            any site is causal).
        keep: scored examples whose pronoun rows are kept for drawing.
        unaligned: reasons -> examples already left out before the analysis (the reader's offset
            mismatches), so that the counts cover the whole file.
    """

    name = "coreference"
    title = "coreference scoring"
    model_kinds = ("encoder", "decoder")  # one-stack models
    site_kinds = ("self",)

    def __init__(self, sites: list[Site], n_heads: int, *, preceding_only: bool | None = None,
                 keep: int = 20, unaligned: dict | None = None) -> None:
        self.sites = list(sites)
        self.n_heads = n_heads
        self.preceding_only = any(s.causal for s in self.sites) if preceding_only is None else bool(preceding_only)
        self.keep = keep
        self._site_pos = {s: i for i, s in enumerate(self.sites)}
        self.correct = np.zeros((len(self.sites), n_heads), dtype=np.int64)
        self.absent = np.zeros((len(self.sites), n_heads), dtype=bool)  # heads removed by pruning
        self.n = 0
        self.baseline_correct = dict.fromkeys(BASELINES, 0)
        self.seen = 0
        self.unaligned: Counter = Counter(unaligned or {})
        self.prior = sum(self.unaligned.values())  # examples left out before reaching the loop
        self.skipped: Counter = Counter()
        self.views: list[CorefView] = []
        self._batch: dict | None = None

    def begin_batch(self, batch: Batch) -> None:
        self._batch = None
        rows, items = [], []
        for row, text in enumerate(batch.texts):
            meta = text.meta.get("coref")
            if meta is None:
                continue
            self.seen += 1
            words = batch_words(batch)
            if words.status[row] is not None:
                self.unaligned[words.status[row]] += 1
                continue
            why, item = prepare(meta, self.preceding_only, words.group[row])
            if why is not None:
                self.skipped[why] += 1
                continue
            rows.append(row)
            items.append(item)
            self.n += 1
            for name, answers_a in item["baselines"].items():
                self.baseline_correct[name] += int(answers_a == item["truth_a"])
        if rows:
            self._batch = self._weights(batch, rows, items)

    def _weights(self, batch: Batch, rows: list[int], items: list[dict]) -> dict:
        """Per scored row: pronoun token weights (mean), candidate token masks (sum), the truth."""
        token_word = batch_words(batch).token_word[rows]  # [b, T]

        def mask(key):
            out = torch.zeros(token_word.shape, dtype=torch.float32)
            for i, item in enumerate(items):
                out[i] = torch.isin(token_word[i], torch.tensor(item[key])).float()
            return out

        f = mask("pronoun")
        f = f / f.sum(-1, keepdim=True)
        keep = []
        for i, item in enumerate(items):
            if len(self.views) + len(keep) < self.keep:
                text = batch.texts[rows[i]]
                keep.append((i, CorefView(item["id"], text.text, [text.text[s:e] for s, e in text.word_spans()],
                                          item["pronoun"], item["a"], item["b"], item["truth_a"], item["baselines"],
                                          np.zeros((len(self.sites), self.n_heads, len(text.word_spans())),
                                                   dtype=np.float32))))
        self.views.extend(v for _, v in keep)
        keep = [(i, v, (token_word[i][:, None] == torch.arange(v.rows.shape[-1])).float()) for i, v in keep]
        return {"rows": torch.tensor(rows), "from": f, "a": mask("a"), "b": mask("b"), "token_word": token_word,
                "truth_a": torch.tensor([it["truth_a"] for it in items]), "keep": keep}

    def update(self, site: Site, probs: torch.Tensor, batch: Batch) -> None:
        self.absent[self._site_pos[site]] |= ~present_heads(probs).cpu().numpy()
        w = self._batch
        if w is None:
            return
        a = probs[w["rows"].to(probs.device)].float()  # [b, heads, T, T]
        row = torch.einsum("bt,bhtk->bhk", w["from"].to(a.device), a)  # [b, heads, T]: from the pronoun
        att_a = (row * w["a"].to(a.device)[:, None]).sum(-1)
        att_b = (row * w["b"].to(a.device)[:, None]).sum(-1)
        correct = (att_a > att_b).cpu() == w["truth_a"][:, None]
        i = self._site_pos[site]
        self.correct[i] += correct.sum(0).numpy()
        for b, view, to in w["keep"]:  # to: [T, words], token t belongs to word w
            view.rows[i] = (row[b] @ to.to(a.device)).cpu().numpy()

    def end_batch(self, batch: Batch) -> None:
        self._batch = None

    def merge(self, other: CorefAccumulator) -> CorefAccumulator:
        if other.sites != self.sites or other.n_heads != self.n_heads:
            raise ValueError("cannot merge coreference results of models with different sites or head counts")
        self.correct += other.correct
        self.absent |= other.absent
        self.n += other.n
        self.seen += other.seen
        self.prior += other.prior
        for name in BASELINES:
            self.baseline_correct[name] += other.baseline_correct[name]
        self.unaligned.update(other.unaligned)
        self.skipped.update(other.skipped)
        self.views.extend(other.views[: max(0, self.keep - len(self.views))])
        return self

    def table(self) -> pd.DataFrame:
        """The coref.csv rows (see :class:`CorefResult`)."""
        S, H = self.correct.shape
        n = np.full(S * H, self.n)
        low, high = wilson(self.correct.ravel(), n)
        heads = pd.DataFrame({
            "kind": "head", "layer": np.repeat([s.layer for s in self.sites], H), "head": np.tile(np.arange(H), S),
            "n": n, "accuracy": accuracy(self.correct.ravel(), n), "ci_low": low, "ci_high": high})
        heads.loc[self.absent.ravel(), ["accuracy", "ci_low", "ci_high"]] = np.nan  # removed heads: no answer
        base_correct = [self.baseline_correct[b] for b in BASELINES]
        low, high = wilson(base_correct, [self.n] * len(BASELINES))
        base = pd.DataFrame({"kind": list(BASELINES), "layer": pd.NA, "head": pd.NA, "n": self.n,
                             "accuracy": accuracy(base_correct, [self.n] * len(BASELINES)),
                             "ci_low": low, "ci_high": high})
        out = pd.concat([heads, base], ignore_index=True)
        out["layer"] = out["layer"].astype("Int64")
        out["head"] = out["head"].astype("Int64")
        return out

    def counts(self) -> dict:
        """Examples seen, scored, unaligned (by reason) and skipped (by reason)."""
        return {"examples": self.seen + self.prior, "scored": self.n, "unaligned": dict(self.unaligned),
                "skipped": dict(self.skipped)}

    def result(self) -> CorefResult:
        return CorefResult(self.table(), self.counts(), self.preceding_only, list(self.views))

    def columns(self) -> pd.DataFrame:
        """``coref_accuracy`` per head, for heads.csv."""
        t = self.table()
        t = t[t["kind"] == "head"]
        return pd.DataFrame({"layer": t["layer"].astype(int).to_numpy(), "head": t["head"].astype(int).to_numpy(),
                             "coref_accuracy": t["accuracy"].to_numpy()})

    def head_labels(self) -> list[tuple[int, int, str, float]]:
        """``coreference`` for heads whose interval's lower end beats the best baseline."""
        res = self.result()
        best = res.best_baseline()
        if np.isnan(best):
            return []
        return [(int(r.layer), int(r.head), "coreference", float(r.ci_low / best) if best > 0 else float("inf"))
                for r in res.labelled().itertuples()]
