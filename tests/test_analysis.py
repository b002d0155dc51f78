"""The analysis loop and its accumulators: the protocol, example maps bounded by what is shown
(long maps kept whole ran out of memory), counts and notes, and input checks before any forward pass."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import assert_statistics_close, tiny_model, tolerance
from probe.capture.maps import capture_attention
from probe.errors import InputError
from probe.measures.accumulators import Accumulator, ExampleMaps
from probe.measures.stats import ALL_STATISTICS, HeadStatistics
from probe.runs.analysis import analyze, run
from probe.text.inputs import as_texts, iter_batches

TEXTS = ["The quick brown fox, which was very quick, jumped over the lazy dog.", "Hello world!",
         "A (small) test: does it work? Yes; it does.", "One two three."]


class Recorder(Accumulator):
    """Records every call it gets (for checking the loop's protocol)."""

    name = "recorder"

    def __init__(self):
        self.calls = []

    def begin_batch(self, batch):
        self.calls.append(("begin", tuple(batch.index)))

    def update(self, site, probs, batch):
        self.calls.append(("update", site.name, tuple(probs.shape), tuple(batch.index)))

    def end_batch(self, batch):
        self.calls.append(("end", tuple(batch.index)))

    def merge(self, other):
        self.calls += other.calls
        return self

    def result(self):
        return list(self.calls)


def test_every_accumulator_gets_every_site_of_every_batch_in_order():
    lm = tiny_model("llama")
    rec = Recorder()
    res = analyze(lm, TEXTS, batch_size=2, n_examples=0, accumulators=[rec])
    calls = res.results["recorder"]
    batches = [c[1] for c in calls if c[0] == "begin"]
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3]
    for b in batches:
        i = calls.index(("begin", b))
        block = calls[i:i + 4]
        assert [c[0] for c in block] == ["begin", "update", "update", "end"]
        assert [c[1] for c in block[1:3]] == ["decoder.0.self", "decoder.1.self"]
        assert all(c[3] == b and c[2][:2] == (len(b), 4) for c in block[1:3])


def test_run_is_the_same_loop_the_analysis_uses():
    """run() with a HeadStatistics accumulator gives the statistics analyze reports."""
    lm = tiny_model("bert")
    stats = HeadStatistics(lm.sites, lm.geometry.n_heads, lm.tokenizer)
    notes = run(lm, iter_batches(lm, as_texts(TEXTS), batch_size=3), [stats])
    assert notes == []
    expected = analyze(lm, TEXTS, batch_size=3, n_examples=0).stats
    assert torch.equal(stats.counts, expected.counts)
    torch.testing.assert_close(stats.sums, expected.sums, atol=1e-12, rtol=0)


def test_example_maps_are_cropped_to_what_is_shown():
    """an example keeps sites x heads x crop x crop probabilities, whatever its length; the
    full map comes on request (example_tokens=None) and equals the captured one."""
    lm = tiny_model("gpt2", max_positions=256)
    long_text = " ".join(f"word{i}" for i in range(120))
    res = analyze(lm, [long_text, "Short."], n_examples=2)
    big, small = res.examples
    assert big.n_tokens > 200 and big.probs.shape == (2, 4, 64, 64) and big.cropped
    assert small.probs.shape[-1] == small.n_tokens < 64 and not small.cropped
    full = analyze(lm, [long_text], n_examples=1, example_tokens=None).examples[0]
    assert full.probs.shape == (2, 4, big.n_tokens, big.n_tokens)
    captured = capture_attention(lm, long_text)
    for i in range(2):
        np.testing.assert_array_equal(full.probs[i], captured.probs[i][0].numpy())
        np.testing.assert_array_equal(big.probs[i], full.probs[i][:, :64, :64])
    assert res.settings["example_tokens"] == 64


