"""Masks and site kinds of discovered models beyond the plain causal/full ones: float (additive) masks read as
transformers' attention functions add them, bidirectional sliding windows, the key/value cache of an
encoder-decoder model run as generation runs it, and one clear line where an encoder or a decoder
self-attention never shows as a call of its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from conftest import tolerance
from probe.capture.discover import _bidirectional_band
from probe.capture.interface import probe_attention, split_mask
from probe.errors import UnsupportedArchitectureError
from probe.loading.models import from_pretrained_objects
from probe.verification import verify

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import tiny_models  # noqa: E402 - tools/ is not a package: its folder on the path first

KINDS = dict(tiny_models.text_types())


def tiny(model_type: str):
    """The supported-models table's tiny model of ``model_type``, wrapped (its spec discovered)."""
    model, tok = tiny_models.build(model_type, KINDS[model_type])
    return from_pretrained_objects(model, tok, name=f"tiny-{model_type}")


class Module(torch.nn.Module):
    pass


def test_a_float_mask_is_additive_its_finite_values_a_bias():
    """Zeros keep every key (no longer ambiguous: attention functions add a float mask); -inf and
    finfo.min mask; other finite values (Doge's dynamic mask) are added to the scaled scores."""
    q, k, v = (torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    zeros = torch.zeros(1, 1, 3, 3)
    keep, bias = split_mask(zeros, q, k)
    assert bool(keep.all()) and bias is None
    low = torch.finfo(torch.float32).min
    mask = torch.tensor([[0.0, low, -torch.inf], [0.5, -1.0, low + 0.7], [2.0, 0.0, 0.0]])[None, None]
    keep, bias = split_mask(mask, q, k)
    assert keep[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert bias[0, 0].tolist() == [[0.0, 0.0, 0.0], [0.5, -1.0, 0.0], [2.0, 0.0, 0.0]]
    _, probs = probe_attention(Module(), q, k, v, mask, scaling=0.5)
    scores = (q @ k.transpose(-1, -2)) * 0.5 + bias
    want = torch.softmax(scores.masked_fill(~keep, -torch.inf), -1)
    torch.testing.assert_close(probs, want, **tolerance("probability"))
    assert split_mask(mask > low / 2, q, k)[1] is None  # a boolean mask: a keep-mask, no bias


def test_a_bidirectional_band_gives_the_keys_before_and_after_each_query():
    i = torch.arange(10)
    offset = i[None, :] - i[:, None]  # j - i
    assert _bidirectional_band(offset.abs() <= 3) == (3, 3)
    assert _bidirectional_band((offset >= -3) & (offset <= 4)) == (3, 4)  # T5Gemma 2's: 3 before, 4 after
    assert _bidirectional_band(offset.abs() <= 9) is None  # the whole sequence: not seen at this length
    assert _bidirectional_band(offset <= 0) is None  # causal
    assert _bidirectional_band(torch.ones(10, 10, dtype=torch.bool)) is None  # full
    holes = offset.abs() <= 3
    holes[5, 5] = False
    assert _bidirectional_band(holes) is None


@pytest.mark.parametrize("model_type,cases", [("doge", ["right-padded"]), ("layoutlm", ["sentence"]),
                                              ("switch_transformers", ["kv-cache"]), ("t5gemma", ["sentence"])])
def test_types_with_their_own_masks_are_verified(model_type, cases):
    """Doge (a float mask with learned values), LayoutLM and Switch Transformers (float masks of zeros), the
    kv-cache of Switch Transformers (its model passes use_cache to the encoder: the encoder runs first, as
    in generation), T5Gemma (a bidirectional sliding window in the encoder, in each encoder site's record)."""
    lm = tiny(model_type)
    result = verify(lm, cases=cases)
    assert result.passed, result.to_json()
    assert all(r.attn_max_abs <= 1e-6 for r in result.per_layer)
    if model_type == "t5gemma":
        config = lm.model.config.encoder
        windows = [t == "sliding_attention" for t in config.layer_types]
        assert any(windows)
        # transformers' bidirectional window keeps |i - j| <= sliding_window: 2 w + 1 keys, w after the query
        w = config.sliding_window
        assert [(s.window, s.ahead) for s in lm.sites if s.stack == "encoder"] == [
            (2 * w + 1, w) if sliding else (None, 0) for sliding in windows]


@pytest.mark.parametrize("model_type,why", [
    ("pegasus_x", "its encoder's attention never called transformers' AttentionInterface"),
    ("t5gemma2", "self-attention is merged with the cross-attention in one call"),
])
def test_an_encoder_decoder_without_one_of_its_sites_is_refused_in_one_line(model_type, why):
    model, tok = tiny_models.build(model_type, KINDS[model_type])
    with pytest.raises(UnsupportedArchitectureError, match=why):
        from_pretrained_objects(model, tok)
