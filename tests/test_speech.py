"""Speech: the time axis, audio input, the alignment (median filter, dynamic time warping, token
times) against independent computations and closed forms, Whisper's encoder, decoder and cross
attention shapes and axes, the time measures, the report section and the CLI (tiny random Whisper)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile
import torch
from scipy.stats import spearmanr
from speech_models import POSITIONS, RATE, save_whisper, whisper_config, write_tone

from conftest import assert_same_run, invoke_cli, one_error, tolerance
from probe.architectures.speech import alignment_heads, conv_stride, frame_seconds, is_speech
from probe.audio import (
    analyze_audio,
    clips,
    dtw,
    median_filter,
    monotone_heads,
    monotonicity,
    read_audio,
    resample,
    show_speech,
    token_times,
)
from probe.errors import InputError
from probe.loading.models import load_model
from probe.loading.sound import FRAME_ID, SpeechProcessor

ROOT = Path(__file__).resolve().parents[1]
FRAME_S = 0.02  # 160 samples per mel frame at 16 kHz, stride 2


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    """A loaded tiny Whisper and two clips (1.0 s mono 16 kHz, 0.7 s stereo 22.05 kHz)."""
    folder = tmp_path_factory.mktemp("speech")
    lm = load_model(str(save_whisper(folder / "whisper")))
    a = write_tone(folder / "a.wav", 1.0)
    b = write_tone(folder / "b.wav", 0.7, rate=22050, channels=2, hz=300)
    return lm, [a, b]


# ----------------------------------------------------------------------------- time axis


def test_frame_seconds_come_from_the_config_and_the_feature_extractor():
    real = whisper_config(max_source_positions=1500)  # Whisper's 30 s window: 3000 mel frames of 160 samples
    assert conv_stride(real, 3000) == 2 and frame_seconds(real, 160, 16000, 3000) == 0.02
    assert frame_seconds(whisper_config(max_source_positions=50), 160, 16000, 200) == 4 * 160 / 16000
    with pytest.raises(ValueError, match="whole multiple"):
        conv_stride(real, 2999)
    import transformers as tr

    assert is_speech(real) and not is_speech(tr.BartConfig()) and not is_speech(tr.ViTConfig())


def test_the_checkpoint_s_alignment_heads_are_read():
    class Gen:
        alignment_heads = [[1, 0], [2, 3]]

    assert alignment_heads(Gen()) == [(1, 0), (2, 3)] and alignment_heads(None) is None


def test_frames_are_named_by_their_start_time(whisper):
    lm, _ = whisper
    p = lm.tokenizer
    assert isinstance(p, SpeechProcessor) and p.frame_s == FRAME_S and p.positions == POSITIONS and p.rate == RATE
    assert p.convert_ids_to_tokens([FRAME_ID, FRAME_ID + 7]) == ["0.00 s", "0.14 s"]
    assert p.convert_ids_to_tokens([259]) == p.text.convert_ids_to_tokens([259])  # text tokens: the tokenizer's
    assert p.frames_of(RATE) == 50 and p.frames_of(RATE // 100 * 7) == 4  # 1 s; 0.07 s rounds up
    with pytest.raises(InputError, match="reads audio"):
        p("some text")


# ----------------------------------------------------------------------------- audio input


def test_audio_is_mono_and_resampled_to_the_model_s_rate(tmp_path):
    path = write_tone(tmp_path / "s.wav", 0.5, rate=8000, channels=2, hz=200)
    wave = read_audio(path, 16000)
    assert wave.shape == (8000,) and wave.dtype == np.float32
    t = np.arange(8000) / 16000
    inner = slice(400, 7600)  # away from the filter's edges
    np.testing.assert_allclose(wave[inner], 0.3 * np.sin(2 * np.pi * 200 * t[inner]), atol=2e-3)
    same = np.arange(10, dtype=np.float32)
    assert resample(same, 16000, 16000) is same


def test_bad_audio_is_one_line_errors(tmp_path, whisper):
    lm, _ = whisper
    (tmp_path / "bad.wav").write_text("not audio")
    for item, message in [(tmp_path / "none.wav", "not found"), (tmp_path / "bad.wav", "cannot read audio")]:
        with pytest.raises(InputError, match=message):
            clips(lm, [item])
    empty = tmp_path / "empty.wav"
    soundfile.write(str(empty), np.zeros(0, dtype=np.float32), RATE)
    with pytest.raises(InputError, match="no audio samples"):
        clips(lm, [empty])


def test_a_transcript_without_audio_is_a_usage_error(tmp_path):
    """docs/usage.md: options that do not go together exit with status 2; ``--transcript`` without
    ``--audio`` exited 1. Refused before any model is looked for (the model folder does not exist)."""
    from probe.audio.batches import audio_input
    from probe.errors import UsageInputError

    one_error(invoke_cli("analyze", "--model", tmp_path / "none", "--transcript", " A clip.", "--out",
                         tmp_path / "run"), 2, "--transcript goes with --audio", "analyze --help')")
    assert not (tmp_path / "run").exists()
    with pytest.raises(UsageInputError, match="--transcript goes with --audio"):  # an InputError to library callers
        audio_input((), (" A clip.",), None, False)
    assert issubclass(UsageInputError, InputError)


def test_a_feature_extractor_that_does_not_fit_the_model_is_a_wrong_frame_count(tmp_path):
    folder = save_whisper(tmp_path / "w", chunk_length=3)  # 300 mel frames for 100 positions: stride 3
    import transformers as tr

    tr.WhisperFeatureExtractor(feature_size=80, chunk_length=3, hop_length=150).save_pretrained(folder)
    r = invoke_cli("analyze", "--model", folder, "--audio", write_tone(tmp_path / "a.wav", 0.5), "--out",
                   tmp_path / "r")
    one_error(r, 1, "wrong frame count", "not a whole multiple", "the model needs 200 (100 positions x the stride 2")


# ----------------------------------------------------------------------------- alignment


def test_median_filter_equals_whisper_s_reflect_padding():
    x = np.random.default_rng(0).normal(size=(2, 3, 20))
    t = torch.nn.functional.pad(torch.tensor(x), (3, 3), mode="reflect")
    want = t.unfold(-1, 7, 1).median(-1).values.numpy()  # Whisper's median_filter
    np.testing.assert_array_equal(median_filter(x, 7), want)


def _brute_force(cost: np.ndarray) -> float:
    """The least total cost over every monotone path (steps right, down, diagonal) by enumeration."""
    n, m = cost.shape
    best = math.inf
    for steps in itertools.product(((1, 1), (1, 0), (0, 1)), repeat=n + m - 2):
        i = j = 0
        total = cost[0, 0]
        for di, dj in steps:
            i, j = i + di, j + dj
            if i >= n or j >= m:
                break
            total += cost[i, j]
            if (i, j) == (n - 1, m - 1):
                best = min(best, total)
                break
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dtw_finds_the_least_cost_monotone_path(seed):
    cost = np.random.default_rng(seed).normal(size=(3, 4))
    rows, frames = dtw(cost)
    assert (rows[0], frames[0]) == (0, 0) and (rows[-1], frames[-1]) == (2, 3)
    steps = set(zip(np.diff(rows).tolist(), np.diff(frames).tolist()))
    assert steps <= {(1, 1), (1, 0), (0, 1)}
    assert cost[rows, frames].sum() == pytest.approx(_brute_force(cost), rel=1e-12)


@pytest.mark.parametrize("n_rows, frames", [(4, 40), (6, 53), (3, 21)])
def test_a_diagonal_cross_attention_gives_the_closed_form_times(n_rows, frames):
    """Row j attends only to frames [b_j, b_{j+1}) (b = frames split evenly): the path walks the
    blocks in order and token j lasts from b_j to b_{j+1} frames, in seconds."""
    bounds = np.linspace(0, frames, n_rows + 1).round().astype(int)
    weights = np.full((2, n_rows, frames), 1e-3)
    for j in range(n_rows):
        weights[:, j, bounds[j]:bounds[j + 1]] = 1.0
    weights /= weights.sum(-1, keepdims=True)
    starts, ends = token_times(weights, FRAME_S)
    np.testing.assert_allclose(starts, bounds[:-2] * FRAME_S, rtol=1e-12)
    np.testing.assert_allclose(ends, bounds[1:-1] * FRAME_S, rtol=1e-12)
    assert np.all(np.diff(starts) > 0)
    assert monotonicity(weights[0]) == pytest.approx(1.0)
    assert monotonicity(weights[0, ::-1]) == pytest.approx(-1.0)


def test_monotone_heads_are_the_best_within_the_spread():
    scores = {(0, 0): 0.2, (1, 0): 0.95, (1, 1): 0.9, (1, 2): 0.7, (0, 1): float("nan")}
    assert monotone_heads(scores) == [(1, 0), (1, 1)]
    assert monotone_heads(scores, spread=0.3, most=2) == [(1, 0), (1, 1)]
    assert monotone_heads({(0, 0): float("nan")}) == []


# ----------------------------------------------------------------------------- the model


def test_encoder_decoder_and_cross_attention_shapes_and_axes(whisper):
    """The clips' batch against the model's own eager attention (output_attentions)."""
    lm, paths = whisper
    batch = next(clips(lm, paths, max_new_tokens=6).iter_batches(2))
    assert batch.input_features.shape == (2, 80, 2 * POSITIONS)
    assert batch.clip_frames == [50, 35] and batch.frame_s == FRAME_S
    last = lm.tokenizer.convert_ids_to_tokens(batch.input_ids[0, -1:].tolist())
    assert last == [f"{(POSITIONS - 1) * FRAME_S:.2f} s"]
    L = batch.target.input_ids.shape[1]
    assert batch.prompt_len == [1, 1] and all(1 + n <= L for n in batch.n_text)
    sites = {(s.stack, s.kind) for s in lm.sites}
    assert sites == {("encoder", "self"), ("decoder", "self"), ("decoder", "cross")}
    with torch.no_grad():
        out = lm.model(**{k: v for k, v in batch.model_inputs().items()}, output_attentions=True)
    assert out.encoder_attentions[0].shape == (2, 4, POSITIONS, POSITIONS)
    assert out.decoder_attentions[0].shape == (2, 4, L, L)
    assert out.cross_attentions[0].shape == (2, 4, L, POSITIONS)


def test_time_measures_and_monotonicity_equal_the_model_s_attention(whisper):
    lm, paths = whisper
    res = analyze_audio(lm, paths, max_new_tokens=6)
    batch = next(clips(lm, paths, max_new_tokens=6).iter_batches(2))
    with torch.no_grad():
        out = lm.model(**batch.model_inputs(), output_attentions=True)
    heads = res.heads.set_index(["stack", "kind", "layer", "head"])
    for layer, att in enumerate(out.encoder_attentions):
        a = att.double()
        for h in range(4):
            dist = share = rows = 0.0
            for b, F in enumerate(batch.clip_frames):
                q = np.arange(F)[:, None]
                k = np.arange(POSITIONS)[None, :]
                dist += float((a[b, h, :F].numpy() * np.abs(q - k) * FRAME_S).sum())
                share += float(a[b, h, :F, :F].sum())
                rows += F
            row = heads.loc[("encoder", "self", layer, h)]
            assert row["time_distance_s"] == pytest.approx(dist / rows, rel=1e-5)
            assert row["audio_share"] == pytest.approx(share / rows, rel=1e-5)
    for layer, att in enumerate(out.cross_attentions):
        for h in range(4):
            rhos = []
            for b, (F, p, n) in enumerate(zip(batch.clip_frames, batch.prompt_len, batch.n_text)):
                peaks = att[b, h, p - 1:p + n, :F].argmax(-1).numpy()
                if n >= 2 and len(set(peaks.tolist())) > 1:
                    rhos.append(spearmanr(np.arange(n + 1), peaks).statistic)
            want = np.mean(rhos) if rhos else np.nan
            np.testing.assert_allclose(heads.loc[("decoder", "cross", layer, h), "monotonicity"], want, rtol=1e-6)
    chosen = res.heads[res.heads["alignment_head"] == 1]
    best = res.heads["monotonicity"].max()
    assert len(chosen) >= 1 and (chosen["monotonicity"] >= best - 0.1).all()
    ex = res.results["speech"][0]
    assert ex.source == "monotone" and [tuple(h) for h in ex.heads] == sorted(
        ((int(r.layer), int(r.head)) for r in chosen.itertuples()),
        key=lambda k: -heads.loc[("decoder", "cross", *k), "monotonicity"])
    assert ex.cross.shape == (2, 4, batch.n_text[0] + 1, 50)


@pytest.mark.filterwarnings("ignore:Number of distinct clusters")  # uniform heads: fewer distinct points
def test_uniform_attention_gives_the_closed_form_time_distance(tmp_path):
    """Every encoder row uniform over the P frames: the distance from frame q is
    sum_k |q - k| / P frames, its share on the clip F / P."""
    lm = load_model(str(save_whisper(tmp_path / "u", uniform=True)))
    res = analyze_audio(lm, [write_tone(tmp_path / "a.wav", 0.5)], max_new_tokens=4)
    F, P = 25, POSITIONS
    q, k = np.arange(F)[:, None], np.arange(P)[None, :]
    want = (np.abs(q - k).sum(1) / P).mean() * FRAME_S
    enc = res.heads[res.heads["stack"] == "encoder"]
    np.testing.assert_allclose(enc["time_distance_s"], want, **tolerance("scaled"))
    np.testing.assert_allclose(enc["audio_share"], F / P, **tolerance("probability"))


def test_a_given_transcript_and_the_checkpoint_s_alignment_heads(tmp_path):
    folder = save_whisper(tmp_path / "w", alignment_heads=[(1, 2), (0, 3)])
    lm = load_model(str(folder))
    res = analyze_audio(lm, [write_tone(tmp_path / "a.wav", 1.2)], transcripts=["hello world"])
    ex = res.results["speech"][0]
    words = lm.tokenizer.text("hello world", add_special_tokens=False)["input_ids"]
    assert ex.tokens == [lm.tokenizer.text.decode([w]) for w in words]
    assert ex.heads == [(1, 2), (0, 3)] and ex.source == "checkpoint"
    starts, ends = token_times(ex.cross[[1, 0], [2, 3]], FRAME_S)
    assert [(t, s, e) for t, s, e in ex.alignment()] == list(zip(ex.tokens, starts, ends))
    assert np.all(np.diff(ex.starts) >= 0) and 0 <= ex.starts[0] and ex.ends[-1] <= 60 * FRAME_S
    flags = res.heads.set_index(["stack", "kind", "layer", "head"])["alignment_head"]
    assert flags[("decoder", "cross", 1, 2)] == 1 and flags[("decoder", "cross", 0, 3)] == 1
    assert flags.xs("cross", level="kind").sum() == 2
    with pytest.raises(InputError, match="one per clip"):
        analyze_audio(lm, [tmp_path / "a.wav"], transcripts=["a", "b"])


# ----------------------------------------------------------------------------- report and command line


def test_show_speech_and_the_report_section(tmp_path, whisper):
    from probe.report import write_run

    lm, paths = whisper
    res = analyze_audio(lm, paths, max_new_tokens=6)
    html = show_speech(res, 1)._repr_html_()
    assert "<svg" in html and "data:image/png;base64," in html and "http" not in html.replace("http://www.w3.org", "")
    with pytest.raises(InputError, match="no clip 2"):
        show_speech(res, 2)
    path = write_run(res, lm.tokenizer, tmp_path / "run")
    page = (path / "index.html").read_text()
    assert 'id="speech-attention"' in page and page.count("<svg") >= 2
    record = json.loads((path / "run.json").read_text())["speech-attention"]["clips"]
    ex = res.results["speech"][0]
    assert record[0]["frame_s"] == FRAME_S and record[0]["seconds"] == 1.0
    assert [a[0] for a in record[0]["alignment"]] == ex.tokens
    heads = pd.read_csv(path / "heads.csv")
    assert {"time_distance_s", "audio_share", "monotonicity", "alignment_head"} <= set(heads)


def test_cross_attention_panels_cover_the_whole_clip_thinned_by_time(tmp_path, whisper, monkeypatch):
    """The report's cross-attention panels of a speech run showed "first 48 of 64 source positions" (0-0.92 s of
    a 2.72 s clip). Each panel now covers every frame of the clip: consecutive frames summed into at most
    MAX_COLUMNS columns (here 16: 50 frames of the 1 s clip in 13 columns of 4, 35 of the 0.7 s clip in 12 of
    3), each row the rows that place the transcript's tokens, equal to the model's cross-attention summed by
    hand, and the title says how it was thinned. The run table says clips and frames, not tokens truncated."""
    from probe.report import cross, write_run

    lm, paths = whisper
    res = analyze_audio(lm, paths, max_new_tokens=6)
    monkeypatch.setattr(cross, "MAX_COLUMNS", 16)
    section = cross.cross_attention_section(res, lm.tokenizer)
    clips = res.results["speech"]
    assert len(section.figures) == 3 * len(clips)
    for fid, figure in section.figures.items():
        layer, head, i = (int(x) for x in fid.split("-")[1:])
        clip = clips[i]
        w = clip.cross[layer, head].astype(np.float64)
        frames = w.shape[1]
        assert frames == round(len(clip.waveform) / clip.rate / FRAME_S)  # every frame that holds the clip
        k = math.ceil(frames / 16)
        expected = np.stack([w[:, j:j + k].sum(1) for j in range(0, frames, k)], axis=1)
        assert (figure["rows"], figure["cols"]) == (len(clip.tokens) + 1, expected.shape[1])
        assert figure["cols"] <= 16 and (figure["cols"] - 1) * k < frames <= figure["cols"] * k
        assert figure["values"] == np.rint(expected * 1000).astype(int).ravel().tolist()
        np.testing.assert_allclose(expected.sum(1), w.sum(1), rtol=1e-12)  # each row's mass over the clip is kept
        last = (figure["cols"] - 1) * k * FRAME_S
        assert figure["colLabels"][0] == "0.00 s" and figure["colLabels"][-1] == f"{last:.2f} s"
        assert figure["rowLabels"] == [*clip.tokens, "(end)"]
        seconds = frames * FRAME_S
        assert (f"the whole clip (0.00-{seconds:.2f} s), {frames} frames of 20 ms in {figure['cols']} columns of {k} "
                f"frames ({k * FRAME_S:.2f} s) each, weights summed") in figure["title"]
        assert "first" not in figure["title"]
    monkeypatch.undo()
    page = (write_run(res, lm.tokenizer, tmp_path / "run") / "index.html").read_text(encoding="utf-8")
    assert "<td>clips</td><td>2 clips" in page and "<td>frames</td><td>200 encoder frames" in page
    assert "truncated to" not in page and "source positions" not in page
    assert "Cross-attention: which frames of the clip each transcript token reads" in page


def test_views_of_an_audio_run_label_frames_by_time_without_a_tokenizer(whisper, tmp_path):
    """probe.show / probe.model_view of an audio analysis, no tokenizer given: encoder frames are labelled by their
    start time (frame i: i x 0.02 s), the decoder's tokens by the model's tokenizer."""
    import probe
    from probe.entries.notebook import show

    lm, paths = whisper
    res = analyze_audio(lm, paths, max_new_tokens=6, n_examples=1)
    ex = res.examples[0]
    frames = [f"{i * FRAME_S:.2f} s" for i in range(len(ex.ids))]
    assert ex.ids == [FRAME_ID + i for i in range(len(ex.ids))]
    view = show(res, example=0)
    n = len(view.data["tokens"])
    assert view.data["tokens"] == frames[:n] and n >= 2
    target = ex.target
    assert len(target["labels"]) == len(target["ids"])
    for i, label in zip(target["ids"], target["labels"]):  # special tokens by their names
        if lm.tokenizer.is_special(int(i)):
            assert label == lm.tokenizer.text.convert_ids_to_tokens(int(i))
    assert target["labels"][0] == "<|im_start|>"
    model_view = probe.model_view(res, example=0)
    assert model_view.head_view.data["tokens"] == frames[:n]
    from probe.report import write_run

    page = (write_run(res, None, tmp_path / "run") / "index.html").read_text(encoding="utf-8")  # no tokenizer either
    assert frames[1] in page


def test_cli_analyzes_a_clip_and_refuses_bad_input(tmp_path):
    folder = save_whisper(tmp_path / "w")
    good = write_tone(tmp_path / "a.wav", 0.8)
    r = invoke_cli("analyze", "--model", folder, "--audio", good, "--transcript", "hi there", "--out", tmp_path / "r")
    assert r.exit_code == 0, r.output
    assert "Analyzing 1 clip (--audio)" in r.output
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    frames = run["counts"]["tokens"]  # the encoder's frames of the window, as the page's run table counts them
    window = json.loads((folder / "config.json").read_text())["max_source_positions"]  # the encoder's frames
    assert frames == window and f" from 1 clip, {frames} encoder frames in " in r.stdout, r.stdout  # not "tokens"
    assert f"<td>frames</td><td>{frames} encoder frames" in (tmp_path / "r" / "index.html").read_text(encoding="utf-8")
    record = run["speech-attention"]["clips"][0]
    assert len(record["alignment"]) == len(json.loads(json.dumps(record["alignment"])))
    (tmp_path / "bad.wav").write_text("nope")
    cases = [(["--audio", tmp_path / "bad.wav"], "cannot read audio"),
             (["--audio", tmp_path / "none.wav"], "not found"),
             ([], "is a speech model"),
             (["--audio", good, "--text", "hello"], "not both"),
             (["--audio", good, "--transcript", "a", "--transcript", "b"], "one per clip"),
             (["--audio", good, "--verify"], "does not run on images or audio")]
    for args, message in cases:
        one_error(invoke_cli("analyze", "--model", folder, *args, "--out", tmp_path / "x"), 1, message)
    one_error(invoke_cli("verify", "--model", folder), 1, "reads audio")


def test_the_example_clip_runs_and_is_the_script_s(tmp_path):
    """examples/speech.wav: 16 kHz mono 16-bit, under 100 KB, analysed from the command line by a
    Whisper with a 3-second window; where espeak-ng is installed, make_speech.py writes it exactly."""
    import shutil
    import subprocess
    import sys

    clip = ROOT / "examples" / "speech.wav"
    info = soundfile.info(str(clip))
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16") and clip.stat().st_size < 100_000
    folder = save_whisper(tmp_path / "w", chunk_length=3, max_source_positions=150)
    r = invoke_cli("analyze", "--model", folder, "--audio", clip, "--generate", 5, "--out", tmp_path / "r")
    assert r.exit_code == 0, r.output
    record = json.loads((tmp_path / "r" / "run.json").read_text())["speech-attention"]["clips"][0]
    assert record["seconds"] == round(info.duration, 4) and len(record["alignment"]) <= 5
    if shutil.which("espeak-ng"):
        out = tmp_path / "again.wav"
        subprocess.run([sys.executable, str(ROOT / "examples" / "make_speech.py"), str(out)], check=True)
        assert out.read_bytes() == clip.read_bytes()


@pytest.mark.browser
def test_speech_section_renders_in_chromium_without_errors_or_requests(tmp_path, chromium, whisper):
    from conftest import watched_page
    from probe.report import write_run

    lm, paths = whisper
    res = analyze_audio(lm, paths, max_new_tokens=6)
    path = write_run(res, lm.tokenizer, tmp_path / "run")
    with watched_page(chromium, path / "index.html") as (page, messages, requests):
        page.wait_for_function("document.body.getAttribute('data-figures-drawn') !== null")
        shown = page.evaluate("[...document.querySelectorAll('.speech-section img')]"
                              ".filter(i => i.complete && i.naturalWidth > 0).length")
        assert shown == 2 and page.locator(".speech-section svg").count() == 2
        page.locator(".speech-section").screenshot(path=str(tmp_path / "speech.png"))
        assert messages == []
    with watched_page(chromium, path / "index.html", viewport=(390, 800)) as (page, messages, _):
        page.wait_for_function("document.body.getAttribute('data-figures-drawn') !== null")
        assert page.evaluate("document.documentElement.scrollWidth") == 390  # a phone: the section scrolls
        assert messages == []
        assert [u for u in requests if not u.startswith(("data:", "file:"))] == []


def test_token_labels_never_overlap_in_a_lane():
    """Tokens closer than their labels are wide (Whisper's short sub-words) go to the next lane; none is
    laid over another; a label with no lane left keeps its box (its title names it)."""
    from probe.audio.view import _CHAR_W, _LANES, token_lanes

    spans = [(5.0 * i, 5.0 * i + 4, "word") for i in range(12)] + [(400.0, 460.0, "a")]
    lanes = token_lanes(spans)
    # labels of 28 px (2 + 4 x 6.5) and a 2 px gap, 5 px apart: 4 lanes, then none until x = 30
    assert lanes[:7] == [0, 1, 2, 3, None, None, 0] and lanes[-1] == 0
    for lane in range(_LANES):
        placed = [(x0, max(x1, x0 + 2 + _CHAR_W * len(t))) for (x0, x1, t), k in zip(spans, lanes) if k == lane]
        assert all(b[0] >= a[1] for a, b in itertools.pairwise(placed)), (lane, placed)


def test_analyze_run_on_a_clip_writes_the_command_s_run_folder(tmp_path):
    """probe.analyze_run(model, audio=CLIP) is `probe analyze --model MODEL --audio CLIP` in one call: the same
    files, the same heads.csv byte for byte, the same run.json but for the times."""
    import probe

    folder = save_whisper(tmp_path / "w")
    clip = write_tone(tmp_path / "a.wav", 0.8)
    r = invoke_cli("analyze", "--model", folder, "--audio", clip, "--generate", 6, "--out", tmp_path / "cmd")
    assert r.exit_code == 0, r.output
    result, out = probe.analyze_run(str(folder), audio=str(clip), generate=6, out=tmp_path / "lib")
    assert out == tmp_path / "lib" and result.results["speech"]
    assert_same_run(tmp_path / "cmd", out)