@pytest.mark.slow
def test_smollm2_1024_tokens_keeps_64x64_per_head(smollm2):
    text = ("Attention lets every token look at every other token of the sequence. " * 120)
    res = analyze(smollm2, [text], max_length=1024)
    [ex] = res.examples
    assert ex.n_tokens == 1024
    assert ex.probs.shape == (30, 9, 64, 64) and ex.probs.dtype == np.float32
    assert ex.probs.nbytes == 30 * 9 * 64 * 64 * 4  # 4.4 MB instead of 1.1 GB for the whole map


def test_example_maps_merge_by_union():
    lm = tiny_model("bert")
    a, b = ExampleMaps([0], lm.sites), ExampleMaps([1], lm.sites)
    run(lm, iter_batches(lm, as_texts(TEXTS[:2]), batch_size=1), [a, b])
    merged = a.merge(b).result()
    assert [e.index for e in merged] == [0, 1] and [e.text for e in merged] == TEXTS[:2]


def test_analyze_takes_one_string_as_one_text():
    lm = tiny_model("bert")
    res = analyze(lm, "Hello there, world.", n_examples=1)
    assert res.counts["sequences"] == 1
    assert res.examples[0].text == "Hello there, world."


def test_a_left_padding_tokenizer_gives_the_same_statistics():
    lm = tiny_model("bert")
    right = analyze(lm, TEXTS, batch_size=4).heads
    lm.tokenizer.padding_side = "left"
    left = analyze(lm, TEXTS, batch_size=4).heads
    assert_statistics_close(left, right)
    other = [c for c in right.select_dtypes("number").columns if c not in ALL_STATISTICS]
    np.testing.assert_allclose(left[other].to_numpy(), right[other].to_numpy(), equal_nan=True, **tolerance("scaled"))


def test_input_is_checked_before_any_forward_pass(monkeypatch):
    lm = tiny_model("bert")
    calls = []
    monkeypatch.setattr(lm.model, "forward", lambda *a, **k: calls.append(1))
    for kwargs, match in (({"thresholds": {"self": 2.0}}, "must be in"),
                          ({"thresholds": {"induction-head": 0.5}}, "unknown label"),
                          ({"batch_size": 0}, "batch size must be at least 1"),
                          ({"max_length": 1}, "at least 2"),
                          ({"example_tokens": 1}, "at least 2")):
        with pytest.raises(InputError, match=match):
            analyze(lm, ["Hi there."], **kwargs)
    with pytest.raises(InputError, match="text 2 is empty"):
        analyze(lm, ["fine", "  "])
    with pytest.raises(InputError, match="no text"):
        analyze(lm, [])
    assert calls == []
    monkeypatch.undo()
    res = analyze(lm, ["Hi there, you."], thresholds={"self": np.float32(0.25)})
    assert res.thresholds["self"] == 0.25


def test_unknown_word_tokens_are_counted_and_noted():
    """A text of one emoji becomes [UNK] in a WordPiece vocabulary: counted, and a note says so."""
    lm = tiny_model("bert")
    res = analyze(lm, ["\U0001F600", "A normal sentence here."], n_examples=1)
    assert res.counts["tokens"] == 3 + 7  # [CLS] [UNK] [SEP] + [CLS] a normal sentence here . [SEP]
    assert res.counts["unknown_tokens"] == 1
    assert lm.tokenizer.convert_ids_to_tokens(res.examples[0].ids) == ["[CLS]", "[UNK]", "[SEP]"]
    note = next(n for n in res.notes if "[UNK]" in n)
    assert note.startswith("1 of 10 tokens (10.0%) are [UNK]")
    assert math.isfinite(res.heads["self"].sum())
    clean = analyze(lm, ["A normal sentence here."] * 3, n_examples=0)
    assert clean.counts["unknown_tokens"] == 0 and not any("[UNK]" in n for n in clean.notes)


