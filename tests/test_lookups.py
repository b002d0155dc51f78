"""Ids past the tables they index (probe.capture.lookups): token ids vs the vocabulary, segment ids vs the
segment table, positions vs the position table (RoBERTa's offset included), checked in the one
forward pre-hook every forward path runs under (probe.capture.hooks.measuring).

The field case : a RoBERTa-style encoder with one segment type (type_vocab_size=1,
pad_token_id=3) saved with a BERT tokenizer, which numbers the two segments of a sentence pair 0
and 1. The model's segment table has one row, so segment id 1 used to end in "IndexError: index out
of range in self" in `probe verify` (its sentence-pair case) and `probe analyze --pairs`. Such ids
are dropped with a note (the model then reads every token as segment 0, what its own tokenizer
sends); any other id past its table is one `Error:` line naming the id and the table's size.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tr
from click.testing import CliRunner

import probe.loading.models as pm
from conftest import bert_tokenizer, tiny_config, tiny_model
from probe import capture_attention, verify
from probe.architectures import DISCOVERED
from probe.capture.hooks import measuring
from probe.capture.lookups import check_lookups
from probe.cli import main
from probe.errors import InputError
from probe.runs.analysis import analyze
from probe.text.inputs import Text

PAIR = Text("Where did the cat sit?", pair="The cat sat on the mat.")


def one_segment_roberta(max_positions: int = 64):
    """The field case's model: RoBERTa-style, type_vocab_size=1, pad_token_id=3, a BERT tokenizer."""
    tok = bert_tokenizer()
    config = tiny_config("roberta", len(tok), max_positions=max_positions)
    config.type_vocab_size, config.pad_token_id = 1, 3
    torch.manual_seed(0)
    return tr.RobertaModel(config).eval(), tok


def run(*args):
    return CliRunner().invoke(main, list(args))


def one_error_line(result) -> str:
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


DROPPED = "segment ids dropped"


