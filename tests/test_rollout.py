"""Attention rollout and attention flow (probe.measures.rollout, probe.measures.flow).

Hand cases: small fixed maps (3-4 tokens, 2 layers, 2 heads) whose expected values are computed
here independently, with exact fractions and explicit loops; the wrong variants (a reversed
product, no residual share) must give other numbers, so a test would catch them. Model cases:
tiny models of each kind of stack (encoder, decoders, encoder-decoder), padding, removed heads,
the flow length limit; the embedded models in one slow test.
"""

from __future__ import annotations

from fractions import Fraction as Fr

import networkx as nx
import numpy as np
import pytest
import torch
from networkx.algorithms.flow import edmonds_karp, preflow_push
from scipy.optimize import linprog

import probe
from conftest import FAMILIES, tiny_model
from probe.errors import InputError, ProbeError
from probe.measures.flow import MAX_FLOW_TOKENS, flow_values, normalise_rows
from probe.measures.maxflow import ROUNDS, LayeredGraph
from probe.measures.rollout import residual_maps, rollout_matrix

# --------------------------------------------------------------------------- hand-made maps

#: [layer][head][query][key], 3 tokens, every row sums to 1 (an encoder's dense maps).
DENSE = [
    [[[Fr(1, 2), Fr(1, 4), Fr(1, 4)], [Fr(1, 3), Fr(1, 3), Fr(1, 3)], [Fr(0), Fr(1, 2), Fr(1, 2)]],
     [[Fr(1), Fr(0), Fr(0)], [Fr(0), Fr(1, 2), Fr(1, 2)], [Fr(1, 4), Fr(1, 4), Fr(1, 2)]]],
    [[[Fr(0), Fr(0), Fr(1)], [Fr(1, 2), Fr(0), Fr(1, 2)], [Fr(1, 3), Fr(2, 3), Fr(0)]],
     [[Fr(1, 2), Fr(1, 2), Fr(0)], [Fr(0), Fr(1), Fr(0)], [Fr(1), Fr(0), Fr(0)]]],
]

#: 4 tokens, lower-triangular rows (a causal stack).
CAUSAL = [
    [[[Fr(1), 0, 0, 0], [Fr(1, 2), Fr(1, 2), 0, 0], [Fr(1, 3), Fr(1, 3), Fr(1, 3), 0],
      [Fr(1, 2), 0, 0, Fr(1, 2)]],
     [[Fr(1), 0, 0, 0], [Fr(1), Fr(0), 0, 0], [Fr(0), Fr(1, 4), Fr(3, 4), 0],
      [Fr(1, 4), Fr(1, 4), Fr(1, 4), Fr(1, 4)]]],
    [[[Fr(1), 0, 0, 0], [Fr(0), Fr(1), 0, 0], [Fr(1, 2), Fr(0), Fr(1, 2), 0], [Fr(1), 0, 0, 0]],
     [[Fr(1), 0, 0, 0], [Fr(1, 4), Fr(3, 4), 0, 0], [Fr(0), Fr(1), Fr(0), 0],
      [Fr(0), Fr(1, 3), Fr(1, 3), Fr(1, 3)]]],
]


def as_array(maps) -> np.ndarray:
    return np.array([[[[float(x) for x in row] for row in head] for head in layer] for layer in maps])


def tilde_by_hand(maps) -> list[list[list[Fr]]]:
    """A~_l[i][j] = (mean over heads of A_l[i][j]) / 2 + (1/2 if i == j), then each row divided by its sum."""
    out = []
    for layer in maps:
        H, T = len(layer), len(layer[0])
        rows = []
        for i in range(T):
            row = [sum(Fr(layer[h][i][j]) for h in range(H)) / H / 2 + (Fr(1, 2) if i == j else 0) for j in range(T)]
            s = sum(row)
            rows.append([x / s for x in row])
        out.append(rows)
    return out


def matmul(a, b):
    n, m, p = len(a), len(b), len(b[0])
    return [[sum(a[i][k] * b[k][j] for k in range(m)) for j in range(p)] for i in range(n)]


