"""ALiBi slopes and T5's relative position buckets, from their papers, against the models' own code."""

from __future__ import annotations

import math
import types

import pytest
import torch

from conftest import tiny_config, tiny_model
from probe.architectures import FALCON_ALIBI, get_spec
from probe.architectures.disentangled import (
    disentangled_bias,
    log_buckets,
    position_terms,
    relative_span,
    relative_table,
)
from probe.architectures.falcon import eager_alibi_count
from probe.capture.reference.position_bias import alibi_bias, alibi_slopes, t5_bias, t5_buckets
from probe.errors import UnsupportedArchitectureError


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


# --------------------------------------------------------------------------- MPNet


def test_mpnet_buckets_are_t5s_with_32_buckets_to_distance_128():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from probe.architectures.mpnet import MPNET_BUCKETS, MPNET_MAX_DISTANCE

    relative = torch.arange(-300, 301)[None] - torch.zeros(1, 1, dtype=torch.long)  # j - i
    ours = t5_buckets(relative, True, MPNET_BUCKETS, MPNET_MAX_DISTANCE)
    assert torch.equal(ours, MPNetEncoder.relative_position_bucket(relative))
    # every bucket but 16 (offset 0 of the "key after the query" half: offset 0 is in the first half)
    assert (MPNET_BUCKETS, MPNET_MAX_DISTANCE) == (32, 128) and set(ours.flatten().tolist()) == set(range(32)) - {16}


def test_mpnet_bias_equals_the_encoders_own_whatever_the_configs_bucket_count():
    """The encoder's one bias of every layer ([batch, heads, T, T], computed with 32 buckets even where
    the config sizes the table for more) is what probe's rule computes from the same table."""
    from probe.architectures.mpnet import MPNET_RELATIVE

    model, _ = tiny_model("mpnet", wrap=False)
    encoder = model.encoder
    encoder.relative_attention_bias = torch.nn.Embedding(48, 4)  # a config with 48 buckets: rows 32.. unused
    module = types.SimpleNamespace(bias_table=encoder.relative_attention_bias, is_cross=False, is_causal=False)
    x = torch.zeros(2, 150, 64)
    with torch.no_grad():
        own = encoder.compute_position_bias(x)  # (2, heads, 150, 150)
        ours = MPNET_RELATIVE(module, 150, 150, 0, None, "cpu")
    assert ours.shape == (1, 4, 150, 150) and torch.equal(ours.expand_as(own), own)


def test_verify_catches_an_mpnet_bias_computed_wrong(monkeypatch):
    """The from-scratch module computes MPNet's bias itself: buckets of one direction only break parity."""
    import probe.architectures.mpnet as module  # where MPNet's rule computes its bias
    from probe.verification import verify

    lm = tiny_model("mpnet")
    assert verify(lm, cases=["sentence"]).max_abs_diff == 0.0

    def one_direction(table, n_query, n_key, past, bidirectional, buckets, max_distance):
        return t5_bias(table, n_query, n_key, past, False, buckets, max_distance)

    monkeypatch.setattr(module, "t5_bias", one_direction)
    result = verify(lm, cases=["sentence"])
    assert not result.passed and result.max_abs_diff > 1e-3


# --------------------------------------------------------------------------- DeBERTa-v2/v3

@pytest.mark.parametrize("buckets,max_position", [(8, 64), (256, 512), (32, 128)])
def test_deberta_log_buckets_match_deberta_v2(buckets, max_position):
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    relative = torch.arange(-3 * max_position, 3 * max_position)
    theirs = make_log_bucket_position(relative, buckets, max_position).long()
    assert torch.equal(log_buckets(relative, buckets, max_position), theirs)


def test_deberta_log_buckets_by_hand():
    """mid = 4: |r| <= 4 keeps r; beyond, 4 + ceil(3 * log(|r| / 4) / log(63 / 4)), the sign kept;
    the last row (7) at max_position - 1 = 63; no buckets: r itself."""
    r = torch.tensor([0, 1, -4, 5, -5, 8, 16, 63, 64, 1000])
    def far(d):
        return 4 + math.ceil(3 * math.log(d / 4) / math.log(63 / 4))
    expected = [0, 1, -4, 5, -5, far(8), far(16), 7, far(64), far(1000)]
    assert far(63) == 7 and far(64) == 8  # rows past the span are clamped when read
    assert log_buckets(r, 8, 64).tolist() == expected
    assert log_buckets(r, -1, 64).tolist() == r.tolist()


