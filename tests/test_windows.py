"""Sliding windows that bind: a bidirectional window (ModernBERT's local layers) measured at a text many
times longer than the window, with the window in each site's record, and ``max_length`` honoured or
refused (never capped silently).

Before, probe capped a ModernBERT text at its local window so that the window never bound (about 64
tokens of an 8,192-token encoder), and an explicit ``max_length`` above the model's limit was cut to
it without a word.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import assert_statistics_close, bert_tokenizer, tolerance
from probe.errors import InputError
from probe.sites import Site, band_keep, visible_keys

#: ModernBERT's local_attention (keys |i - j| <= 4 each side: 9 keys a row), and the text's length (4 x 512).
LOCAL, LENGTH = 8, 2048


@pytest.fixture(scope="module")
def modern():
    """A tiny ModernBERT (3 layers: layer 0 global, 1 and 2 local with local_attention=8), 4,096 positions."""
    import transformers as tr

    from probe.loading.models import from_pretrained_objects

    tok = bert_tokenizer()
    tok.model_max_length = 4096
    config = tr.ModernBertConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                 num_attention_heads=2, max_position_embeddings=4096, global_attn_every_n_layers=3,
                                 local_attention=LOCAL, pad_token_id=0, cls_token_id=101, sep_token_id=102)
    torch.manual_seed(0)
    model = tr.AutoModel.from_config(config, attn_implementation="eager").eval()
    return from_pretrained_objects(model, tok, name="tiny-modernbert-w8")


def long_text(n_words: int = 2000) -> str:
    words = "the quick brown fox jumps over a lazy dog near river bank today while birds sing".split()
    return " ".join(words[i % len(words)] + ("." if i % 11 == 10 else "") for i in range(n_words))


def test_band_and_visible_keys_from_the_definition():
    """A band of 2 before and 3 after: the mask, and k_i = the real keys in [i - 2, i + 3], by counting."""
    site = Site("encoder", 0, window=6, ahead=3)
    assert site.band == (2, 3) and site.record()["before"] == 2
    keep = band_keep(site, 10, 10)
    for i in range(10):
        assert keep[i].nonzero().flatten().tolist() == [j for j in range(10) if -2 <= j - i <= 3]
    lengths = torch.tensor([10, 7])
    k = visible_keys(site, lengths, 10)
    for b, n in enumerate(lengths.tolist()):
        for i in range(n):
            assert int(k[b, i]) == sum(1 for j in range(n) if -2 <= j - i <= 3)
    assert band_keep(Site("decoder", 0, causal=True, window=4), 5, 5) is None


def test_discovered_bidirectional_window_is_in_each_site_and_does_not_cap_the_length(modern):
    assert [(s.window, s.ahead) for s in modern.sites] == [(None, 0), (LOCAL + 1, LOCAL // 2), (LOCAL + 1, LOCAL // 2)]
    assert modern.max_length == 4096  # the position table's and the tokenizer's limit, not the window


def test_every_local_row_has_exactly_its_windows_keys_at_2048_tokens(modern):
    """Captured maps of a 2,048-token text: in each local layer every row's nonzero weights are exactly the keys
    |i - j| <= local_attention / 2 (the others exactly 0), every row sums to 1; the global layer sees every key."""
    from probe.capture.maps import capture_attention

    cap = capture_attention(modern, long_text(), max_length=LENGTH)
    T = cap.probs[0].shape[-1]
    assert T == LENGTH
    i = torch.arange(T)
    band = (i[None, :] - i[:, None]).abs() <= LOCAL // 2  # transformers' rule, written here independently
    for site, probs in zip(modern.sites, cap.probs):
        p = probs[0]  # [heads, T, T]
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:2]), **tolerance("probability"))
        if site.window is None:
            assert bool((p > 0).all())
            continue
        assert bool((p[:, ~band] == 0).all()) and bool((p[:, band] > 0).all())


def test_statistics_at_2048_tokens_whole_and_in_blocks_agree_and_use_the_windows_keys(modern):
    """analyze on 2,048 tokens: whole maps and query blocks of 300 rows give the same statistics, and
    norm_entropy of a local layer is the mean of H_i / ln k_i with k_i the window's keys (9 inside, 5 at the ends),
    computed here from the captured maps."""
    from probe.capture.maps import capture_attention
    from probe.runs.analysis import analyze

    text = long_text()
    whole = analyze(modern, [text], max_length=LENGTH, query_block=0, n_examples=0)
    blocks = analyze(modern, [text], max_length=LENGTH, query_block=300, n_examples=0)
    assert whole.counts["longest"] == LENGTH == blocks.counts["longest"]
    assert_statistics_close(blocks.heads, whole.heads)
    cap = capture_attention(modern, text, max_length=LENGTH)
    i = np.arange(LENGTH)
    k = np.minimum(i + LOCAL // 2, LENGTH - 1) - np.maximum(i - LOCAL // 2, 0) + 1
    assert k.min() == LOCAL // 2 + 1 and k.max() == LOCAL + 1
    for layer in (1, 2):
        p = cap.probs[layer][0].double().numpy()
        h = -(p * np.log(np.where(p > 0, p, 1))).sum(-1)  # [heads, T]
        want = (h / np.log(k)).mean(-1)
        got = whole.heads[whole.heads.layer == layer]["norm_entropy"].to_numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5)
    rec = whole.model["site_windows"]
    assert rec == [{"site": f"encoder.{n}.self", "causal": False, "window": LOCAL + 1, "before": LOCAL // 2,
                    "after": LOCAL // 2} for n in (1, 2)]
    # heads.csv: each head's window beside its statistics, empty on the global layer
    per_layer = whole.heads.drop_duplicates("layer").set_index("layer")["window"]
    assert [None if pd.isna(w) else int(w) for w in per_layer] == [None, LOCAL + 1, LOCAL + 1]
    csv_rows = whole.heads.to_csv(index=False).splitlines()
    column = csv_rows[0].split(",").index("window")
    assert {row.split(",")[column] for row in csv_rows[1:]} == {"", str(LOCAL + 1)}


def test_max_length_above_the_limit_is_refused_not_capped(modern):
    from probe.capture.maps import capture_attention

    with pytest.raises(InputError, match="max length 5000 tokens is above the model's limit of 4096"):
        capture_attention(modern, "a short text", max_length=5000)
    assert capture_attention(modern, long_text(), max_length=1000).probs[0].shape[-1] == 1000  # honoured


def test_a_causal_window_binds_at_16_times_its_length(tiny_generic):
    """Starcoder2 (causal, window 4) on 64 tokens: every row's nonzero weights are exactly its last 4 keys, k_i in
    norm_entropy is min(i + 1, 4), and whole maps and blocks of 10 rows give the same statistics."""
    from probe.capture.maps import capture_attention
    from probe.runs.analysis import analyze

    lm = tiny_generic("starcoder2")
    assert [s.window for s in lm.sites] == [4, 4] and lm.max_length == 64
    text = long_text(200)
    cap = capture_attention(lm, text, max_length=64)
    T = cap.probs[0].shape[-1]
    i = torch.arange(T)
    offset = i[:, None] - i[None, :]  # i - j
    band = (offset >= 0) & (offset < 4)
    for probs in cap.probs:
        assert T == 64 and bool((probs[0][:, ~band] == 0).all()) and bool((probs[0][:, band] > 0).all())
    whole = analyze(lm, [text], max_length=64, query_block=0, n_examples=0)
    blocks = analyze(lm, [text], max_length=64, query_block=10, n_examples=0)
    assert_statistics_close(blocks.heads, whole.heads)
    k = np.minimum(np.arange(T) + 1, 4)
    p = cap.probs[0][0].double().numpy()
    h = -(p * np.log(np.where(p > 0, p, 1))).sum(-1)
    want = (h[:, 1:] / np.log(k[1:])).mean(-1)  # rows with k_i >= 2
    np.testing.assert_allclose(whole.heads[whole.heads.layer == 0]["norm_entropy"], want, rtol=1e-5)