def test_tiny_corpus_gets_a_note():
    from probe.runs.analysis import MIN_TOKENS

    lm = tiny_model("bert")
    res = analyze(lm, ["Hi."], n_examples=0)
    assert res.counts["tokens"] == 4 < MIN_TOKENS  # [CLS] hi . [SEP]
    assert any("labels are unreliable" in n for n in res.notes)
    big = analyze(lm, [" ".join(["word"] * MIN_TOKENS)], n_examples=0)
    assert not any("labels are unreliable" in n for n in big.notes)


def test_model_summary_lists_windows():
    assert analyze(tiny_model("mistral"), TEXTS[:1], n_examples=0).model["windows"] == [8]
    assert analyze(tiny_model("gemma2"), TEXTS[:1], n_examples=0).model["windows"] == [4]
    assert analyze(tiny_model("llama"), TEXTS[:1], n_examples=0).model["windows"] == []


class FirstTokenShare(Accumulator):
    """A toy analysis: a per-head column and a label for heads whose column passes a bar."""

    name = "toy"

    def __init__(self, sites, n_heads):
        self.sums = torch.zeros(len(sites), n_heads, dtype=torch.float64)
        self.sites = {s: i for i, s in enumerate(sites)}

    def update(self, site, probs, batch):
        self.sums[self.sites[site]] += probs[:, :, 0, 0].sum(0).double()  # row 0's attention to itself

    def merge(self, other):
        self.sums += other.sums
        return self

    def result(self):
        return self.sums

    def columns(self):
        import pandas as pd

        L, H = self.sums.shape
        return pd.DataFrame({"layer": np.repeat(range(L), H), "head": np.tile(range(H), L),
                             "toy": self.sums.flatten().numpy()})

    def head_labels(self):
        return [(0, 1, "toy-label", 99.0)]


def test_accumulators_add_columns_and_labels():
    lm = tiny_model("bert")
    toy = FirstTokenShare(lm.sites, 4)
    res = analyze(lm, TEXTS, n_examples=0, accumulators=[toy])
    heads = res.heads
    assert "toy" in heads.columns and heads["toy"].notna().all()
    assert res.results["toy"] is toy.sums
    row = heads[(heads.layer == 0) & (heads["head"] == 1)].iloc[0]
    assert row["label"] == "toy-label" and row["labels"].split(";")[0] == "toy-label"
    assert (heads["label"] == "toy-label").sum() == 1


# --------------------------------------------------------------------------- a long batch says how long it will take


class FakeClock:
    """A clock that advances ``step`` seconds each time it is read (no test waits)."""

    def __init__(self, times=None, step: float = 0.0):
        self.times, self.step, self.now = list(times or []), step, 0.0

    def __call__(self) -> float:
        if self.times:
            self.now = self.times.pop(0)
        else:
            self.now += self.step
        return self.now


