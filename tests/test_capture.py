"""Attention capture: unpadded causal weights above the diagonal are 0 (a fast backend's fallback lost
the mask), sdpa gives no weights (probe runs eager and says so), train mode, and hook hygiene."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import DECODERS, FAMILIES, SEQ2SEQ, hook_snapshot, no_hooks, notes, tiny_model, tolerance
from probe.capture.hooks import ensure_eager
from probe.capture.maps import attention_hooks, capture_attention, encode
from probe.errors import CaptureError, InputError
from probe.loading.models import from_pretrained_objects
from probe.loading.seq2seq import sides
from probe.runs.analysis import analyze
from probe.text.inputs import Text, as_texts, tokenize

#: Six tokens with both tokenizers: the byte-level BPE (SmolLM2's and the tests', no special tokens added) and MiniLM's
#: WordPiece ([CLS] the cat sat on [SEP]).
SIX = {"bpe": "The cat sat on the mat", "wordpiece": "the cat sat on"}


def _eager_reference(model, enc):
    """The model's own eager forward with output_attentions / output_hidden_states."""
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("eager")
    ref.eval()
    with torch.no_grad():
        return ref(**enc.model_inputs(), output_attentions=True, output_hidden_states=True, use_cache=False)


# --------------------------------------------------------------------------- causal weights above the diagonal

@pytest.mark.parametrize("family,tokenizer", [
    ("gpt2", "bpe"), ("gpt2", "wordpiece"), ("llama", "bpe"), ("qwen2", "bpe"),
])
def test_causal_mask_kept_on_unpadded_sequence(family, tokenizer):
    """decoder, one unpadded 6-token sequence, loaded with sdpa: weights above the diagonal
    are exactly 0, and weights and hidden states equal the eager run (fp32, atol 1e-5)."""
    model, tok = tiny_model(family, tokenizer, attn_implementation="sdpa", wrap=False)
    assert model.config._attn_implementation == "sdpa"
    lm = from_pretrained_objects(model, tok)
    lm.model.set_attn_implementation("sdpa")  # as a user could do after loading
    enc = encode(lm, [SIX[tokenizer]])
    assert enc.input_ids.shape == (1, 6) and int(enc.attention_mask.sum()) == 6  # unpadded
    ref = _eager_reference(lm.model, enc)

    captured = capture_attention(lm, SIX[tokenizer])
    assert any("'sdpa'" in n and "'probe'" in n for n in captured.notes)  # switched to probe's function
    assert len(captured.probs) == 2
    above = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    for layer, probs in enumerate(captured.probs):
        assert probs.shape == (1, 4, 6, 6)
        assert probs.dtype == torch.float32
        assert torch.count_nonzero(probs[..., above]) == 0
        torch.testing.assert_close(probs, ref.attentions[layer], atol=1e-5, rtol=0)
    torch.testing.assert_close(captured.outputs.logits, ref.logits, **tolerance("scaled"))

    # hidden states of the forward pass that probe's hooks watched
    maps = {}
    with torch.no_grad(), attention_hooks(lm, lambda site, p: maps.__setitem__(site.layer, p)):
        out = lm.model(**enc.model_inputs(), output_hidden_states=True, use_cache=False)
    assert len(out.hidden_states) == len(ref.hidden_states) == 3
    for got, want in zip(out.hidden_states, ref.hidden_states):
        torch.testing.assert_close(got, want, **tolerance("scaled"))  # hidden states
    for layer in range(2):
        assert torch.count_nonzero(maps[layer][..., above]) == 0