def rollout_by_hand(tildes):
    """R = A~_L ... A~_1: start from layer 1 and multiply each later layer on the left."""
    r = tildes[0]
    for t in tildes[1:]:
        r = matmul(t, r)
    return r


def to_float(m) -> np.ndarray:
    return np.array([[float(x) for x in row] for row in m])


@pytest.mark.parametrize("maps", [DENSE, CAUSAL], ids=["dense", "causal"])
def test_rollout_equals_the_hand_computation_and_wrong_variants_differ(maps):
    tildes = tilde_by_hand(maps)
    expected = to_float(rollout_by_hand(tildes))
    got = rollout_matrix(residual_maps(as_array(maps)))
    np.testing.assert_allclose(residual_maps(as_array(maps)), np.array([to_float(t) for t in tildes]), atol=1e-15)
    np.testing.assert_allclose(got, expected, atol=1e-15)
    np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-6)
    # the hand maps tell the right definition from the usual mistakes
    reversed_product = to_float(matmul(tildes[0], tildes[1]))  # A~_1 A~_2
    means = [[[sum(Fr(layer[h][i][j]) for h in range(2)) / 2 for j in range(len(layer[0]))]
              for i in range(len(layer[0]))] for layer in maps]
    no_residual = to_float(matmul(means[1], means[0]))  # mean_h A_2 mean_h A_1, no 0.5 I
    assert np.abs(reversed_product - expected).max() > 0.01
    assert np.abs(no_residual - expected).max() > 0.01
    assert np.abs(got - reversed_product).max() > 0.01 and np.abs(got - no_residual).max() > 0.01


def test_rollout_of_the_dense_maps_by_paper_and_pencil():
    """Row 0 of the dense case, worked by hand. Layer 1: mean_h rows (3/4, 1/8, 1/8), (1/6, 5/12, 5/12),
    (1/8, 3/8, 1/2); halved plus half the identity: A~_1 rows (7/8, 1/16, 1/16), (1/12, 17/24, 5/24),
    (1/16, 3/16, 3/4). Layer 2 row 0: mean_h (1/4, 1/4, 1/2), so A~_2 row 0 = (5/8, 1/8, 1/4).
    R[0, 0] = 5/8 * 7/8 + 1/8 * 1/12 + 1/4 * 1/16 = 55/96; R[0, 1] = 5/8 * 1/16 + 1/8 * 17/24 + 1/4 * 3/16
    = 67/384; R[0, 2] = 1 - 55/96 - 67/384 = 97/384."""
    r = rollout_matrix(residual_maps(as_array(DENSE)))
    np.testing.assert_allclose(r[0], [55 / 96, 67 / 384, 97 / 384], atol=1e-15)
    wrong = residual_maps(as_array(DENSE))[0] @ residual_maps(as_array(DENSE))[1]  # A~_1 A~_2
    assert abs(wrong[0, 0] - 55 / 96) > 1e-3


def test_causal_rollout_keeps_exact_zeros_above_the_diagonal():
    r = rollout_matrix(residual_maps(as_array(CAUSAL)))
    assert (np.triu(r, 1) == 0).all() and (np.diag(r) > 0).all()


def test_removed_heads_are_left_out_of_the_mean_and_a_layer_without_heads_is_the_identity():
    probs = as_array(DENSE)
    pruned = probs.copy()
    pruned[0, 1] = np.nan  # layer 1 keeps head 0 only
    one_head = [[DENSE[0][0]], DENSE[1]]
    expected = to_float(rollout_by_hand(tilde_by_hand(one_head)))
    np.testing.assert_allclose(rollout_matrix(residual_maps(pruned)), expected, atol=1e-15)
    pruned[0, 0] = np.nan  # layer 1 has no head left: only layer 2 mixes
    np.testing.assert_allclose(rollout_matrix(residual_maps(pruned)), to_float(tilde_by_hand(DENSE)[1]), atol=1e-15)


# --------------------------------------------------------------------------- flow on hand-made maps

