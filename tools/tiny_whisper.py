"""Write a tiny random Whisper model folder that ``probe analyze --model FOLDER --audio CLIP``
loads: Whisper's own geometry (80 mel bins, a 30-second window of 3000 mel frames, 1500 encoder
frames of 0.02 s) with 2 encoder and 2 decoder layers of 4 heads, 64 wide, random weights
(``torch.manual_seed(0)``), the feature extractor of Whisper's defaults, and the test tokenizer
(``tests/data/bpe``, vocabulary 1000) as its text tokens.

Usage: ``python tools/tiny_whisper.py FOLDER``. Random weights write a random transcript: the
folder shows that the pipeline runs (inputs, capture, alignment, report), not what a trained
model's heads do; for that, ``--model openai/whisper-tiny`` (the Hub, 39 M parameters).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
import transformers as tr

BPE = Path(__file__).resolve().parents[1] / "tests" / "data" / "bpe"


def main(folder: Path) -> Path:
    config = tr.WhisperConfig(vocab_size=1000, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                              decoder_ffn_dim=128, max_source_positions=1500, max_target_positions=128,
                              decoder_start_token_id=1, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                              begin_suppress_tokens=None, suppress_tokens=None, init_std=0.3)
    torch.manual_seed(0)
    tr.WhisperForConditionalGeneration(config).save_pretrained(folder)
    tr.WhisperFeatureExtractor(feature_size=80).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(BPE / name, Path(folder) / name)
    return Path(folder)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/tiny_whisper.py FOLDER")
    print(main(Path(sys.argv[1])))
