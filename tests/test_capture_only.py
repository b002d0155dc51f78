"""Capture-only types: models whose attention is their own code (RoFormer, XGLM: their modules compute
attention themselves and never call transformers' AttentionInterface). Before, probe refused them outright;
now it measures the maps their eager path returns (statistics, views, labels), shows the attention steps read
from its projections (tests/test_steps_own_code.py) and refuses, by name, everything that needs probe's own
attention module or the interface (verify, the from-scratch steps, block capture, interventions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import bert_tokenizer, bpe_tokenizer, invoke_cli, one_error, tolerance
from probe.errors import UnsupportedArchitectureError
from probe.runs.analysis import analyze

TEXTS = ["The cat sat on the mat. It was warm.", "A dog ran to the park and back home again today."]


def build(model_type: str):
    """A tiny random RoFormer (encoder, WordPiece) or XGLM (decoder, BPE) and its tokenizer, eval mode."""
    import transformers as tr

    if model_type == "roformer":
        tok = bert_tokenizer()
        config = tr.RoFormerConfig(vocab_size=len(tok), hidden_size=64, embedding_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                                   pad_token_id=0)
        cls = tr.AutoModel
    else:
        tok = bpe_tokenizer()
        config = tr.XGLMConfig(vocab_size=len(tok), d_model=64, num_layers=2, attention_heads=4, ffn_dim=128,
                               max_position_embeddings=64, pad_token_id=0)
        cls = tr.AutoModelForCausalLM
    torch.manual_seed(0)
    return cls.from_config(config).eval(), tok


@pytest.fixture(scope="module", params=["roformer", "xglm"])
def own(request):
    from probe.loading.models import from_pretrained_objects

    model, tok = build(request.param)
    return from_pretrained_objects(model, tok, name=f"tiny-{request.param}")


def test_the_maps_are_the_models_output_attentions_and_rows_sum_to_1(own):
    """Captured maps of a padded batch equal output_attentions of each text run alone (real rows and keys), padded
    keys get 0, real rows sum to 1; a decoder's maps are causal."""
    from probe.capture.maps import capture_attention

    assert own.spec.capture_only and not own.spec.discovered
    assert own.kind == ("encoder" if own.model_type == "roformer" else "decoder")
    cap = capture_attention(own, TEXTS)
    lengths = cap.batch.lengths.tolist()
    for b, n in enumerate(lengths):
        ids = cap.batch.input_ids[b:b + 1, :n]
        with torch.no_grad():
            want = own.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True).attentions
        for probs, ref in zip(cap.probs, want):
            torch.testing.assert_close(probs[b, :, :n, :n], ref[0], **tolerance("probability"))
            torch.testing.assert_close(probs[b, :, :n].sum(-1), torch.ones(probs.shape[1], n),
                                       **tolerance("probability"))
            assert bool((probs[b, :, :n, n:] == 0).all())
            if own.kind == "decoder":
                assert bool((probs[b, :, :n, :n].triu(1) == 0).all())


def test_analyze_measures_the_maps_and_says_what_it_left_out(own):
    """analyze runs; a statistic from the definition (first: mean over real rows of A[i, 0]) equals the same mean of
    output_attentions; the value-weighted columns are left out with a note naming why."""
    res = analyze(own, TEXTS, n_examples=1)
    heads = res.heads
    assert len(heads) == 2 * 4 and np.isfinite(heads["entropy"]).all()
    from probe.capture.maps import encode

    batch = encode(own, TEXTS)
    sums, rows = np.zeros((2, 4)), 0
    for b, n in enumerate(batch.lengths.tolist()):
        ids = batch.input_ids[b:b + 1, :n]
        with torch.no_grad():
            maps = own.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True).attentions
        sums += np.stack([a[0, :, :, 0].sum(-1).double().numpy() for a in maps])
        rows += n
    np.testing.assert_allclose(heads["first"].to_numpy().reshape(2, 4), sums / rows, rtol=1e-5, atol=1e-7)
    assert "norm_mass" not in heads and any("attention is its own code" in n for n in res.notes)
    import probe

    view = probe.show(res, tokenizer=own.tokenizer)  # the views read the kept maps
    assert view.data["tokens"] and probe.model_view(res, tokenizer=own.tokenizer).data["sites"]


def test_verify_steps_blocks_and_interventions_are_refused_by_name(own):
    """What needs probe's own attention module or the interface is refused by name; the steps run, read from the
    model's projections (tests/test_steps_own_code.py)."""
    from probe.capture.intervene import intervening
    from probe.measures.steps import attention_steps, head_steps
    from probe.verification import verify

    for call, what in ((lambda: verify(own), "probe verify"),
                       (lambda: head_steps(own, TEXTS[0], via="reference"), "attention steps"),
                       (lambda: analyze(own, TEXTS, query_block=4), "block capture"),
                       (lambda: intervening(own).__enter__(), "an intervention on heads")):
        with pytest.raises(UnsupportedArchitectureError, match=what) as err:
            call()
        assert "its attention is its own code" in str(err.value) and "\\n" not in str(err.value)
    df = attention_steps(own, TEXTS[0], site=0, head=0, query=1)
    assert np.isclose(df["probability"].sum(), 1) and df.attrs["steps"].note


@pytest.mark.parametrize("model_type", ["roformer", "xglm"])
def test_cli_analyze_writes_a_run_and_verify_is_one_error_line(tmp_path, model_type):
    model, tok = build(model_type)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    result = invoke_cli("analyze", "--model", tmp_path / "m", "--text", TEXTS[0], "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "heads.csv").exists() and (tmp_path / "run" / "index.html").exists()
    one_error(invoke_cli("verify", "--model", tmp_path / "m"), 1, f"probe verify does not run on {model_type}")


def test_maps_that_are_not_probabilities_are_refused_at_capture():
    """A capture-only model's maps are checked as they come: rows summing to 1 (or 0: fully masked) and no negative
    weight pass; an approximation's row (Nystromformer's landmarks at length) is one CaptureError line."""
    from probe.capture.maps import check_probabilities
    from probe.errors import CaptureError
    from probe.sites import Site

    site = Site("encoder", 0)
    good = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    good[1, :, 4] = 0  # a fully masked row
    check_probabilities("toy", site, good)
    negative = good.clone()
    negative[0, 0, 0, :2] += torch.tensor([-1.0, 1.0])  # the row still sums to 1, one weight below 0
    assert bool((negative[0, 0, 0] < 0).any())
    for bad in (good * 1.01, negative):
        with pytest.raises(CaptureError, match="toy returns at 5 tokens are not attention probabilities"):
            check_probabilities("toy", site, bad)