def test_verify_cli_runs_the_pair_case_with_the_segment_ids_dropped(tmp_path):
    model, tok = one_segment_roberta()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    res = run("verify", "--model", str(tmp_path / "m"), "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    pair = next(c for c in out["cases"] if c["name"] == "sentence-pair")
    assert pair["passed"] and out["passed"]
    note = next(n for n in out["notes"] if DROPPED in n)
    assert "segment ids up to 1" in note and "type_vocab_size=1" in note


def test_analyze_pairs_cli_drops_the_segment_ids_with_a_note(tmp_path):
    model, tok = one_segment_roberta()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    (tmp_path / "pairs.tsv").write_text("Where did the cat sit?\tThe cat sat on the mat.\n"
                                        "Is it raining?\tNo, the sun is out today.\n", encoding="utf-8")
    res = run("analyze", "--model", str(tmp_path / "m"), "--pairs", str(tmp_path / "pairs.tsv"),
              "--out", str(tmp_path / "run"), "--no-distance", "--no-progress")
    assert res.exit_code == 0, res.output
    assert any(DROPPED in n for n in json.loads((tmp_path / "run" / "run.json").read_text())["notes"])
    assert DROPPED in res.stderr


def test_dropped_segment_ids_give_what_segment_zero_gives():
    """Dropping the ids is the model's own reading: its output equals the output with every id 0."""
    model, tok = one_segment_roberta()
    lm = pm.from_pretrained_objects(model, tok)
    got = capture_attention(lm, PAIR)
    assert int(got.batch.token_type_ids.max()) == 1  # the tokenizer did give segment 1
    assert any(DROPPED in n for n in got.notes)
    zeros = {"input_ids": got.batch.input_ids, "attention_mask": got.batch.attention_mask,
             "token_type_ids": torch.zeros_like(got.batch.token_type_ids)}
    with torch.no_grad():
        expected = model(**zeros).last_hidden_state
    assert torch.equal(got.outputs.last_hidden_state, expected)


def test_segment_ids_past_a_table_of_two_rows_are_an_error():
    lm = tiny_model("bert")  # type_vocab_size=2
    ids = torch.tensor([[101, 2023, 102]])
    with measuring(lm.model), pytest.raises(InputError) as err:
        lm.model(input_ids=ids, token_type_ids=torch.tensor([[0, 1, 2]]))
    assert "segment id 2" in str(err.value) and "type_vocab_size=2" in str(err.value)


def small_vocab_bert(tmp_path=None):
    tok = bert_tokenizer()
    config = tiny_config("bert", 1000)  # the tokenizer has 30522 ids
    torch.manual_seed(0)
    model = tr.BertModel(config).eval()
    if tmp_path is not None:
        model.save_pretrained(tmp_path)
        tok.save_pretrained(tmp_path)
    return pm.from_pretrained_objects(model, tok)


def test_token_ids_past_the_vocabulary_fail_on_every_forward_path():
    """capture, analyze, show and verify all run under the one check (the circuit probe: next test)."""
    from probe.entries.notebook import show
    from probe.verification.battery import SENTENCE

    lm = small_vocab_bert()
    text = "The cat sat on the mat."
    calls = [(lambda: capture_attention(lm, text), text), (lambda: analyze(lm, [text], n_examples=0), text),
             (lambda: show(lm, text), text), (lambda: verify(lm, cases=["sentence"]), SENTENCE)]
    for call, sent in calls:
        highest = max(lm.tokenizer(sent)["input_ids"])  # the error names the highest id
        assert highest >= 1000
        with pytest.raises(InputError) as err:
            call()
        assert f"token id {highest} (input_ids) is outside the model's vocabulary (vocab_size) of 1000 tokens" \
            in str(err.value)
    assert all(not m._forward_pre_hooks for m in lm.model.modules())  # the check went with its context


def test_token_ids_past_the_vocabulary_in_the_circuit_probe():
    from probe.patterns import circuit_probe

    tok = tiny_model("gpt2", wrap=False)[1]
    torch.manual_seed(0)
    model = tr.GPT2LMHeadModel(tiny_config("gpt2", 500)).eval()  # the BPE tokenizer has 49152 ids
    with pytest.raises(InputError, match="vocabulary \\(vocab_size\\) of 500 tokens"):
        circuit_probe(pm.from_pretrained_objects(model, tok))


def test_token_id_error_is_one_cli_line_naming_both_numbers(tmp_path):
    small_vocab_bert(tmp_path / "m")
    line = one_error_line(run("analyze", "--model", str(tmp_path / "m"), "--text", "The cat sat on the mat.",
                              "--out", str(tmp_path / "run"), "--no-progress"))
    assert "token id" in line and "1000 tokens" in line
    assert not (tmp_path / "run" / "run.json").exists()


def test_roberta_positions_count_from_the_padding_offset():
    """pad_token_id=3: position p reads row 4 + p, so a table of 20 rows holds 16 tokens. The check's
    bound is the model's own: 16 tokens run, 17 fail in the bare model and InputError here."""
    model, tok = one_segment_roberta(max_positions=18)
    assert model.config.max_position_embeddings == 20 and model.embeddings.position_embeddings.num_embeddings == 20
    assert pm.from_pretrained_objects(model, tok).max_length == 16  # probe's own limit agrees
    fits, over = torch.full((1, 16), 7), torch.full((1, 17), 7)
    check_lookups(model, {"input_ids": fits})
    model(input_ids=fits)
    with pytest.raises((IndexError, RuntimeError), match="out of"):  # "index out of range" / "out of bounds"
        model(input_ids=over)
    with pytest.raises(InputError) as err:
        check_lookups(model, {"input_ids": over})
    assert "position row 20" in str(err.value) and "20 rows" in str(err.value)
    assert "max_position_embeddings=20" in str(err.value) and "padding id 3 + 1" in str(err.value)
    # padding (id 3) is not counted: 17 tokens of which 2 are padding fit
    padded = torch.cat([fits[:, :15], torch.full((1, 2), 3)], 1)
    check_lookups(model, {"input_ids": padded})
    model(input_ids=padded)


def test_explicit_and_cached_positions_are_checked():
    lm = tiny_model("gpt2")  # n_positions: the conftest default
    rows = lm.model.transformer.wpe.num_embeddings
    ids = torch.tensor([[5, 6]])
    with pytest.raises(InputError, match=f"position row {rows} \\(position_ids\\)"):
        check_lookups(lm.model, {"input_ids": ids, "position_ids": torch.tensor([[0, rows]])})
    # a key/value cache: the mask covers past + new tokens; the last new token sits at row past + 1
    check_lookups(lm.model, {"input_ids": ids, "attention_mask": torch.ones(1, rows)})
    with pytest.raises(InputError, match=f"position row {rows} \\({rows + 1} tokens\\)"):
        check_lookups(lm.model, {"input_ids": ids, "attention_mask": torch.ones(1, rows + 1)})


def test_a_decoder_alone_reads_its_decoder_table_with_the_input_ids():
    """WhisperForCausalLM: the decoder's table (model.decoder.embed_positions, max_target_positions rows)
    indexed by input_ids, not decoder_input_ids; its limit is the model's (it used to end in
    "IndexError: index 128 is out of bounds" in `probe verify`'s max-length case)."""
    tok = bert_tokenizer()
    config = tr.WhisperConfig(vocab_size=len(tok), pad_token_id=0, d_model=32, decoder_layers=1,
                              decoder_attention_heads=2, decoder_ffn_dim=64, encoder_layers=1,
                              encoder_attention_heads=2, encoder_ffn_dim=64,
                              max_target_positions=16, max_source_positions=16, num_mel_bins=8)
    torch.manual_seed(0)
    model = tr.WhisperForCausalLM(config).eval()
    before = DISCOVERED.pop("whisper", None)  # a speech test's discovery of the whole model is kept apart
    try:
        assert pm.from_pretrained_objects(model, tok, name="tiny-whisper-decoder").max_length == 16
    finally:
        DISCOVERED.pop("whisper", None)
        if before is not None:
            DISCOVERED["whisper"] = before
    check_lookups(model, {"input_ids": torch.zeros(1, 16, dtype=torch.long)})  # rows 0..15: fits
    with pytest.raises(InputError, match=r"position row 16 \(17 tokens\) is outside the model's position table "
                                         r"of 16 rows \(model\.decoder\.embed_positions"):
        check_lookups(model, {"input_ids": torch.zeros(1, 17, dtype=torch.long)})
