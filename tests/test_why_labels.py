"""``probe why``'s head labels (probe.qk.labels): the labelling analysis of the built-in sample texts, computed
once per model and cached in memory and on disk (in a temporary cache folder here, never the user's).

The analysis is counted through a stand-in for ``probe.qk.labels.analyze`` that calls the real one: a cache
hit is a call that does not reach it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from test_run_calls import assert_same_folder

import probe
import probe.loading.checkpoints as checkpoints
import probe.qk.labels as labels
from conftest import tiny_model
from probe.patterns import circuit_probe
from probe.qk.run import why_analysis
from probe.report import write_run
from probe.text.corpus import sample_texts

TEXTS = ["When Mary and John went to the store, John gave a drink to Mary.", "The cat sat on the mat. The cat"]


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """The analyses run (a list of the texts each was given), the cache folder ``tmp_path`` (through
    ``$PROBE_CACHE``, as a user would set it) and an empty memory cache."""
    calls = []
    real = labels.analyze

    def analyze(lm, texts, **kw):
        calls.append(list(texts))
        return real(lm, texts, **kw)

    monkeypatch.setattr(labels, "analyze", analyze)
    monkeypatch.setattr(labels, "cache_dir", checkpoints.cache_dir)
    monkeypatch.setenv("PROBE_CACHE", str(tmp_path))
    labels.forget()
    yield calls
    labels.forget()


def _heads_labels(lm) -> dict:
    """Head name -> label of the analysis run here, independently of the cache (the sample, the circuit probe)."""
    heads = probe.analyze(lm, sample_texts(), finished=[circuit_probe(lm)]).heads
    return {f"L{int(r.layer)}H{int(r.head)}": str(r.label) for r in heads.itertuples()}


def _assert_same_analysis(a, b) -> None:
    pd.testing.assert_frame_equal(a.heads, b.heads, check_exact=True)
    assert (a.model, a.thresholds, a.counts, a.settings, a.notes) == (b.model, b.thresholds, b.counts, b.settings,
                                                                        b.notes)
    assert len(a.examples) == len(b.examples) > 0
    for x, y in zip(a.examples, b.examples):
        assert (x.text, list(x.ids), [tuple(o) for o in x.offsets], list(x.special)) == \
               (y.text, list(y.ids), [tuple(o) for o in y.offsets], list(y.special))
        np.testing.assert_array_equal(x.probs, y.probs)
        assert x.probs.dtype == y.probs.dtype
    assert sorted(a.results) == sorted(b.results)
    np.testing.assert_array_equal(a.results["sink_profile"].sums, b.results["sink_profile"].sums)
    assert a.results["sink_profile"].sites == b.results["sink_profile"].sites
    if "circuits" in a.results:
        pd.testing.assert_frame_equal(a.results["circuits"].scores, b.results["circuits"].scores, check_exact=True)


def test_the_labels_are_the_sample_analysis_and_a_second_call_reads_memory(counted):
    lm = tiny_model("llama")
    first, source = labels.labelling(lm)
    assert source == "computed" and len(counted) == 1
    assert counted[0] == sample_texts()  # the sample only: no text of the user's
    expected = _heads_labels(lm)
    assert labels.label_map(first) == expected and len(expected) == 2 * 4
    assert first.stats is None and "circuits" in first.results
    second, source = labels.labelling(lm)
    assert source == "memory" and len(counted) == 1
    assert labels.label_map(second) == expected
    _assert_same_analysis(first, second)
    second.notes.append("changed by a caller")  # the caller's copy: the cache keeps its own
    second.results["why"] = object()
    assert labels.labelling(lm)[0].notes == first.notes and "why" not in labels.labelling(lm)[0].results


def test_the_disk_cache_is_written_under_probe_cache_and_read_back(counted, tmp_path):
    lm = tiny_model("llama")
    computed, _ = labels.labelling(lm)
    path = labels.cache_file(lm)
    assert path.parent == tmp_path / "labels" and path.is_file()
    assert [p.name for p in (tmp_path / "labels").iterdir()] == [path.name]  # no temporary file left
    other = tiny_model("llama")  # the same weights in another object: no memory entry, the same file
    read, source = labels.labelling(other)
    assert source == "disk" and len(counted) == 1
    _assert_same_analysis(computed, read)
    assert labels.labelling(other)[1] == "memory"
    labels.forget(lm)
    assert labels.labelling(lm)[1] == "disk" and len(counted) == 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "another key"])
def test_a_damaged_cache_file_is_ignored_and_written_again(counted, damage):
    lm = tiny_model("llama")
    computed, _ = labels.labelling(lm)
    path, key = labels.cache_file(lm), labels.cache_key(lm)
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"not a probe file")
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        assert labels.write(path, "0" * 64, computed)
    assert labels.read(path, key) is None
    labels.forget()
    again, source = labels.labelling(lm)
    assert source == "computed" and len(counted) == 2
    _assert_same_analysis(computed, again)
    assert labels.read(path, key) is not None  # rewritten


def test_another_model_has_another_key(counted):
    a, b = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    assert labels.cache_key(a) == labels.cache_key(tiny_model("llama", seed=0))
    assert labels.cache_key(a) != labels.cache_key(b)
    assert labels.cache_file(a) != labels.cache_file(b)
    assert labels.cache_key(a) != labels.cache_key(tiny_model("gpt2"))
    labels.labelling(a)
    assert labels.labelling(b)[1] == "computed" and len(counted) == 2
    key = labels.cache_key(a)
    with torch.no_grad():  # weights changed in place: the memory entry of the same object no longer fits
        next(a.model.parameters()).mul_(2.0)
    assert labels.cache_key(a) != key
    assert labels.labelling(a)[1] == "computed" and len(counted) == 3


@pytest.mark.parametrize("kind", ["bert", "bart"])
def test_encoders_and_encoder_decoders_round_trip(counted, kind):
    lm = tiny_model(kind)
    computed, _ = labels.labelling(lm)
    labels.forget()
    read, source = labels.labelling(lm)
    assert source == "disk"
    _assert_same_analysis(computed, read)
    if kind == "bart":  # each sample text read as its own target
        assert all(t.target == t.text for t in counted[0])
        assert read.examples[0].target is not None and read.examples[0].decoder
        for x, y in zip(computed.examples, read.examples):
            for name in x.decoder:
                np.testing.assert_array_equal(x.decoder[name], y.decoder[name])


def test_the_why_folder_is_the_same_from_a_computed_or_cached_labelling(counted, tmp_path):
    """The labels beside the sources are heads.csv's, do not depend on the text, and the folder is the same
    whether the labelling ran, came from the file or from memory (but for the times)."""
    lm = tiny_model("llama")
    folders = []
    for k, expected in enumerate(["computed", "disk", "memory"]):
        if expected == "disk":
            labels.forget()
        run, analysis = why_analysis(lm, TEXTS[0], "L1H2", top=3)
        folders.append(write_run(analysis, lm.tokenizer, tmp_path / f"run-{k}"))
        assert len(counted) == 1
        heads = pd.read_csv(folders[-1] / "heads.csv")
        assert run.labels == {f"L{r.layer}H{r.head}": r.label for r in heads.itertuples()}
        assert run.labels == _heads_labels(lm)
        assert analysis.counts["sequences"] == len(sample_texts())
        assert analysis.timings["labels_s"] >= 0 and run.seconds["labels_s"] >= 0
    assert_same_folder(folders[0], folders[1])
    assert_same_folder(folders[0], folders[2])
    other, _ = why_analysis(lm, TEXTS[1], "L1H2")
    assert other.labels == run.labels and len(counted) == 1
