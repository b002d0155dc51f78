"""The bare attention operation (probe.capture.op): mask conventions (a 0/1 keep-mask is never
added as scores), the fill value (no fp16 overflow) and fully masked rows (0, not NaN), fp16 overflow of
real scores (a masked key never wins).

Independent oracles: a float64 softmax written here, and PyTorch's scaled_dot_product_attention.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import tolerance
from probe.capture.op import broadcast_keep
from probe.capture.reference import MaskError, as_keep_mask, attention


def _reference(q, k, v, keep, scale=None):
    """float64 attention over the kept keys only; rows with no kept key are 0. keep: [B|1, H|1, Tq, Tk] bool."""
    q, k, v = q.double(), k.double(), v.double()
    scale = q.size(-1) ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    keep = keep.expand_as(scores)
    scores = scores.masked_fill(~keep, -math.inf)
    empty = ~keep.any(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(empty, 0.0), -1).masked_fill(~keep, 0.0).masked_fill(empty, 0.0)
    return probs @ v, probs


def _additive(keep, dtype):
    """Additive 0 / finfo(dtype).min mask of a 0/1 keep-mask."""
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(keep == 0, torch.finfo(dtype).min)


# ---------------------------------------------------------------------------------------------
# one mask convention, three spellings
# ---------------------------------------------------------------------------------------------

def test_mask_conventions_give_identical_probabilities():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]])
    forms = {
        "int": keep,
        "float01": keep.float(),
        "bool": keep.bool(),
        "additive-inf": torch.zeros(2, 5).masked_fill(keep == 0, -math.inf),
        "additive-finfo": torch.zeros(2, 5).masked_fill(keep == 0, torch.finfo(torch.float32).min),
        "additive-finfo-fp16": _additive(keep, torch.float16),
        "additive-finfo-bf16": _additive(keep, torch.bfloat16),
    }
    results = {name: attention(q, k, v, mask=m) for name, m in forms.items()}
    y0, p0 = results["bool"]
    for name, (y, p) in results.items():
        assert torch.equal(p, p0), name
        assert torch.equal(y, y0), name
    masked = (keep == 0)[:, None, None, :].expand_as(p0)
    assert torch.count_nonzero(p0[masked]) == 0  # masked keys get exactly 0
    assert torch.allclose(p0.sum(-1), torch.ones(2, 3, 5), atol=1e-6)
    y_ref, p_ref = _reference(q, k, v, keep.bool()[:, None, None, :])
    assert torch.allclose(p0.double(), p_ref, atol=1e-6, rtol=0)
    assert torch.allclose(y0.double(), y_ref, **tolerance("scaled"))
    # the same mask as [batch, query, key] and [batch, 1, query, key]
    _, p3 = attention(q, k, v, mask=keep[:, None, :].expand(2, 5, 5))
    _, p4 = attention(q, k, v, mask=keep.bool()[:, None, None, :].expand(2, 1, 5, 5))
    assert torch.equal(p3, p0) and torch.equal(p4, p0)


def test_per_head_and_per_query_masks_are_applied_as_given():
    torch.manual_seed(6)
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    keep = torch.rand(1, 2, 4, 4) > 0.4
    keep[..., 0] = True  # every row keeps at least key 0
    y, p = attention(q, k, v, mask=keep)
    y_ref, p_ref = _reference(q, k, v, keep)
    assert torch.count_nonzero(p[~keep]) == 0
    assert torch.allclose(p.double(), p_ref, atol=1e-6, rtol=0)
    assert torch.allclose(y.double(), y_ref, **tolerance("scaled"))
    # the causal flag is the same as passing the lower triangle
    tri = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    _, pc = attention(q, k, v, mask=keep, causal=True)
    _, pm = attention(q, k, v, mask=keep & tri)
    assert torch.equal(pc, pm)


@pytest.mark.parametrize("bad", [
    torch.tensor([[1.0, 0.5, 1.0]]),  # fractional
    torch.tensor([[0.0, -1e4, 0.0]]),  # additive with a made-up constant
    torch.tensor([[0.0, -1e9, 0.0]]),
    torch.tensor([[2.0, 0.0, 1.0]]),
    torch.zeros(1, 3),  # ambiguous: additive keep-all or 0/1 keep-none
    torch.tensor([[0.0, 1.0, -math.inf]]),  # mixed conventions
], ids=["fraction", "minus-1e4", "minus-1e9", "two", "zeros", "mixed"])
def test_other_float_masks_are_rejected(bad):
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(MaskError, match="mask"):
        attention(q, q, q, mask=bad)
    with pytest.raises(MaskError):
        as_keep_mask(bad)


def test_integer_masks_must_be_zero_one_and_shapes_must_fit():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(MaskError, match="only 0"):
        attention(q, q, q, mask=torch.tensor([[1, 2, 0]]))
    with pytest.raises(MaskError, match="covers 2 keys but there are 3"):
        attention(q, q, q, mask=torch.tensor([[1, 1]]))
    with pytest.raises(MaskError, match="2, 3 or 4 dimensions"):
        attention(q, q, q, mask=torch.ones(1, 1, 1, 3, 3, dtype=torch.bool))
    with pytest.raises(MaskError, match="does not fit batch 1, 2 heads"):
        attention(q, q, q, mask=torch.ones(1, 3, 3, 3, dtype=torch.bool))  # 3 heads
    with pytest.raises(MaskError, match="does not fit"):
        broadcast_keep(torch.ones(2, 3, dtype=torch.bool), 1, 2, 3, 3)  # batch 2 for batch 1
    with pytest.raises(ValueError, match="do not fit"):
        attention(q, q[..., :2], q)


def test_as_keep_mask_values():
    assert as_keep_mask(torch.tensor([[1, 0, 1]])).tolist() == [[True, False, True]]
    assert as_keep_mask(torch.tensor([[0.0, -math.inf, 0.0]])).tolist() == [[True, False, True]]
    assert as_keep_mask(torch.tensor([[1.0, 0.0, 0.0]])).tolist() == [[True, False, False]]
    assert as_keep_mask(torch.tensor([[0.0, torch.finfo(torch.float16).min]])).tolist() == [[True, False]]
    b = torch.tensor([[True, False]])
    assert as_keep_mask(b) is b


# ---------------------------------------------------------------------------------------------
# the fill value, fully masked rows
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_masked_scores_are_set_not_added(dtype):
    """A masked key gets 0 whatever its score (here 0.9 x fp16's maximum); a fully masked row of
    large negative scores gives 0, not NaN; the result does not depend on a mask constant."""
    big = 0.9 * torch.finfo(torch.float16).max  # 5.9e4
    q = torch.tensor([[[[1.0], [-1.0]]]], dtype=dtype)  # (1, 1, 2, 1)
    k = torch.tensor([[[[big], [1.0]]]], dtype=dtype)  # row 0 scores (5.9e4, 1); row 1 (-5.9e4, -1)
    v = torch.tensor([[[[3.0], [-2.0]]]], dtype=dtype)
    keep = torch.tensor([[[[False, True], [False, False]]]])  # row 0 keeps key 1 only; row 1 keeps nothing
    y, p = attention(q, k, v, mask=keep, scale=1.0)
    assert p.dtype == dtype and y.dtype == dtype
    assert p[0, 0].tolist() == [[0.0, 1.0], [0.0, 0.0]]  # the big masked key gets exactly 0
    assert y[0, 0].tolist() == [[-2.0], [0.0]]
    additive = torch.zeros(1, 1, 2, 2, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    y2, p2 = attention(q, k, v, mask=additive, scale=1.0)
    assert torch.equal(p2, p) and torch.equal(y2, y)
    q100 = torch.full((1, 1, 2, 4), 100.0, dtype=dtype)
    y, p = attention(q100, q100, q100, mask=torch.tensor([[[[True, False], [False, False]]]]))
    assert p[0, 0].tolist() == [[1.0, 0.0], [0.0, 0.0]] and torch.isfinite(y).all()


def test_fully_masked_row_gives_zero_not_nan():
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 2, :] = False  # query 2 sees no key
    y, p = attention(q, k, v, mask=mask)
    assert not torch.isnan(p).any() and not torch.isnan(y).any()
    assert torch.count_nonzero(p[:, :, 2]) == 0 and torch.count_nonzero(y[:, :, 2]) == 0
    assert torch.allclose(p[:, :, [0, 1, 3]].sum(-1), torch.ones(1, 2, 3), atol=1e-6)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # the oracle, test only
    assert torch.allclose(y, torch.nan_to_num(sdpa), atol=1e-6)
    # an additive mask and the causal mask together leave the same row empty
    add = torch.zeros(1, 1, 4, 4).masked_fill(~mask, -math.inf)
    y2, p2 = attention(q, k, v, mask=add, causal=True)
    assert torch.count_nonzero(p2[:, :, 2]) == 0 and not torch.isnan(y2).any()
    _, p_ref = _reference(q, k, v, mask & torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    assert torch.allclose(p2.double(), p_ref, atol=1e-6, rtol=0)


def test_window_keeps_the_last_w_keys():
    torch.manual_seed(7)
    q, k, v = torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4)
    _, p = attention(q, k, v, causal=True, window=2)
    i = torch.arange(6)
    band = (i[None] <= i[:, None]) & (i[None] > i[:, None] - 2)  # key j in (i - 2, i]
    assert torch.equal(p[0, 0] != 0, band)
    _, p_ref = _reference(q, k, v, band)
    assert torch.allclose(p.double(), p_ref, atol=1e-6, rtol=0)
    # queries are the last ones of the keys (a key/value cache): query 0 sits at position 3 of 4 keys
    _, p = attention(q[:, :, :1], k[:, :, :4], v[:, :, :4], causal=True, window=2)
    assert (p[0, 0, 0] != 0).tolist() == [False, False, True, True]


# ---------------------------------------------------------------------------------------------
# real scores that overflow to -inf never lose to a masked key
# ---------------------------------------------------------------------------------------------

T, PAD = 8, 3  # 8 positions, the first 3 are left padding


def _f19_inputs(dtype):
    """q = 1000, k = -1000 * U(0, 1) (seed 19), v ~ N(0, 1); [1, 2, 8, 8]."""
    g = torch.Generator().manual_seed(19)
    q = torch.full((1, 2, T, 8), 1000.0)
    k = -1000.0 * torch.rand(1, 2, T, 8, generator=g)
    v = torch.randn(1, 2, T, 8, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _f19_keep():
    real = torch.ones(1, T, dtype=torch.bool)
    real[:, :PAD] = False
    tri = torch.tril(torch.ones(T, T, dtype=torch.bool))
    return real, real[:, None, None, :] & tri  # (1, T), (1, 1, T, T)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_masked_keys_get_exactly_zero(dtype):
    q, k, v = _f19_inputs(dtype)
    real, keep = _f19_keep()
    y, p = attention(q, k, v, mask=real, causal=True)
    keep = keep.expand_as(p)
    assert not torch.isnan(p).any() and not torch.isnan(y).any()
    assert torch.count_nonzero(p[~keep]) == 0  # future and padding keys: exactly 0
    assert torch.count_nonzero(p[:, :, :PAD]) == 0 and torch.count_nonzero(y[:, :, :PAD]) == 0  # padding rows
    scores = (q @ k.transpose(-2, -1)) * 8 ** -0.5  # what the op computes, in the dtype
    if dtype == torch.float16:
        assert bool(scores.isinf().all())  # every real score overflowed (|score| ~ 1e6 > 65504)
        # documented: the scores are computed again in float32: the float32 result on the same inputs
        y32, p32 = attention(q.float(), k.float(), v.float(), mask=real, causal=True)
        assert torch.equal(p, p32.half()) and torch.equal(y, y32.half())
        assert torch.equal(p[:, :, PAD:].sum(-1), torch.ones(1, 2, T - PAD, dtype=dtype))
    else:
        assert bool(torch.isfinite(scores).all())
        _, p_ref = _reference(q, k, v, keep)  # float64 on the same (rounded) inputs: one-hot rows
        assert torch.allclose(p.double(), p_ref, atol=torch.finfo(dtype).eps, rtol=0)
        assert torch.equal(p[:, :, PAD:].sum(-1), torch.ones(1, 2, T - PAD, dtype=dtype))


def test_overflowed_fp16_rows_get_the_float32_result():
    """Key 4's scores are finite in fp16, every other real score overflows to -inf: the scores are
    computed again in float32, so rows 4..7 give key 4 (their largest score) 1 and row 3, which sees
    only key 3, gives it 1 (not 0); padding rows 0..2 see no key: 0."""
    q, k, v = _f19_inputs(torch.float32)
    k[:, :, 4] *= 1e-6  # score of key 4 ~ -1000 * 1e-3 * ... : finite in fp16
    q, k, v = q.half(), k.half(), v.half()
    real, keep = _f19_keep()
    scores = (q @ k.transpose(-2, -1)) * 8 ** -0.5
    assert bool(torch.isfinite(scores[..., 4]).all()) and bool(scores[..., [0, 1, 2, 3, 5, 6, 7]].isinf().all())
    y, p = attention(q, k, v, mask=real, causal=True)
    assert not torch.isnan(p).any() and not torch.isnan(y).any()
    assert torch.count_nonzero(p[~keep.expand_as(p)]) == 0
    expected = torch.zeros(1, 2, T, T, dtype=torch.float16)
    expected[:, :, 4:, 4] = 1.0  # rows 4..7 see key 4, whose score is the largest
    expected[:, :, 3, 3] = 1.0  # row 3 sees key 3 only
    assert torch.equal(p, expected)
    assert torch.equal(y[:, :, 4:], v[:, :, 4:5].expand(-1, -1, 4, -1))
    assert torch.equal(y[:, :, 3], v[:, :, 3]) and torch.count_nonzero(y[:, :, :PAD]) == 0


def test_fp16_scores_that_overflow_give_the_float32_result():
    """Random fp16 queries and keys large enough that some scores pass 65504: the probabilities and
    outputs equal the float32 computation on the same (fp16) inputs, rounded to fp16 (each within
    one fp16 rounding of it: half an ulp, relative eps/2), and nothing is NaN; without overflow the
    fp16 path is kept (its result differs from the float32 one by fp16's own rounding of the scores)."""
    g = torch.Generator().manual_seed(30)
    q = (torch.randn(2, 3, 5, 16, generator=g) * 80).half()
    k = (torch.randn(2, 3, 5, 16, generator=g) * 80).half()
    v = torch.randn(2, 3, 5, 16, generator=g).half()
    assert bool(((q @ k.transpose(-2, -1)) * 0.25).isinf().any())  # some scores overflow in fp16
    y, p = attention(q, k, v, causal=True)
    y32, p32 = attention(q.float(), k.float(), v.float(), causal=True)
    assert not torch.isnan(p).any() and not torch.isnan(y).any()
    torch.testing.assert_close(p, p32.half(), atol=0, rtol=0)
    eps = torch.finfo(torch.float16).eps
    # y = p(fp16) v: each p within eps/2 of p32, |v| <= max|v|, rows sum to 1: |y - y32| <= eps (max|v| + |y32|)
    bound = eps * (v.abs().amax() + y32.abs()).float()
    assert bool(((y.float() - y32).abs() <= bound).all())
    qs, ks = q / 64, k / 64  # no overflow: the fp16 scores are kept, rounding as a model's eager fp16 attention
    scores = (qs @ ks.transpose(-2, -1)) * 0.25
    assert bool(torch.isfinite(scores).all())
    tri = torch.ones(5, 5, dtype=torch.bool).tril()
    assert torch.equal(attention(qs, ks, v, causal=True)[1], torch.softmax(scores.masked_fill(~tri, -math.inf), -1))
