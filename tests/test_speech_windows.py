"""Whisper clips longer than the model's window: cut into consecutive windows, each analysed as a
clip of its own with its times offset by its start (tiny random Whisper with a 2 s window)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import soundfile
from speech_models import RATE, save_whisper, write_tone

from conftest import invoke_cli, one_error
from probe.audio import analyze_audio, clips
from probe.audio.batches import windows
from probe.errors import InputError
from probe.loading.models import load_model


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    """A 4.5 s clip (windows of 2, 2 and 0.5 s) and its three pieces written as files of their own."""
    folder = tmp_path_factory.mktemp("windows")
    lm = load_model(str(save_whisper(folder / "whisper")))
    rng = np.random.default_rng(0)
    wave = (0.2 * rng.standard_normal(round(4.5 * RATE))).astype(np.float32)
    soundfile.write(str(folder / "long.wav"), wave, RATE, subtype="FLOAT")
    pieces = []
    for k, (a, b) in enumerate([(0, 2 * RATE), (2 * RATE, 4 * RATE), (4 * RATE, len(wave))]):
        soundfile.write(str(folder / f"piece{k}.wav"), wave[a:b], RATE, subtype="FLOAT")
        pieces.append(folder / f"piece{k}.wav")
    whole = analyze_audio(lm, [folder / "long.wav"], n_clips=3, max_new_tokens=6)
    apart = analyze_audio(lm, pieces, n_clips=3, max_new_tokens=6)
    return lm, folder, whole, apart


def test_windows_are_consecutive_and_the_last_holds_the_rest():
    x = np.arange(10)
    assert [(s, p.tolist()) for s, p in windows(x, 4)] == [(0, [0, 1, 2, 3]), (4, [4, 5, 6, 7]), (8, [8, 9])]
    assert [s for s, _ in windows(x, 10)] == [0] and windows(x[:0], 4)[0][1].size == 0


def test_a_long_clip_is_its_windows_analysed_apart(long_run):
    lm, folder, whole, apart = long_run
    seqs = clips(lm, [folder / "long.wav"], max_new_tokens=6)
    assert len(seqs) == 3 and seqs.items == ["long.wav [0-2 s]", "long.wav [2-4 s]", "long.wav [4-4.5 s]"]
    assert seqs.offsets == [0.0, 2.0, 4.0]
    assert next(seqs.iter_batches()).clip_frames == [100, 100, 25]  # 0.02 s frames
    columns = ["time_distance_s", "audio_share", "monotonicity", "entropy"]
    pd.testing.assert_frame_equal(whole.heads[columns], apart.heads[columns], rtol=1e-6)
    for w, a in zip(whole.results["speech"], apart.results["speech"]):
        assert w.tokens == a.tokens and a.offset_s == 0.0
        assert [t for t, _, _ in w.alignment()] == [t for t, _, _ in a.alignment()]
        np.testing.assert_allclose([s for _, s, _ in w.alignment()], [s + w.offset_s for _, s, _ in a.alignment()])
    assert [w.offset_s for w in whole.results["speech"]] == [0.0, 2.0, 4.0]


def test_the_report_keeps_the_offsets(long_run, tmp_path):
    from probe.report import write_run

    lm, _, whole, _ = long_run
    path = write_run(whole, lm.tokenizer, tmp_path / "run")
    record = json.loads((path / "run.json").read_text())["speech-attention"]["clips"]
    assert [(c["name"], c["offset_s"], c["seconds"]) for c in record] == [
        ("long.wav [0-2 s]", 0.0, 2.0), ("long.wav [2-4 s]", 2.0, 2.0), ("long.wav [4-4.5 s]", 4.0, 0.5)]
    assert ">4 s</text>" in (path / "index.html").read_text()  # the third window's axis starts at 4 s


def test_a_transcript_for_a_long_clip_is_one_error(tmp_path):
    folder = save_whisper(tmp_path / "w")
    long = write_tone(tmp_path / "long.wav", 2.5)
    with pytest.raises(InputError, match="cannot be split"):
        clips(load_model(str(folder)), [long], transcripts=["hello"])
    one_error(invoke_cli("analyze", "--model", folder, "--audio", long, "--transcript", "hi", "--out", tmp_path / "x"),
              1, "cannot be split")