def test_two_layer_flow_equals_the_sum_of_path_bottlenecks():
    """With two layers every path (2, i) -> (1, k) -> (0, j) has its own pair of edges, so the maximum
    flow is sum_k min(A~_2[i, k], A~_1[k, j]) exactly."""
    for maps in (DENSE, CAUSAL):
        t1, t2 = tilde_by_hand(maps)
        T = len(t1)
        expected = [[sum(min(t2[i][k], t1[k][j]) for k in range(T)) for j in range(T)] for i in range(T)]
        raw = flow_values(residual_maps(as_array(maps)))
        np.testing.assert_allclose(raw, to_float(expected), atol=1e-12)
        flow = normalise_rows(raw)
        np.testing.assert_allclose(flow.sum(1), 1.0, atol=1e-6)
        assert np.abs(flow - rollout_matrix(residual_maps(as_array(maps)))).max() > 0.01  # not rollout


def independent_flow(tilde: np.ndarray, i: int, j: int) -> float:
    """Max flow from (L, i) to (0, j) on a graph built here, by networkx's Edmonds-Karp (fresh each call)."""
    L, T, _ = tilde.shape
    G = nx.DiGraph()
    for l in range(L, 0, -1):
        for a in range(T):
            for b in range(T):
                if tilde[l - 1][a][b] > 0:
                    G.add_edge(f"{l}:{a}", f"{l - 1}:{b}", capacity=float(tilde[l - 1][a][b]))
    if f"0:{j}" not in G or f"{L}:{i}" not in G or not nx.has_path(G, f"{L}:{i}", f"0:{j}"):
        return 0.0
    return nx.maximum_flow_value(G, f"{L}:{i}", f"0:{j}", flow_func=edmonds_karp)


def lp_flow(tilde: np.ndarray, i: int, j: int) -> float:
    """The same max flow as a linear programme (scipy linprog): a variable per edge, 0 <= f <= capacity,
    conservation at every inner node, maximise what leaves the source."""
    L, T, _ = tilde.shape
    edges = [(l, a, b) for l in range(1, L + 1) for a in range(T) for b in range(T)]
    node = {(l, t): n for n, (l, t) in enumerate((l, t) for l in range(L + 1) for t in range(T))}
    A = np.zeros((len(node), len(edges)))
    for e, (l, a, b) in enumerate(edges):
        A[node[(l, a)], e] -= 1  # leaves (l, a)
        A[node[(l - 1, b)], e] += 1  # enters (l - 1, b)
    inner = [n for (l, t), n in node.items() if (l, t) not in ((L, i), (0, j))]
    cost = np.array([-1.0 if (l == L and a == i) else 0.0 for l, a, _ in edges])
    res = linprog(cost, A_eq=A[inner], b_eq=np.zeros(len(inner)),
                  bounds=[(0, tilde[l - 1, a, b]) for l, a, b in edges], method="highs")
    return -res.fun


def three_layer_maps(causal: bool) -> np.ndarray:
    rng = np.random.default_rng(7)
    probs = rng.random((3, 2, 4, 4)) ** 3
    if causal:
        probs = np.tril(probs)
    return probs / probs.sum(-1, keepdims=True)


@pytest.mark.parametrize("causal", [False, True])
def test_flow_equals_an_independent_max_flow_and_a_linear_programme(causal):
    tilde = residual_maps(three_layer_maps(causal))
    raw = flow_values(tilde)
    T = tilde.shape[-1]
    for i in range(T):
        for j in range(T):
            assert raw[i, j] == pytest.approx(independent_flow(tilde, i, j), abs=1e-12)
    for i, j in ((0, 0), (3, 1), (2, 2)):
        assert raw[i, j] == pytest.approx(lp_flow(tilde, i, j), abs=1e-7)
    assert (raw <= 1 + 1e-12).all()
    if causal:
        assert (np.triu(raw, 1) == 0).all()
    assert np.isnan(flow_values(tilde, rows=[2])[[0, 1, 3]]).all()
    np.testing.assert_array_equal(flow_values(tilde, rows=[2])[2], raw[2])


