"""Kobayashi et al. 2020 (sec. 4) on probe's embedded models: do the heavily attended stripes move little?

For each layer, the mean over heads of ``first``, ``sep`` and ``punct`` (attention weight) next to
``first_by_norm``, ``sep_by_norm`` and ``punct_by_norm`` (the value-weighted map), each a
token-weighted corpus value with a 95% bootstrap interval over sentences (sentences resampled with
replacement). The claim holds for a stripe s when s_by_norm / s <= 0.5 in every layer whose mean s
is >= 0.2 (and at least one layer has mean s >= 0.2). On a decoder, the same for ``first`` on the
heads whose primary label is ``first-token`` (attention sinks).

    OMP_NUM_THREADS=1 python benchmarks/kobayashi_norm.py --model minilm --sentences 300
    OMP_NUM_THREADS=1 python benchmarks/kobayashi_norm.py --model smollm2 --sentences 100
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from probe import load_model
from probe.measures.stats import INDEX, HeadStatistics
from probe.runs.analysis import analyze
from probe.text.corpus import read_corpus

#: The shared data folder beside the repository root (a worktree elsewhere: PROBE_SHARED_DATA).
SHARED_DATA = Path(os.environ.get("PROBE_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
UD_DEV = SHARED_DATA / "ud-ewt" / "en_ewt-ud-dev.conllu"
STRIPES = ("first", "sep", "punct")


class PerSentence(HeadStatistics):
    """Value-weighted statistics kept per batch (one sentence a batch with batch_size=1)."""

    name = "per_sentence"

    def __init__(self, sites, n_heads, tokenizer) -> None:
        super().__init__(sites, n_heads, tokenizer, value_weighted=True)
        self.records: list[tuple[np.ndarray, ...]] = []

    def begin_batch(self, batch) -> None:
        for t in (self.sums, self.counts, self.norm_sums, self.norm_counts, self.mass_sums):
            t.zero_()

    def end_batch(self, batch) -> None:
        idx = [INDEX[s] for s in STRIPES]
        self.records.append((self.sums[:, :, idx].numpy().copy(), self.counts[:, idx].numpy().copy(),
                             self.norm_sums[:, :, idx].numpy().copy(), self.norm_counts[:, :, idx].numpy().copy()))

    def result(self):
        return [np.stack(parts) for parts in zip(*self.records)]  # [N, L, H, 3], [N, L, 3], [N, L, H, 3] x2


def layer_means(parts, picks, heads_mask=None):
    """[L, 3] weight and norm means over heads (or over the heads of ``heads_mask`` [L, H]) of the
    token-weighted values over the sentences ``picks``."""
    s, c, ns, nc = (p[picks].sum(0) for p in parts)
    w = s / np.maximum(c[:, None, :], 1)
    w[np.broadcast_to(c[:, None, :] == 0, w.shape)] = np.nan
    n = ns / np.maximum(nc, 1)
    n[nc == 0] = np.nan
    if heads_mask is not None:
        w, n = np.where(heads_mask[..., None], w, np.nan), np.where(heads_mask[..., None], n, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN layer (no sep token) stays NaN
        return np.nanmean(w, axis=1), np.nanmean(n, axis=1)


def intervals(parts, n_boot: int, seed: int, heads_mask=None):
    """Point values and 2.5/97.5 percentiles over bootstrap resamples of sentences."""
    N = parts[0].shape[0]
    rng = np.random.default_rng(seed)
    point = layer_means(parts, np.arange(N), heads_mask)
    boots = [layer_means(parts, rng.integers(0, N, N), heads_mask) for _ in range(n_boot)]
    bw, bn = np.stack([b[0] for b in boots]), np.stack([b[1] for b in boots])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return point, (np.nanpercentile(bw, [2.5, 97.5], axis=0), np.nanpercentile(bn, [2.5, 97.5], axis=0))


def verdict(w: np.ndarray, n: np.ndarray) -> str:
    """The claim for one stripe from per-layer means w, n [L]."""
    tested = np.flatnonzero(np.nan_to_num(w) >= 0.2)
    if tested.size == 0:
        return "no layer with mean >= 0.2: nothing to test"
    ratios = n[tested] / w[tested]
    held = bool((ratios <= 0.5).all())
    return (f"{'REPRODUCED' if held else 'NOT reproduced'}: ratio {ratios.min():.2f}-{ratios.max():.2f} "
            f"in layers {', '.join(map(str, tested))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--sentences", type=int, default=300)
    ap.add_argument("--bootstrap", type=int, default=1000)
    args = ap.parse_args()
    torch.manual_seed(0)
    lm = load_model(args.model)
    texts = read_corpus(UD_DEV, limit=args.sentences)
    acc = PerSentence(lm.sites, lm.geometry.n_heads, lm.tokenizer)
    t = time.perf_counter()
    result = analyze(lm, texts, batch_size=1, n_examples=0, accumulators=[acc])
    seconds = time.perf_counter() - t
    parts = result.results["per_sentence"]
    print(f"{args.model}: {len(texts)} UD EWT dev sentences, {result.counts['tokens']} tokens, "
          f"{datetime.date.today()}, {platform.machine()} {torch.get_num_threads()} thread(s), {seconds:.0f} s")
    (w, n), (wi, ni) = intervals(parts, args.bootstrap, 0)
    print("layer | " + " | ".join(f"{s} [95%] -> {s}_by_norm [95%]" for s in STRIPES))
    for layer in range(w.shape[0]):
        cells = [f"{w[layer, k]:.3f} [{wi[0, layer, k]:.3f}, {wi[1, layer, k]:.3f}] -> "
                 f"{n[layer, k]:.3f} [{ni[0, layer, k]:.3f}, {ni[1, layer, k]:.3f}]" for k in range(len(STRIPES))]
        print(f"{layer} | " + " | ".join(cells))
    for k, s in enumerate(STRIPES):
        print(f"{s}: {verdict(w[:, k], n[:, k])}")
    sinks = (result.heads["label"] == "first-token").to_numpy().reshape(w.shape[0], -1)
    if sinks.any():
        (sw, sn), (swi, sni) = intervals(parts, args.bootstrap, 1, sinks)
        all_mask = np.broadcast_to(sinks[..., None], parts[0].shape[1:])
        s, c, ns, nc = (p.sum(0) for p in parts)
        fw = (s[..., 0] / np.maximum(c[:, None, 0], 1))[all_mask[..., 0]]
        fn = (ns[..., 0] / np.maximum(nc[..., 0], 1))[all_mask[..., 0]]
        print(f"first-token heads (primary label): {int(sinks.sum())} of {sinks.size}; mean over them "
              f"first {fw.mean():.3f} -> first_by_norm {fn.mean():.3f} (ratio {fn.mean() / fw.mean():.2f}; "
              f"per head ratio median {np.median(fn / fw):.2f}, max {np.max(fn / fw):.2f})")
        for layer in np.flatnonzero(sinks.any(1)):
            print(f"  layer {layer} ({int(sinks[layer].sum())} sink heads): first {sw[layer, 0]:.3f} "
                  f"[{swi[0, layer, 0]:.3f}, {swi[1, layer, 0]:.3f}] -> first_by_norm {sn[layer, 0]:.3f} "
                  f"[{sni[0, layer, 0]:.3f}, {sni[1, layer, 0]:.3f}]")
        print(f"first on sink heads: {verdict(sw[:, 0], sn[:, 0])}")


if __name__ == "__main__":
    main()