def test_a_long_batch_is_announced_once_from_its_second_layer(monkeypatch):
    """One long text (5,000 words through SmolLM2) printed nothing for 100 s. The estimate is elapsed + (layers
    left) x (the second layer's time): the first layer carries the embeddings and a first run's kernel compile,
    so it is not the measure. Said once per run, only where it reaches LONG_S."""
    import probe.runs.pace as pace

    lines: list[str] = []
    # begin at 0; layer 0 ends at 20 s (a compile); layer 1 at 23.1 s: 3.1 s a layer, 28 left: 23.1 + 86.8 s
    monkeypatch.setattr(pace, "clock", FakeClock([0.0, 20.0, 23.1] + [23.1 + 3.1 * k for k in range(1, 29)]))
    p = pace.Pace(30, lines.append)
    p.begin(1, 6512)
    for _ in range(30):
        p.site_done()
    p.end()
    assert lines == ["this batch (1 sequence of up to 6,512 tokens) will take about 1.8 min on this machine: 3.1 s "
                     "per attention layer (its forward pass and statistics), 30 of them"]
    assert abs((23.1 + 3.1 * 28) / 60 - 1.8) < 0.05
    # a second long batch is not said again; a short one never
    monkeypatch.setattr(pace, "clock", FakeClock(step=5.0))
    p.begin(1, 6000)
    for _ in range(30):
        p.site_done()
    assert len(lines) == 1 and len(p.said) == 2
    compiled: list[str] = []  # a short text on a first run: 10 s of compile in its first layer, 0.01 s a layer after
    monkeypatch.setattr(pace, "clock", FakeClock([0.0, 10.0] + [10.0 + 0.01 * k for k in range(1, 6)]))
    first_run = pace.Pace(6, compiled.append)
    first_run.begin(1, 12)
    for _ in range(6):
        first_run.site_done()
    assert compiled == [] and first_run.said == []  # the compile has passed: nothing long is left to announce
    quiet: list[str] = []
    monkeypatch.setattr(pace, "clock", FakeClock(step=0.1))  # 0.1 s a layer: 3 s in all
    short = pace.Pace(30, quiet.append)
    short.begin(16, 40)
    for _ in range(30):
        short.site_done()
    assert quiet == [] and short.said == []
    assert [pace.duration(s) for s in (0.2, 45, 89.6, 100, 5399, 7200)] == ["1 s", "45 s", "90 s", "1.7 min",
                                                                            "90.0 min", "2.0 h"]


def test_analyze_announces_a_long_text_before_its_layers_have_run(monkeypatch, tmp_path):
    """Through analyze and the command line: a clock that moves 4 s each time it is read makes one text of a
    4-layer model a 16 s batch (8 s for two layers, 4 s for each of the two left); the line comes while the
    batch runs, after its second layer, and the run ends as it would have."""
    import probe.runs.pace as pace
    from conftest import invoke_cli, save_tiny

    lm = tiny_model("gpt2", layers=4)
    seen: list[tuple[str, int]] = []
    done = {"sites": 0}

    class Count(Accumulator):
        name = "count"

        def update(self, site, probs, batch, **kw):
            done["sites"] += 1

        def result(self):
            return done["sites"]

    text = "The cat sat on the mat and looked at the dog for a long while."
    tokens = int(capture_attention(lm, text).batch.input_ids.shape[1])
    monkeypatch.setattr(pace, "clock", FakeClock(step=4.0))
    result = analyze(lm, [text], n_examples=0, accumulators=[Count()],
                     announce=lambda line: seen.append((line, done["sites"])))
    assert seen == [(f"this batch (1 sequence of up to {tokens} tokens) will take about 16 s on this machine: 4.0 s "
                     "per attention layer (its forward pass and statistics), 4 of them", 2)]  # after layer 1 of 4
    assert result.results["count"] == 4
    folder = save_tiny("gpt2", tmp_path / "gpt2", layers=4)
    r = invoke_cli("analyze", "--model", folder, "--text", "The cat sat on the mat and looked at the dog.", "--out",
                   tmp_path / "run", "--no-progress")
    assert r.exit_code == 0, r.output
    assert "will take about 16 s on this machine" in r.stderr and r.stderr.count("will take about") == 1


def test_a_long_batch_is_said_on_stderr_where_progress_is_shown_and_no_line_was_given(monkeypatch, capsys):
    """probe why, patch and path label heads with analyze(progress=...) and give it no line to say with: on a
    terminal (progress on) the estimate goes to stderr above the bars; without progress nothing is said."""
    import probe.runs.pace as pace

    lm = tiny_model("gpt2", layers=4)
    monkeypatch.setattr(pace, "clock", FakeClock(step=4.0))
    analyze(lm, ["The cat sat on the mat and looked at the dog."], n_examples=0, progress=True)
    assert capsys.readouterr().err.count("will take about 16 s on this machine") == 1
    analyze(lm, ["The cat sat on the mat and looked at the dog."], n_examples=0)
    assert "will take about" not in capsys.readouterr().err