def test_flow_values_below_the_integer_resolution_are_exact(monkeypatch):
    """The compiled solver works on int32 capacities (resolution 2^-30 of the flow); the refinement
    rounds must recover differences far below that. Two layers: F[0, 0] = sum_k min(A~_2[0, k], A~_1[k, 0])
    exactly, with every pair differing by 1e-13 (one rounding at 2^-30 would be off by up to ~1e-9)."""
    eps = 1e-13
    tilde = np.zeros((2, 3, 3))
    tilde[1, 0] = [0.3, 0.3 + eps, 0.4 - eps]
    tilde[0, :, 0] = [0.3 + eps, 0.3, 0.4 - 2 * eps]
    tilde[0, :, 1] = [0.1, 0.2, 0.3]
    expected = sum(min(tilde[1, 0, k], tilde[0, k, 0]) for k in range(3))

    def no_fallback(self, source, sink):
        raise AssertionError("the refinement did not converge")
    monkeypatch.setattr(LayeredGraph, "_networkx", no_fallback)
    raw = flow_values(tilde, rows=[0])
    assert abs(raw[0, 0] - expected) <= 1e-15
    assert abs(raw[0, 1] - 0.6) <= 1e-15
    assert raw[0, 2] == 0.0  # no edge into (0, 2)
    monkeypatch.setattr("probe.measures.maxflow.ROUNDS", 1)  # a single rounding is not enough: the fallback runs
    with pytest.raises(AssertionError, match="did not converge"):
        flow_values(tilde, rows=[0])
    assert ROUNDS >= 3


@pytest.mark.parametrize("causal", [False, True])
def test_flow_equals_networkx_preflow_push_on_larger_random_maps(causal):
    """5 layers x 9 tokens, every pair (i, j): the compiled solver against networkx's preflow-push on a
    graph built here, within 1e-12 (the certified bound is 1e-15 + 1e-12 * F)."""
    rng = np.random.default_rng(3)
    probs = rng.random((5, 3, 9, 9)) ** 4
    if causal:
        probs = np.tril(probs)
    tilde = residual_maps(probs / probs.sum(-1, keepdims=True))
    raw = flow_values(tilde)
    G = nx.DiGraph()
    for l in range(5, 0, -1):
        for a in range(9):
            for b in range(9):
                if tilde[l - 1, a, b] > 0:
                    G.add_edge((l, a), (l - 1, b), capacity=float(tilde[l - 1, a, b]))
    for i in range(9):
        for j in range(9):
            if causal and j > i:
                assert raw[i, j] == 0.0
                continue
            expected = nx.maximum_flow_value(G, (5, i), (0, j), flow_func=preflow_push)
            assert raw[i, j] == pytest.approx(expected, abs=1e-12)


# --------------------------------------------------------------------------- tiny models

TEXTS = ["The quick brown fox jumps over the lazy dog.", "A cat sat."]
KINDS = ("bert", "gpt2", "llama", "t5", "bart")


@pytest.fixture(scope="module")
def tiny():
    cache = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = tiny_model(kind)
        return cache[kind]
    return get


def is_enc_dec(lm) -> bool:
    return lm.kind == "encoder-decoder"


def decoder_only(lm) -> bool:
    return lm.kind == "decoder"


def rollout_from_capture(lm, text: str) -> tuple[np.ndarray, list[str]]:
    """Rollout computed here from capture_attention's maps: the stack's self-attention sites, heads averaged,
    plus the identity, halved, multiplied last layer on the left. Encoder-decoder: a target is given."""
    enc_dec = is_enc_dec(lm)
    captured = probe.capture_attention(lm, [probe.Text(text, target="Ein Satz.") if enc_dec else text])
    stack = "decoder" if decoder_only(lm) else "encoder"
    sites = [s for s in lm.sites if s.stack == stack and s.kind == "self"]
    n = int(captured.batch.lengths[0])
    r = torch.eye(n, dtype=torch.float64)
    for s in sites:
        a = 0.5 * captured[s][0, :, :n, :n].double().mean(0) + 0.5 * torch.eye(n, dtype=torch.float64)
        r = (a / a.sum(-1, keepdim=True)) @ r
    return r.numpy(), [s.name for s in sites]


