"""Decoder circuits (docs/statistics.md): induction / duplicate-token / previous-token scores on repeated
random tokens, checked on hand-built patterns, on a tiny decoder with a planted induction head and a
planted duplicate-token head (hand-computed scores), against TransformerLens' ``detect_head`` ("mul")
on the same patterns where TransformerLens is installed, and the attention sinks against a plain
Hugging Face forward pass."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import probe.capture.reference.swap as swap_module
from conftest import bpe_tokenizer, tiny_model
from probe.capture.reference import ReferenceAttention
from probe.capture.reference.swap import swap_attention
from probe.errors import InputError, UnsupportedAnalysisError
from probe.measures.accumulators import Accumulator
from probe.patterns import circuit_probe, repeated_random_tokens
from probe.patterns.circuits import CircuitScores, ids_batch, random_vocabulary
from probe.runs.analysis import analyze, run
from probe.sites import Site
from probe.text.inputs import Text

N = 25


# --------------------------------------------------------------------------- the input

def test_repeated_random_tokens():
    tok = bpe_tokenizer()
    ids, offset = repeated_random_tokens(tok)
    assert ids.shape == (16, 50) and offset == 0  # the test tokenizer, like SmolLM2's, adds no BOS
    assert torch.equal(ids[:, :N], ids[:, N:])
    assert all(len(set(row[:N].tolist())) == N for row in ids)  # distinct within a sequence
    special = set(tok.all_special_ids)
    assert not special & set(random_vocabulary(tok).tolist()) and not special & set(ids.flatten().tolist())
    # the test tokenizer's 3 special tokens (<|endoftext|>, <|im_start|>, <|im_end|>) are ids 0-2
    assert random_vocabulary(tok).tolist() == list(range(3, len(tok)))
    assert torch.equal(ids, repeated_random_tokens(tok)[0])  # fixed seed
    assert not torch.equal(ids, repeated_random_tokens(tok, seed=1)[0])
    with_bos, offset = repeated_random_tokens(tok, bos=True)
    assert offset == 1 and (with_bos[:, 0] == tok.bos_token_id).all() and torch.equal(with_bos[:, 1:], ids)
    with pytest.raises(InputError, match="n >= 2"):
        repeated_random_tokens(tok, n=1)


# --------------------------------------------------------------------------- hand-built patterns

def pattern(kind: str, n: int, offset: int, batch: int = 2) -> torch.Tensor:
    """[batch, 1, T, T]: second-half rows put ``w`` on the target key and 1 - w on the query itself
    (w = 0.75 induction, 0.5 duplicate); first-half rows attend to themselves."""
    T = offset + 2 * n
    A = torch.eye(T).repeat(batch, 1, 1, 1)
    for t in range(n, 2 * n):
        p = t + offset
        key = {"induction": p - n + 1, "duplicate": p - n, "previous": p - 1}[kind]
        w = {"induction": 0.75, "duplicate": 0.5, "previous": 0.25}[kind]
        A[:, 0, p, p] = 1 - w
        A[:, 0, p, key] = w
    return A


@pytest.mark.parametrize("offset", [0, 1])
def test_scores_on_hand_built_patterns(offset):
    site = Site("decoder", 0, causal=True)
    n = 6
    batch = ids_batch([[1] * (offset + 2 * n)] * 2, 0, [Text("a"), Text("b")], bool(offset))
    for kind, want in (("induction", (0.75, 0, 0)), ("duplicate", (0, 0.5, 0)), ("previous", (0, 0, 0.25))):
        acc = CircuitScores([site], 1, n, offset)
        acc.begin_batch(batch)
        acc.update(site, pattern(kind, n, offset), batch)
        got = acc.result()[["induction", "duplicate", "prev_random"]].to_numpy()[0]
        np.testing.assert_allclose(got, want, atol=1e-12)
        assert acc.rows == 2 * n


# --------------------------------------------------------------------------- planted heads in a tiny model

E_BETA = 30.0  # a planted head's score on the matching key is ln(30): weight 30 there, 1 on every other key
PLANTED = {0: (1, "duplicate"), 1: (2, "induction")}  # layer -> (head, kind)
IDS: dict = {}


class Planted(ReferenceAttention):
    """The from-scratch attention, with one head per planted layer replaced by an exact induction or
    duplicate-token pattern: score ln(30) on the key that matches, 0 on the other visible keys."""

    def forward(self, hidden_states, *args, **kwargs):
        y, probs = super().forward(hidden_states, *args, **kwargs)
        if self.layer_idx not in PLANTED:
            return y, probs
        head, kind = PLANTED[self.layer_idx]
        ids = IDS["ids"]  # [batch, T]
        T = ids.shape[1]
        if kind == "induction":  # key j follows an earlier copy of the query's token: ids[j - 1] == ids[t]
            match = torch.zeros(ids.shape[0], T, T, dtype=torch.bool)
            match[:, :, 1:] = ids[:, None, :-1] == ids[:, :, None]
        else:  # duplicate: an earlier copy of the query's token itself
            match = (ids[:, None, :] == ids[:, :, None]) & torch.ones(T, T, dtype=torch.bool).tril(-1)
        scores = match.float() * math.log(E_BETA)
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        probs = probs.clone()
        probs[:, head] = scores.softmax(-1)
        return y, probs


@pytest.fixture
def planted(monkeypatch):
    """A tiny LLaMA whose head 2 of layer 1 is an induction head and head 1 of layer 0 a duplicate-token head."""
    lm = tiny_model("llama")
    monkeypatch.setattr(swap_module, "mutant_class", lambda name: Planted)
    handle = lm.model.register_forward_pre_hook(lambda m, a, kw: IDS.update(ids=kw["input_ids"]), with_kwargs=True)
    with swap_attention(lm, "planted"):
        yield lm
    handle.remove()


def hand_score(n: int, offset: int) -> float:
    """Mean over the second-half rows of 30 / (30 + p): the matching key's weight at position p,
    which sees p + 1 keys (one matching)."""
    return float(np.mean([E_BETA / (E_BETA + t + offset) for t in range(n, 2 * n)]))


def hand_other(n: int, offset: int) -> float:
    """Weight of one non-matching key: 1 / (30 + p)."""
    return float(np.mean([1 / (E_BETA + t + offset) for t in range(n, 2 * n)]))


def test_planted_heads_get_hand_computed_scores_and_labels(planted):
    probe = circuit_probe(planted)
    scores = probe.result().scores.set_index(["layer", "head"])
    assert scores.loc[(1, 2), "induction"] == pytest.approx(hand_score(N, 0), abs=1e-6)
    assert scores.loc[(1, 2), "duplicate"] == pytest.approx(hand_other(N, 0), abs=1e-6)
    assert scores.loc[(1, 2), "prev_random"] == pytest.approx(hand_other(N, 0), abs=1e-6)
    assert scores.loc[(0, 1), "duplicate"] == pytest.approx(hand_score(N, 0), abs=1e-6)
    assert scores.loc[(0, 1), "induction"] == pytest.approx(hand_other(N, 0), abs=1e-6)
    res = analyze(planted, ["The cat sat on the mat."], n_examples=0, finished=[probe])
    heads = res.heads.set_index(["layer", "head"])
    assert hand_score(N, 0) > 0.4  # so the default thresholds label them
    labels = heads["labels"].str.split(";")
    # on text without repeats the planted heads are also uniform (broad), which ranks first
    assert "induction" in labels[(1, 2)] and "duplicate-token" in labels[(0, 1)]
    assert not labels.drop([(1, 2), (0, 1)]).apply(lambda x: "induction" in x or "duplicate-token" in x).any()
    stricter = analyze(planted, ["The cat sat on the mat."], n_examples=0, finished=[probe],
                       thresholds={"induction": 0.5})
    assert "induction" not in stricter.heads.set_index(["layer", "head"]).loc[(1, 2), "labels"].split(";")
    assert res.results["circuits"].settings == {"n": 25, "batch": 16, "seed": 0, "bos": False,
                                                "bos_token": "<|im_start|>", "sink_texts": 16, "sink_source": "random"}


class Maps(Accumulator):
    """Keeps every site's attention probabilities (for the comparison with TransformerLens)."""

    name = "maps"

    def __init__(self):
        self.maps = {}

    def update(self, site, probs, batch):
        self.maps[site.layer] = probs.detach().clone()


