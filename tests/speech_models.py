"""Tiny random Whisper models for the speech tests: 2 encoder and 2 decoder layers, 4 heads, 32
wide, 80 mel bins, a 2-second window (200 mel frames, 100 encoder frames of 0.02 s), the test BPE
tokenizer (vocabulary 1000: ``<|im_start|>`` = 1 starts the decoder, ``<|im_end|>`` = 2 ends it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import soundfile
import torch

BPE = Path(__file__).parent / "data" / "bpe"
RATE, WINDOW_S, POSITIONS = 16000, 2, 100


def whisper_config(**kw):
    """The tiny config (``kw`` overrides)."""
    import transformers as tr

    base = dict(vocab_size=1000, num_mel_bins=80, d_model=32, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                max_source_positions=POSITIONS, max_target_positions=64, decoder_start_token_id=1, bos_token_id=1,
                eos_token_id=2, pad_token_id=2, begin_suppress_tokens=None, suppress_tokens=None,
                init_std=0.3)
    return tr.WhisperConfig(**{**base, **kw})


def save_whisper(folder: Path, seed: int = 0, chunk_length: int = WINDOW_S, alignment_heads=None,
                 uniform: bool = False, **kw) -> Path:
    """A model folder of a tiny Whisper (``probe --model`` loads it) with its feature extractor
    (a ``chunk_length``-second window), the test tokenizer, and ``alignment_heads`` in its
    generation config when given; ``uniform``: query and key projections zeroed (every attention
    row uniform)."""
    import transformers as tr

    folder = Path(folder)
    torch.manual_seed(seed)
    model = tr.WhisperForConditionalGeneration(whisper_config(**kw)).eval()
    if uniform:
        with torch.no_grad():
            for name, module in model.named_modules():
                if name.endswith(("q_proj", "k_proj")):
                    module.weight.zero_()
                    if module.bias is not None:
                        module.bias.zero_()
    model.save_pretrained(folder)
    tr.WhisperFeatureExtractor(feature_size=80, chunk_length=chunk_length).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(BPE / name, folder / name)
    if alignment_heads is not None:
        gen = json.loads((folder / "generation_config.json").read_text())
        gen.pop("_from_model_config", None)  # a written generation config, as a checkpoint ships it
        gen["alignment_heads"] = [list(h) for h in alignment_heads]
        (folder / "generation_config.json").write_text(json.dumps(gen))
    return folder


def write_tone(path: Path, seconds: float, rate: int = RATE, channels: int = 1, hz: float = 440.0) -> Path:
    """A sine tone of ``seconds`` at ``rate`` Hz (``channels`` equal channels), 16-bit WAV."""
    t = np.arange(round(seconds * rate)) / rate
    wave = (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    soundfile.write(str(path), np.repeat(wave[:, None], channels, 1), rate, subtype="PCM_16")
    return Path(path)