def test_deberta_disentangled_bias_equals_the_models_own_terms():
    """The c2p + p2c terms from the config and the weights equal DeBERTa-v2's
    ``disentangled_attention_bias`` (its scale factor 3) to the last bit, every layer."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    model, _ = tiny_model("deberta-v2", wrap=False)
    config, encoder = model.config, model.encoder
    x = torch.randn(2, 23, config.hidden_size, generator=torch.Generator().manual_seed(0))
    nh, hs = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    with torch.no_grad():
        rel = encoder.get_rel_embedding()
        table = relative_table(encoder.rel_embeddings, encoder.LayerNorm, config)
        assert torch.equal(table, rel[:2 * relative_span(config)])
        for layer in encoder.layer:
            att = layer.attention.self
            q = att.transpose_for_scores(att.query_proj(x), nh)  # (B*nh, T, hs)
            k = att.transpose_for_scores(att.key_proj(x), nh)
            rp = build_relative_position(q, k, config.position_buckets, config.max_position_embeddings)
            theirs = att.disentangled_attention_bias(q, k, rp, rel, 3).view(2, nh, 23, 23)
            pos_q = att.query_proj(table).view(-1, nh, hs).transpose(0, 1)
            pos_k = att.key_proj(table).view(-1, nh, hs).transpose(0, 1)
            ours = disentangled_bias(q.view(2, nh, 23, hs), k.view(2, nh, 23, hs), pos_q, pos_k, config, 0)
            assert torch.equal(ours, theirs)
            flipped = disentangled_bias(q.view(2, nh, 23, hs), k.view(2, nh, 23, hs), pos_q, pos_k, config, 0, -1)
            assert float((flipped - theirs).abs().max()) > 0.1  # the c2p-sign mutant's bias


def test_deberta_scale_counts_the_position_terms():
    """sec. 3.1: 1/sqrt(3 d) with both terms; 1/sqrt(2 d) with one; 1/sqrt(d) with none."""
    config = tiny_config("deberta-v2", 1000)
    assert get_spec(config).scaling(config, 16, 0) == pytest.approx(48 ** -0.5, rel=1e-15)
    config.pos_att_type = ["c2p"]
    assert get_spec(config).scaling(config, 16, 0) == pytest.approx(32 ** -0.5, rel=1e-15)
    config.pos_att_type = "p2c|c2p"  # older configs
    assert position_terms(config) == ("c2p", "p2c")
    config.pos_att_type = None
    assert get_spec(config).scaling(config, 16, 0) == 0.25


# --------------------------------------------------------------------------- Falcon

@pytest.mark.parametrize("heads", [4, 6])
def test_falcon_alibi_values_match_falcons_tensor(heads):
    """Falcon's ALiBi in bfloat16 (slopes and products), from a left-padded mask, equals its own
    ``build_alibi_tensor``; the reference adds it after the scaling (a / sqrt(d)) and, where the installed
    release's eager attention adds it twice (measured), also inside the scaled scores."""
    from transformers import FalconConfig
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    mask = torch.tensor([[0, 0, 1, 1, 1, 1] + [1] * 300, [1] * 306])
    theirs = build_alibi_tensor(mask, heads, torch.float32).view(2, heads, 1, -1)
    config = FalconConfig(alibi=True)
    module = types.SimpleNamespace(config=config, n_head=heads, alibi_sign=1.0, d_head=16)
    positions = (mask.cumsum(-1) - 1) * mask
    assert torch.equal(FALCON_ALIBI(module, 306, 306, 0, positions, "cpu"), theirs / 4.0)
    inner = FALCON_ALIBI.inner_bias(module, 306, 306, 0, positions, "cpu")
    if eager_alibi_count(FalconConfig) == 2:
        assert torch.equal(inner, theirs)
        assert not torch.equal(inner, alibi_bias(alibi_slopes(heads), positions))  # float32 slopes differ
    else:
        assert inner is None
    module.config = FalconConfig(alibi=False)
    assert FALCON_ALIBI(module, 6, 6, 0, None, "cpu") is None
    assert FALCON_ALIBI.inner_bias(module, 6, 6, 0, None, "cpu") is None


def _falcon_logits(kind: str, impl: str, enc: dict) -> torch.Tensor:
    model, _ = tiny_model(kind, wrap=False, attn_implementation=impl)
    with torch.no_grad():
        return model(**enc).logits


def test_the_measured_alibi_count_is_what_separates_falcons_eager_and_sdpa_logits():
    """The count is read from the eager maps of a tiny model; checked here against the logits of another
    model: sdpa adds ALiBi once in every release, so eager and sdpa agree exactly when the measured count
    is 1 (transformers >= 5.25) and differ when it is 2 (5.0-5.24, eager adds it inside the scaled scores
    and again through the mask); without ALiBi they agree in every release."""
    from transformers import FalconConfig

    count = eager_alibi_count(FalconConfig)
    assert count in (1, 2)
    enc = {"input_ids": torch.arange(10, 40)[None]}
    for kind, apart in (("falcon-alibi", count == 2), ("falcon", False)):
        gap = float((_falcon_logits(kind, "eager", enc) - _falcon_logits(kind, "sdpa", enc)).abs().max())
        assert gap > 0.1 if apart else gap <= 1e-5, (kind, count, gap)


def test_the_alibi_count_is_read_from_the_model_code_not_the_release_number(monkeypatch):
    """A Falcon whose ALiBi tensor is tripled (patched in its modelling code) is measured as adding it 3 (or,
    on a release that adds it twice, 6) times, and refused in one line: the count comes from what the code
    computes, not from a version number."""
    from transformers import FalconConfig
    from transformers.models.falcon import modeling_falcon

    real = modeling_falcon.build_alibi_tensor
    monkeypatch.setattr(modeling_falcon, "build_alibi_tensor", lambda *a, **k: 3 * real(*a, **k))
    eager_alibi_count.cache_clear()  # measured once per process: measure the patched code
    try:
        with pytest.raises(UnsupportedArchitectureError, match=r"adds its ALiBi bias [36] times \(measured\)"):
            eager_alibi_count(FalconConfig)
    finally:
        eager_alibi_count.cache_clear()  # the next use measures the real code again
