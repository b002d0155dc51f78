"""Raw-waveform speech encoders (wav2vec2, HuBERT, data2vec-audio): frames and their time axis
against the closed form from the convolutions, attention against the model's own, the time
measures under uniform attention, the report section and the CLI's one-line errors (tiny random
models built from their config classes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile
import torch
from click.testing import CliRunner
from vision_models import zero_queries_and_keys

from conftest import tolerance
from probe.audio import FrameAttention, analyze_audio
from probe.cli import main
from probe.errors import InputError
from probe.loading.models import from_pretrained_objects
from probe.loading.waves import WaveProcessor

#: kind -> config class name
WAVEFORM = {"wav2vec2": "Wav2Vec2Config", "hubert": "HubertConfig", "data2vec-audio": "Data2VecAudioConfig"}
KERNELS, STRIDES, RATE = (10, 3, 3), (5, 2, 2), 16000


def wave_config(kind: str):
    import transformers as tr

    return getattr(tr, WAVEFORM[kind])(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, conv_dim=(8, 8, 8), conv_kernel=KERNELS,
                                       conv_stride=STRIDES, num_conv_pos_embeddings=16,
                                       num_conv_pos_embedding_groups=4, initializer_range=0.3)


def extractor(rate: int = RATE):
    import transformers as tr

    return tr.Wav2Vec2FeatureExtractor(sampling_rate=rate, do_normalize=True, return_attention_mask=False)


def wave_model(kind: str, uniform: bool = False):
    import transformers as tr

    torch.manual_seed(0)
    model = tr.AutoModel.from_config(wave_config(kind)).eval()
    if uniform:
        zero_queries_and_keys(model)
    return model


def tiny_wave(kind: str, uniform: bool = False):
    model = wave_model(kind, uniform)
    return from_pretrained_objects(model, WaveProcessor(extractor(), model.config), name=f"tiny {kind}")


def save_wave(kind: str, folder: Path, rate: int = RATE) -> Path:
    wave_model(kind).save_pretrained(folder)
    extractor(rate).save_pretrained(folder)
    return Path(folder)


def frames_by_hand(n: int) -> int:
    for k, s in zip(KERNELS, STRIDES):
        n = (n - k) // s + 1 if n >= k else 0
    return n


def clip(path: Path, samples: int, rate: int = RATE, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    soundfile.write(str(path), (0.3 * rng.standard_normal(samples)).astype(np.float32), rate)
    return path


@pytest.mark.parametrize("kind", list(WAVEFORM))
def test_frames_time_axis_and_attention_equal_the_model_s(kind, tmp_path):
    lm = tiny_wave(kind)
    samples = 4321
    res = analyze_audio(lm, [clip(tmp_path / "a.wav", samples)], example_tokens=None)
    F = frames_by_hand(samples)  # (4321 - 10) // 5 + 1 = 863, then 431, then 215
    assert F == 215 == int(lm.model._get_feat_extract_output_lengths(samples))
    hop = 5 * 2 * 2  # samples: 1.25 ms at 16 kHz, labelled with 3 decimals
    ex = res.examples[0]
    labels = lm.tokenizer.convert_ids_to_tokens(ex.ids)
    assert len(labels) == F and labels == [f"{i * hop / RATE:.3f} s" for i in range(F)]
    assert len(set(labels)) == F and labels[:3] == ["0.000 s", "0.001 s", "0.003 s"]
    values = lm.tokenizer.input_values(soundfile.read(str(tmp_path / "a.wav"), dtype="float32")[0])
    with torch.no_grad():
        own = lm.model(values[None], output_attentions=True).attentions
    assert len(own) == 2 and tuple(own[0].shape) == (1, 4, F, F)
    got = np.stack([np.asarray(p) for p in ex.probs]) if isinstance(ex.probs, list) else np.asarray(ex.probs)
    np.testing.assert_allclose(got, torch.stack([a[0] for a in own]).numpy(), **tolerance("probability"))
    frames = res.results["frames"][0]
    assert frames.received.shape == (2, 4, F) and frames.frame_s == hop / RATE


def test_uniform_attention_gives_the_closed_form_time_distance(tmp_path):
    """Every weight 1/F: the time distance is frame_s * mean |q - k| = frame_s (F^2 - 1) / (3F)."""
    lm = tiny_wave("wav2vec2", uniform=True)
    res = analyze_audio(lm, [clip(tmp_path / "a.wav", 3000), clip(tmp_path / "b.wav", 3000, seed=1)])
    F, frame_s = frames_by_hand(3000), 20 / RATE
    want = frame_s * (F * F - 1) / (3 * F)
    np.testing.assert_allclose(res.heads["time_distance_s"], want, rtol=1e-6)
    np.testing.assert_allclose(res.heads["uniform_time_s"], want, rtol=1e-9)
    np.testing.assert_allclose(res.results["frames"][0].received, 1 / F, **tolerance("probability"))


def test_merge_equals_one_pass(tmp_path):
    lm = tiny_wave("hubert")
    paths = [clip(tmp_path / f"{i}.wav", 2000 + 500 * i, seed=i) for i in range(3)]
    from probe.audio import clips
    from probe.runs.analysis import run

    whole, a, b = (FrameAttention(lm.sites, 4) for _ in range(3))
    run(lm, clips(lm, paths).iter_batches(), [whole])
    run(lm, clips(lm, paths[:1]).iter_batches(), [a])
    run(lm, clips(lm, paths[1:]).iter_batches(), [b])
    pd.testing.assert_frame_equal(a.merge(b).columns(), whole.columns(), rtol=1e-9)


def test_bad_clips_and_settings_are_one_line_errors(tmp_path):
    lm = tiny_wave("wav2vec2")
    soundfile.write(str(tmp_path / "empty.wav"), np.zeros(0, dtype=np.float32), RATE)
    with pytest.raises(InputError, match="no audio samples"):
        analyze_audio(lm, [tmp_path / "empty.wav"])
    with pytest.raises(InputError, match="one frame of the model needs 40 samples"):  # 1 + 9 + 2*5 + 2*10
        analyze_audio(lm, [clip(tmp_path / "short.wav", 39)])
    assert frames_by_hand(39) == 0 and frames_by_hand(40) == 1
    with pytest.raises(InputError, match="reads no transcript"):
        analyze_audio(lm, [clip(tmp_path / "a.wav", 2000)], transcripts=["hello"])
    with pytest.raises(InputError, match="wrong sampling rate"):
        WaveProcessor(extractor(0), lm.model.config)


def test_a_clip_at_another_rate_is_resampled_to_the_model_s(tmp_path):
    lm = tiny_wave("wav2vec2")
    res = analyze_audio(lm, [clip(tmp_path / "a8k.wav", 4000, rate=8000)])  # 0.5 s at 8 kHz: 8000 samples at 16 kHz
    ex = res.results["frames"][0]
    assert len(ex.waveform) == 8000 and ex.frames == frames_by_hand(8000)


def test_cli_analyzes_a_clip_and_refuses_bad_input(tmp_path):
    folder = save_wave("wav2vec2", tmp_path / "w2v")
    good = clip(tmp_path / "a.wav", 6000)
    runner = CliRunner()
    r = runner.invoke(main, ["analyze", "--model", str(folder), "--audio", str(good), "--out", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    heads = pd.read_csv(tmp_path / "r" / "heads.csv")
    assert len(heads) == 8 and heads["time_distance_s"].notna().all()
    assert f" from 1 clip, {frames_by_hand(6000)} encoder frames in " in r.stdout, r.stdout  # not "tokens"
    record = json.loads((tmp_path / "r" / "run.json").read_text())["speech-attention"]
    assert record["clips"] == [{"name": "a.wav", "seconds": 0.375, "frame_s": 0.00125, "frames": frames_by_hand(6000)}]
    page = (tmp_path / "r" / "index.html").read_text()
    assert page.count('alt="L0: weight each frame receives"') == 1
    soundfile.write(str(tmp_path / "empty.wav"), np.zeros(0, dtype=np.float32), RATE)
    bad_rate = save_wave("hubert", tmp_path / "hubert", rate=0)
    cases = [(folder, ["--audio", str(tmp_path / "empty.wav")], "no audio samples"),
             (folder, ["--audio", str(good), "--transcript", "hi"], "reads no transcript"),
             (folder, [], "is a speech model"),
             (folder, ["--text", "hello"], "is a speech model"),
             (bad_rate, ["--audio", str(good)], "wrong sampling rate")]
    for model, args, message in cases:
        r = runner.invoke(main, ["analyze", "--model", str(model), *args, "--out", str(tmp_path / "x")])
        assert r.exit_code != 0 and message in r.output, (args, r.output)
        assert r.output.strip().startswith("Error:") and "Traceback" not in r.output


def test_wavlm_keeps_its_own_attention_and_is_refused_in_one_line(tmp_path):
    import transformers as tr

    config = tr.WavLMConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                            conv_dim=(8, 8, 8), conv_kernel=KERNELS, conv_stride=STRIDES, num_conv_pos_embeddings=16,
                            num_conv_pos_embedding_groups=4)
    tr.AutoModel.from_config(config).save_pretrained(tmp_path / "wavlm")
    extractor().save_pretrained(tmp_path / "wavlm")
    r = CliRunner().invoke(main, ["analyze", "--model", str(tmp_path / "wavlm"), "--audio",
                                  str(clip(tmp_path / "a.wav", 2000)), "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "AttentionInterface" in r.output and "Traceback" not in r.output


@pytest.mark.browser
def test_waveform_section_renders_in_chromium_without_errors_or_requests(tmp_path, chromium):
    from conftest import watched_page
    from probe.report import write_run

    lm = tiny_wave("wav2vec2")
    res = analyze_audio(lm, [clip(tmp_path / "a.wav", 6000), clip(tmp_path / "b.wav", 3000, seed=1)])
    path = write_run(res, lm.tokenizer, tmp_path / "run")
    with watched_page(chromium, path / "index.html") as (page, messages, requests):
        page.wait_for_function("document.body.getAttribute('data-figures-drawn') !== null")
        shown = page.evaluate("[...document.querySelectorAll('.speech-section img')]"
                              ".filter(i => i.complete && i.naturalWidth > 0).length")
        assert shown == 2 * 2 and page.locator(".speech-section svg").count() == 2  # 2 clips x 2 layers
        page.locator(".speech-section").screenshot(path=str(tmp_path / "frames.png"))
        assert messages == []
        assert [u for u in requests if not u.startswith(("data:", "file:"))] == []