@pytest.mark.slow
def test_causal_mask_kept_on_unpadded_sequence_smollm2_switched_to_sdpa(smollm2):
    """On the real LLaMA-style model, switched to sdpa by the user before capture."""
    smollm2.model.set_attn_implementation("sdpa")
    enc = encode(smollm2, [SIX["bpe"]])
    assert enc.input_ids.shape == (1, 6)
    captured = capture_attention(smollm2, SIX["bpe"])
    assert smollm2.model.config._attn_implementation == "sdpa"  # the user's choice is restored
    smollm2.model.set_attn_implementation("eager")  # the reference run below needs probabilities
    assert any("eager" in n and "restored" in n for n in captured.notes)
    assert len(captured.probs) == 30
    above = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        ref = smollm2.model(**enc.model_inputs(), output_attentions=True, use_cache=False)
    for layer, probs in enumerate(captured.probs):
        assert probs.shape == (1, 9, 6, 6)
        assert torch.count_nonzero(probs[..., above]) == 0
        torch.testing.assert_close(probs, ref.attentions[layer], atol=1e-5, rtol=0)
    torch.testing.assert_close(captured.outputs.logits, ref.logits, atol=1e-4, rtol=1e-5)


# --------------------------------------------------------------------------- sdpa returns no weights

@pytest.mark.parametrize("family", FAMILIES)
def test_sdpa_model_is_switched_to_eager_when_wrapped(family):
    try:
        model, tok = tiny_model(family, attn_implementation="sdpa", wrap=False)
    except ValueError as exc:  # Gemma 2 has no sdpa path in transformers
        assert "does not support an attention implementation" in str(exc)
        pytest.skip(f"{family} cannot be built with sdpa")
    assert model.config._attn_implementation == "sdpa"
    lm = from_pretrained_objects(model, tok)
    assert lm.model.config._attn_implementation == "eager"
    assert len(lm.notes) == 1 and "sdpa" in lm.notes[0] and "eager" in lm.notes[0]
    texts = ["A first sentence, a bit longer.", "Short."]
    if family in SEQ2SEQ:  # a source and a target each
        texts = [Text(t, target="Une phrase courte.") for t in texts]
    captured = capture_attention(lm, texts)
    assert len(captured.probs) == len(lm.sites)
    assert lm.geometry.n_layers == 2 and (family in SEQ2SEQ or len(lm.sites) == 2)
    for site, probs in zip(lm.sites, captured.probs):
        queries, keys = sides(site, captured.batch)  # the batch itself, or target/source sides
        assert probs is not None and probs.numel() > 0
        assert probs.shape == (2, 4, queries.input_ids.shape[1], keys.input_ids.shape[1])


@pytest.mark.parametrize("family", ["bert", "distilbert", "gpt2", "llama"])
def test_capture_switches_sdpa_to_probes_function_and_says_so(family, caplog):
    lm = tiny_model(family)
    lm.model.set_attn_implementation("sdpa")
    with notes(caplog, "probe.capture.hooks"):
        captured = capture_attention(lm, ["One sentence here.", "Two."])
    assert lm.model.config._attn_implementation == "sdpa"  # switched for the capture, then restored
    assert any("'sdpa'" in n and "'probe'" in n for n in captured.notes)
    assert any("'probe'" in r.getMessage() for r in caplog.records)
    T = captured.batch.input_ids.shape[1]
    assert [tuple(p.shape) for p in captured.probs] == [(2, 4, T, T)] * 2
    real = captured.probs[0][1, :, : int(captured.batch.lengths[1]), :]
    torch.testing.assert_close(real.sum(-1), torch.ones_like(real.sum(-1)), atol=1e-5, rtol=0)

    lm.model.set_attn_implementation("sdpa")
    result = analyze(lm, ["One sentence here.", "Two."], n_examples=1)
    assert any("'sdpa'" in n and "'probe'" in n for n in result.notes)
    assert result.examples[0].probs.shape[:2] == (2, 4)
    assert result.heads[["self", "first", "entropy"]].notna().all().all()


def test_ensure_eager_is_a_no_op_on_eager_models():
    lm = tiny_model("bert")
    assert ensure_eager(lm.model) is None
    assert lm.notes == []


