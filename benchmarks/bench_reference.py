"""Benchmark: probe's from-scratch attention (swapped in) vs Hugging Face eager vs sdpa, side by side.

For each model, one batch (default 16 sequences x 128 tokens, no padding) is run through the same
weights three ways, interleaved (the order rotates every repeat) after a few warm-up passes:

  - ``swapped``: every attention module replaced by :class:`probe.capture.reference.ReferenceAttention`
    (the model's config left on eager, as ``probe verify`` runs it);
  - ``eager``:   Hugging Face's eager attention (returns probabilities, like the swapped one);
  - ``sdpa``:    Hugging Face with ``torch.nn.functional.scaled_dot_product_attention`` (no probabilities).

Prints median wall time per forward pass (seconds) and the ratios swapped/eager, swapped/sdpa and
eager/sdpa. Target (issue 3): swapped <= 1.3 x eager. No assertions: timings depend on the machine.

Usage: python benchmarks/bench_reference.py [--models minilm smollm2] [--batch 16] [--tokens 128]
       [--repeats 7] [--warmup 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

TEXT = ("Attention lets every token look at every other token of the sequence and take a weighted average "
        "of their values; some heads look at the previous token, some at the first token, some at "
        "punctuation, and some spread their attention broadly over the whole sentence. ")


def make_batch(lm, batch: int, tokens: int) -> dict:
    """[batch, tokens] of real text (each row starts at a different word), all real tokens."""
    words = (TEXT * (tokens // 8 + 4)).split()
    texts = [" ".join(words[i * 3:]) for i in range(batch)]
    enc = lm.tokenizer(texts, return_tensors="pt", truncation=True, max_length=tokens, padding="max_length")
    assert enc["input_ids"].shape == (batch, tokens) and bool(enc["attention_mask"].all())
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if lm.kind != "encoder":
        inputs["use_cache"] = False
    return inputs


def bench(name: str, batch: int, tokens: int, repeats: int, warmup: int) -> dict:
    from probe.capture.reference.swap import swap_attention
    from probe.loading.models import load_model

    lm = load_model(name)
    model = lm.model
    inputs = make_batch(lm, batch, tokens)

    def run(mode: str) -> float:
        model.set_attn_implementation("sdpa" if mode == "sdpa" else "eager")
        with torch.no_grad():
            if mode == "swapped":
                with swap_attention(lm):
                    start = time.perf_counter()
                    model(**inputs)
                    return time.perf_counter() - start
            start = time.perf_counter()
            model(**inputs)
            return time.perf_counter() - start

    modes = ["swapped", "eager", "sdpa"]
    for mode in modes:
        for _ in range(warmup):
            run(mode)
    times = {mode: [] for mode in modes}
    for r in range(repeats):
        order = modes[r % 3:] + modes[:r % 3]  # rotate so no mode always runs first
        for mode in order:
            times[mode].append(run(mode))
    model.set_attn_implementation("eager")
    med = {mode: statistics.median(t) for mode, t in times.items()}
    return {"model": name, "layers": lm.geometry.n_layers, "heads": lm.geometry.n_heads, "median": med,
            "min": {mode: min(t) for mode, t in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["minilm", "smollm2"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {args.batch} x {args.tokens} tokens, "
          f"{args.repeats} interleaved repeats after {args.warmup} warm-up passes; median seconds per forward")
    print(f"{'model':<10}{'swapped':>10}{'eager':>10}{'sdpa':>10}{'swap/eager':>12}{'swap/sdpa':>11}{'eager/sdpa':>12}")
    for name in args.models:
        res = bench(name, args.batch, args.tokens, args.repeats, args.warmup)
        m = res["median"]
        print(f"{name:<10}{m['swapped']:>10.3f}{m['eager']:>10.3f}{m['sdpa']:>10.3f}"
              f"{m['swapped'] / m['eager']:>12.2f}{m['swapped'] / m['sdpa']:>11.2f}{m['eager'] / m['sdpa']:>12.2f}",
              flush=True)
    print("target: swap/eager <= 1.3")


if __name__ == "__main__":
    main()
