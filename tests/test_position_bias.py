"""ALiBi slopes and T5's relative position buckets, from their papers, against the models' own code."""

from __future__ import annotations

import math

import pytest
import torch

from probe.reference.position_bias import alibi_bias, alibi_slopes, t5_bias, t5_buckets


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 112])
def test_alibi_slopes_match_bloom(n):
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    assert torch.equal(alibi_slopes(n), _get_alibi_slopes(n, "cpu"))


def test_alibi_slopes_from_the_paper():
    """Press et al. sec. 3: 8 heads -> 1/2, 1/4, ..., 1/256; 16 heads -> 1/sqrt(2), 1/2, ...;
    12 heads = the 8 slopes of 8 heads, then the odd powers of the 16-head sequence."""
    assert alibi_slopes(8).tolist() == [2.0 ** -h for h in range(1, 9)]
    torch.testing.assert_close(alibi_slopes(16), torch.tensor([2.0 ** (-h / 2) for h in range(1, 17)]))
    twelve = alibi_slopes(12).tolist()
    assert twelve[:8] == [2.0 ** -h for h in range(1, 9)]
    assert twelve[8:] == pytest.approx([2.0 ** (-h / 2) for h in (1, 3, 5, 7)], rel=1e-6)
    with pytest.raises(ValueError):
        alibi_slopes(0)


def test_alibi_bias_is_the_relative_distance_after_the_softmax():
    slopes = alibi_slopes(4)
    pos = torch.arange(6)[None]
    bias = alibi_bias(slopes, pos)[0, :, 0]  # (heads, key)
    i = 5
    relative = -slopes[:, None] * (i - torch.arange(6))[None].float()  # Press et al.: -m (i - j)
    torch.testing.assert_close(torch.softmax(bias, -1), torch.softmax(relative, -1))
    assert not torch.allclose(torch.softmax(alibi_bias(slopes, pos, sign=-1.0)[0, :, 0], -1),
                              torch.softmax(relative, -1))


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets,distance", [(32, 128), (16, 20), (8, 8)])
def test_t5_buckets_match_t5(bidirectional, buckets, distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-300, 300)[None, :]
    assert torch.equal(t5_buckets(rel, bidirectional, buckets, distance),
                       T5Attention._relative_position_bucket(rel, bidirectional, buckets, distance))


def test_t5_buckets_by_hand():
    """32 bidirectional buckets, max distance 128: offsets -7..7 exact; key after the query in the
    upper half; 8 <= |offset| < 128 logarithmic; beyond, the last bucket of the half."""
    rel = torch.tensor([0, -1, 1, -7, 7, -8, 8, -127, 127, -128, -1000, 1000])
    got = t5_buckets(rel, True, 32, 128).tolist()
    log_bucket = lambda d: 8 + int(math.log(d / 8) / math.log(128 / 8) * 8)  # noqa: E731
    assert got == [0, 1, 17, 7, 23, 8, 24, log_bucket(127), 16 + log_bucket(127), 15, 15, 31]
    causal = t5_buckets(torch.tensor([3, 0, -1, -20]), False, 32, 128).tolist()
    assert causal == [0, 0, 1, 16 + int(math.log(20 / 16) / math.log(128 / 16) * 16)]


def test_t5_bias_looks_up_the_table():
    table = torch.randn(8, 3)
    bias = t5_bias(table, 2, 4, past=2, bidirectional=False, num_buckets=8, max_distance=8)
    assert bias.shape == (1, 3, 2, 4)
    buckets = t5_buckets(torch.arange(4)[None] - (torch.arange(2)[:, None] + 2), False, 8, 8)
    for h in range(3):
        torch.testing.assert_close(bias[0, h], table[buckets, h])


@pytest.mark.parametrize("wrong", ["bidirectional", "buckets"])
def test_verify_catches_a_t5_bias_computed_wrong(monkeypatch, wrong):
    """The from-scratch module computes T5's bias from the config (never copies the model's): a
    bucket rule broken on purpose (buckets of one direction only, or half the buckets) must
    break parity on tiny T5."""
    import probe.architectures.position_bias as module  # where T5's rule computes its bias
    from conftest import tiny_model
    from probe.verification import verify

    lm = tiny_model("t5")
    assert verify(lm, cases=["sentence"]).passed

    def broken(table, n_query, n_key, past, bidirectional, buckets, max_distance):
        if wrong == "bidirectional":
            bidirectional = not bidirectional
        else:
            buckets //= 2
        return t5_bias(table, n_query, n_key, past, bidirectional, buckets, max_distance)

    monkeypatch.setattr(module, "t5_bias", broken)
    result = verify(lm, cases=["sentence"])
    assert not result.passed and result.max_abs_diff > 1e-3