def test_layer_without_probabilities_is_a_clear_error():
    """If a layer still returns no probabilities, capture stops with a CaptureError naming the layer."""
    lm = tiny_model("bert")
    attn = lm.model.encoder.layer[1].attention.self
    drop = attn.register_forward_hook(lambda m, a, out: (out[0], None))
    try:
        with pytest.raises(CaptureError, match="site encoder.1.self returned no attention probabilities"):
            capture_attention(lm, "Some text.")
    finally:
        drop.remove()
    assert no_hooks(lm.model)


# --------------------------------------------------------------------------- train mode

def test_train_mode_with_dropout_captures_eval_weights_and_restores_mode():
    lm = tiny_model("bert", dropout=0.5)
    texts = ["Dropout must not touch the captured attention.", "Second."]
    enc = encode(lm, texts)
    eval_maps = capture_attention(lm, texts).probs

    lm.model.train()
    # sanity: in train mode the model's own attention probabilities do change (dropout is on)
    torch.manual_seed(1)
    with torch.no_grad():
        noisy = lm.model(**enc.model_inputs(), output_attentions=True).attentions
    assert not torch.allclose(noisy[0], eval_maps[0])

    captured = capture_attention(lm, texts)
    assert lm.model.training
    assert all(m.training for m in lm.model.modules())
    assert any("train mode" in n for n in captured.notes)
    for got, want in zip(captured.probs, eval_maps):
        assert torch.equal(got, want)

    result = analyze(lm, texts, n_examples=0)
    assert lm.model.training
    lm.model.eval()
    expected = analyze(lm, texts, n_examples=0)
    assert result.heads[["self", "prev", "entropy"]].equals(expected.heads[["self", "prev", "entropy"]])


# --------------------------------------------------------------------------- hooks

def test_hooks_removed_after_capture():
    lm = tiny_model("llama")
    assert no_hooks(lm.model)
    seen = []
    with torch.no_grad(), attention_hooks(lm, lambda site, p: seen.append((site.layer, tuple(p.shape)))) as notes:
        attn = [layer.self_attn for layer in lm.model.model.layers]
        assert all(len(m._forward_hooks) == 1 for m in attn)
        lm.model(**encode(lm, ["Hooks are global state."]).model_inputs(), use_cache=False)
    assert notes == []
    assert [s[0] for s in seen] == [0, 1]
    assert no_hooks(lm.model)
    capture_attention(lm, "Again.")
    analyze(lm, ["And once more."], n_examples=1, n_clusters=2)
    assert no_hooks(lm.model)


def test_hooks_removed_and_mode_restored_on_exception_in_body():
    lm = tiny_model("gpt2")
    lm.model.train()
    with pytest.raises(RuntimeError, match="boom"):
        with attention_hooks(lm, lambda site, p: None):
            assert not no_hooks(lm.model)
            assert not lm.model.training
            raise RuntimeError("boom")
    assert no_hooks(lm.model)
    assert lm.model.training


def test_hooks_removed_on_exception_in_callback():
    lm = tiny_model("distilbert")

    def fail(site, probs):
        if site.layer == 1:
            raise ValueError("callback failed")

    with pytest.raises(ValueError, match="callback failed"):
        with torch.no_grad(), attention_hooks(lm, fail):
            lm.model(**encode(lm, ["Text."]).model_inputs())
    assert no_hooks(lm.model)
    assert not lm.model.training


@pytest.mark.slow
def test_capture_keeps_transformers_own_hooks(minilm):
    """Capture removes its own hooks and leaves any other hook of the model alone."""
    with torch.no_grad():
        minilm.model(**encode(minilm, ["x"]).model_inputs(), output_attentions=True)
    before = hook_snapshot(minilm.model)
    capture_attention(minilm, ["A sentence.", "Another one, longer than the first."])
    assert hook_snapshot(minilm.model) == before


# --------------------------------------------------------------------------- tokenization

def test_encode_right_pads_and_counts_truncation():
    lm = tiny_model("bert")
    enc = encode(lm, ["one two three four five", "one"], max_length=4)
    assert enc.truncated == [True, False]
    assert enc.input_ids.shape == (2, 4)
    assert enc.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert enc.lengths.tolist() == [4, 3]
    assert lm.tokenizer.convert_ids_to_tokens(enc.input_ids[1, :3]) == ["[CLS]", "one", "[SEP]"]
    assert lm.tokenizer.convert_ids_to_tokens(enc.input_ids[0])[-1] == "[SEP]"  # truncation keeps [SEP]
    assert enc.token_type_ids is not None