def head_detector():
    """TransformerLens' head detector, or a skip. TransformerLens is not a dependency (it pulls another
    torch); to run these tests: python -m venv --system-site-packages /tmp/tlvenv, then
    /tmp/tlvenv/bin/pip install --no-deps transformer_lens einops jaxtyping wadler_lindig datasets dill
    multiprocess pyarrow xxhash fsspec, and run pytest with /tmp/tlvenv/bin/python."""
    return pytest.importorskip("transformer_lens.head_detector",
                               reason="TransformerLens is not installed (see tests/test_circuits.py head_detector)")


def transformer_lens_scores(maps: dict, ids: torch.Tensor, n_layers: int, n_heads: int) -> dict:
    """TransformerLens' detect_head ("mul") per sequence on the given patterns, averaged over sequences."""
    detector = head_detector()
    out = {}
    for name in ("induction_head", "duplicate_token_head"):
        per_seq = []
        for b in range(ids.shape[0]):
            stub = SimpleNamespace(cfg=SimpleNamespace(device="cpu", n_layers=n_layers, n_heads=n_heads, n_ctx=4096,
                                                       dtype=torch.float32),
                                   to_tokens=lambda seq, b=b: ids[b:b + 1])
            cache = {("pattern", layer, "attn"): maps[layer][b].float() for layer in range(n_layers)}
            per_seq.append(detector.detect_head(stub, "probe", name, cache=cache, error_measure="mul"))
        out[name] = torch.stack(per_seq).mean(0).numpy()
    return out