@pytest.mark.parametrize("kind", sorted(set(FAMILIES) | set(KINDS)))
def test_rollout_of_tiny_models_equals_rollout_of_captured_maps(tiny, kind):
    lm = tiny(kind)
    res = probe.attention_rollout(lm, TEXTS[0])
    expected, sites = rollout_from_capture(lm, TEXTS[0])
    n = expected.shape[0]
    np.testing.assert_allclose(res.matrix, expected, atol=1e-6)
    np.testing.assert_allclose(res.matrix.sum(1), 1.0, atol=1e-6)
    assert res.sites == sites and res.method == "rollout" and len(res.tokens) == n
    assert res.row_index == (n - 1 if decoder_only(lm) else 0)
    np.testing.assert_array_equal(res.row, res.matrix[res.row_index])
    if decoder_only(lm):
        assert res.stack == "decoder" and (np.triu(res.matrix, 1) == 0).all()
    else:
        assert res.stack == "encoder" and all(s.startswith("encoder.") for s in res.sites)
    enc_dec = is_enc_dec(lm)
    assert enc_dec == (kind in ("t5", "bart", "marian"))
    assert any("encoder stack only" in note for note in res.notes) == enc_dec


@pytest.mark.parametrize("kind", KINDS)
def test_padding_never_enters(tiny, kind):
    lm = tiny(kind)
    long, short = probe.attention_rollout(lm, TEXTS)
    alone = probe.attention_rollout(lm, TEXTS[1])
    assert len(short.tokens) < len(long.tokens)
    assert short.tokens == alone.tokens and short.row_index == alone.row_index
    np.testing.assert_allclose(short.matrix, alone.matrix, atol=1e-5)
    flows = probe.attention_flow(lm, TEXTS)
    flow_alone = probe.attention_flow(lm, TEXTS[1])
    np.testing.assert_allclose(flows[1].raw, flow_alone.raw, atol=1e-5)
    np.testing.assert_allclose(flows[1].matrix, flow_alone.matrix, atol=1e-5)


@pytest.mark.parametrize("kind", ["t5", "bart"])
def test_encoder_decoder_rollout_reads_the_encoder_only_whatever_the_target(tiny, kind):
    lm = tiny(kind)
    without = probe.attention_rollout(lm, TEXTS[1])
    for target in ("Eine Katze sass.", "Ganz anders und viel laenger als die Quelle."):
        given = probe.attention_rollout(lm, probe.Text(TEXTS[1], target=target))
        assert given.tokens == without.tokens and given.row_index == 0
        np.testing.assert_allclose(given.matrix, without.matrix, atol=1e-6)
    assert without.sites == [f"encoder.{layer}.self" for layer in range(2)]


@pytest.mark.parametrize("kind", ["bert", "llama", "t5"])
def test_flow_of_tiny_models_is_the_max_flow_of_their_maps(tiny, kind):
    lm = tiny(kind)
    res = probe.attention_flow(lm, TEXTS[1])
    rollout = probe.attention_rollout(lm, TEXTS[1])
    n = len(res.tokens)
    assert res.method == "flow" and res.tokens == rollout.tokens and res.row_index == rollout.row_index
    np.testing.assert_allclose(res.matrix.sum(1), 1.0, atol=1e-6)
    np.testing.assert_allclose(res.matrix, res.raw / res.raw.sum(1, keepdims=True), atol=1e-12)
    # independent: the maps rebuilt from captured probabilities, flow by Edmonds-Karp on a graph built here
    enc_dec = kind == "t5"
    captured = probe.capture_attention(lm, [probe.Text(TEXTS[1], target="Ein Satz.") if enc_dec else TEXTS[1]])
    stack = "decoder" if decoder_only(lm) else "encoder"
    probs = np.stack([captured[s][0, :, :n, :n].double().numpy() for s in lm.sites
                      if s.stack == stack and s.kind == "self"])
    mixed = 0.5 * probs.mean(1) + 0.5 * np.eye(n)
    tilde = mixed / mixed.sum(-1, keepdims=True)
    i = res.row_index
    for j in range(n):
        assert res.raw[i, j] == pytest.approx(independent_flow(tilde, i, j), abs=1e-6)
    if decoder_only(lm):
        assert (np.triu(res.matrix, 1) == 0).all()
    reported = probe.attention_flow(lm, TEXTS[1], rows="reported")
    np.testing.assert_allclose(reported.row, res.row, atol=1e-12)
    assert np.isnan(np.delete(reported.matrix, i, axis=0)).all()