def test_tokenize_rejects_empty_input():
    lm = tiny_model("llama")
    with pytest.raises(InputError):
        tokenize(lm, [])
    with pytest.raises(InputError, match="no tokens"):
        tokenize(lm, as_texts([""]))  # the BPE tokenizer adds no special tokens: nothing to attend
    with pytest.raises(InputError):
        analyze(lm, ["fine", "  "])


@pytest.mark.parametrize("family", DECODERS)
def test_batches_are_right_padded_whatever_the_tokenizer_side(family):
    """Statistics need real tokens first: batches are right-padded even if the tokenizer pads left."""
    lm = tiny_model(family)
    lm.tokenizer.padding_side = "left"
    assert lm.tokenizer.pad_token is not None
    if family in SEQ2SEQ:  # both sides right-padded
        enc = encode(lm, [Text("a b c d e f g", target="a"), Text("a", target="a b c d e f g")])
        assert enc.target.attention_mask[0].tolist()[0] == 1 and enc.target.attention_mask[0].tolist()[-1] == 0
    else:
        enc = encode(lm, ["a b c d e f g", "a"])
    assert enc.attention_mask[1].tolist()[0] == 1 and enc.attention_mask[1].tolist()[-1] == 0


def test_capture_restores_the_attention_implementation():
    lm = tiny_model("gpt2", attn_implementation="sdpa")
    assert lm.model.config._attn_implementation == "eager"  # from_pretrained_objects switched it
    lm.model.set_attn_implementation("sdpa")
    captured = capture_attention(lm, "The cat sat on the mat.")
    assert len(captured.probs) == lm.geometry.n_layers
    assert any("restored afterwards" in n for n in captured.notes)
    assert lm.model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError):
        with attention_hooks(lm, lambda site, probs: None):
            raise RuntimeError("boom")
    assert lm.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("max_length", [1, 0, -3])
def test_capture_rejects_max_length_below_two(max_length):
    with pytest.raises(InputError, match="at least 2"):
        capture_attention(tiny_model("bert"), "The cat sat.", max_length=max_length)


@pytest.mark.parametrize("kind", ["deberta-v2", "bloom", "falcon", "falcon-alibi", "gpt_neo", "mpnet"])
def test_families_outside_the_interface_are_captured_through_probes_function(kind, monkeypatch):
    """DeBERTa, BLOOM, Falcon, GPT-Neo and MPNet compute attention inline; capture swaps in probe's
    reference module, which calls probe's attention function: one call of its operation per site and
    pass, maps equal to the model's own eager maps at every real row and key (float32 rounding),
    modules back after."""
    import probe.capture.interface as interface
    from probe.capture.maps import forward
    from probe.capture.swapped import is_swapped

    lm = tiny_model(kind)
    texts = ["One sentence here, a bit longer.", "Two."]
    capture_attention(lm, texts)  # the first capture also checks, once per model, that the reference agrees
    calls, op = [], interface.scored_attention
    monkeypatch.setattr(interface, "scored_attention", lambda *a, **k: calls.append(1) or op(*a, **k))
    captured = capture_attention(lm, texts)
    monkeypatch.undo()
    assert len(calls) == len(lm.sites) and not is_swapped(lm)
    with torch.no_grad():
        own = forward(lm, captured.batch, output_attentions=True).attentions
    for probs, theirs in zip(captured.probs, own, strict=True):
        for row, length in enumerate(captured.batch.lengths.tolist()):
            # to float32 rounding: equal on the swap check's batch, a few ulps on others on some CPUs
            torch.testing.assert_close(probs[row, :, :length, :length], theirs[row, :, :length, :length],
                                       rtol=0, atol=1e-5)