def compare_with_transformer_lens(lm, offset: int = 0) -> None:
    head_detector()  # skip before any forward pass
    ids, offset = repeated_random_tokens(lm.tokenizer, bos=bool(offset))
    maps = Maps()
    scores = CircuitScores(lm.sites, lm.geometry.n_heads, N, offset)
    run(lm, [ids_batch(ids.tolist(), 0, [Text(str(i)) for i in range(len(ids))], bool(offset))], [scores, maps])
    L, H = lm.geometry.n_layers, lm.geometry.n_heads
    tl = transformer_lens_scores(maps.maps, ids, L, H)
    ours = scores.result()
    T = ids.shape[1]
    # detect_head divides by all T rows; the probe averages over the n second-half rows
    for column, name in (("induction", "induction_head"), ("duplicate", "duplicate_token_head")):
        np.testing.assert_allclose(ours[column].to_numpy().reshape(L, H) * N / T, tl[name], atol=1e-6)


@pytest.mark.parametrize("offset", [0, 1])
def test_planted_scores_equal_transformer_lens_detect_head(planted, offset):
    compare_with_transformer_lens(planted, offset)


@pytest.mark.slow
def test_smollm2_scores_equal_transformer_lens_detect_head(smollm2):
    compare_with_transformer_lens(smollm2)


# --------------------------------------------------------------------------- attention sinks

def test_sinks_equal_a_plain_forward_with_and_without_bos():
    lm = tiny_model("llama")
    texts = ["The cat sat on the mat.", "Birds sing in the morning and fly away.", "Why not?"]
    probe = circuit_probe(lm, sink_texts=texts).result()
    assert probe.settings["sink_source"] == "corpus" and probe.settings["sink_texts"] == 3
    bos = lm.tokenizer.bos_token_id
    for column, prefix in (("without_bos", []), ("with_bos", [bos])):
        sums, rows = np.zeros(lm.geometry.n_layers), 0
        for text in texts:
            ids = torch.tensor([prefix + lm.tokenizer(text)["input_ids"]])
            with torch.no_grad():
                att = lm.model(input_ids=ids, output_attentions=True, use_cache=False).attentions
            sums += [float(a[0, :, 1:, 0].sum()) for a in att]
            rows += (ids.shape[1] - 1) * lm.geometry.n_heads
        np.testing.assert_allclose(probe.sinks[column].to_numpy(), sums / rows, atol=1e-6)


def test_encoders_have_no_circuit_probe():
    with pytest.raises(UnsupportedAnalysisError, match="^the induction / duplicate-token probe is for decoder models; "
                                                       ".* is an encoder model$"):
        circuit_probe(tiny_model("bert"))