def test_flow_above_the_length_limit_is_one_error_naming_the_limit_and_the_option(tiny):
    lm = tiny("bert")
    n = len(probe.attention_rollout(lm, TEXTS[0]).tokens)
    with pytest.raises(ProbeError) as err:
        probe.attention_flow(lm, TEXTS[0], max_tokens=5)
    msg = str(err.value)
    assert "\n" not in msg and f"has {n} tokens" in msg and "limit of 5" in msg and f"max_tokens={n}" in msg
    assert MAX_FLOW_TOKENS == 64
    with pytest.raises(ProbeError, match="text 1 has"):  # a list names the text
        probe.attention_flow(lm, TEXTS, max_tokens=5)
    assert probe.attention_flow(lm, TEXTS[0], max_tokens=5, max_length=5).matrix.shape == (5, 5)
    with pytest.raises(InputError, match="rows must be one of"):
        probe.attention_flow(lm, TEXTS[1], rows="first")
    with pytest.raises(InputError):
        probe.attention_rollout(lm, [])


def test_pruned_model_averages_the_heads_present():
    from probe.pruning.removal import remove_heads

    lm = tiny_model("bert")
    full = probe.capture_attention(lm, TEXTS[1])
    n = int(full.batch.lengths[0])
    remove_heads(lm, {0: [1, 2]})
    res = probe.attention_rollout(lm, TEXTS[1])
    captured = probe.capture_attention(lm, TEXTS[1])  # the pruned model's layer 0 has 2 heads left
    assert captured[0].shape[1] == 2
    r = np.eye(n)
    for s in lm.sites:
        a = 0.5 * captured[s][0, :, :n, :n].double().numpy().mean(0) + 0.5 * np.eye(n)
        r = a @ r
    np.testing.assert_allclose(res.matrix, r, atol=1e-6)
    np.testing.assert_allclose(captured[0][0, :, :n, :n], full[0][0, [0, 3], :n, :n], atol=1e-6)
    assert any(note.startswith("L0: mean over the 2 of 4 heads") for note in res.notes)
    assert np.isfinite(probe.attention_flow(lm, TEXTS[1]).matrix).all()


def test_a_layer_with_every_head_removed_adds_only_the_residual():
    from probe.pruning.removal import remove_heads

    lm = tiny_model("llama")
    remove_heads(lm, {0: [0, 1, 2, 3]})
    res = probe.attention_rollout(lm, TEXTS[1])
    captured = probe.capture_attention(lm, TEXTS[1])
    n = len(res.tokens)
    a = 0.5 * captured[1][0, :, :n, :n].double().numpy().mean(0) + 0.5 * np.eye(n)
    np.testing.assert_allclose(res.matrix, a, atol=1e-6)  # R = A~_2 I
    assert any("every head removed" in note for note in res.notes)


# --------------------------------------------------------------------------- embedded models

@pytest.mark.slow
def test_rollout_and_flow_on_minilm_and_smollm2(minilm, smollm2):
    text = "The keys to the cabinet are on the table."
    for lm in (minilm, smollm2):
        res = probe.attention_rollout(lm, text)
        expected, _ = rollout_from_capture(lm, text)
        np.testing.assert_allclose(res.matrix, expected, atol=1e-6)
        np.testing.assert_allclose(res.matrix.sum(1), 1.0, atol=1e-6)
        flow = probe.attention_flow(lm, text, rows="reported")
        np.testing.assert_allclose(flow.row.sum(), 1.0, atol=1e-6)
        assert flow.tokens == res.tokens and (flow.row > 0).any()
    assert minilm_row_first(minilm, text)
    dec = probe.attention_rollout(smollm2, text)
    assert dec.row_index == len(dec.tokens) - 1 and (np.triu(dec.matrix, 1) == 0).all()
    assert dec.stack == "decoder" and len(dec.sites) == 30


def minilm_row_first(lm, text) -> bool:
    res = probe.attention_rollout(lm, text)
    return res.row_index == 0 and res.token == "[CLS]" and res.tokens[-1] == "[SEP]" and len(res.sites) == 6
