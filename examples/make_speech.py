"""Write examples/speech.wav: a short English sentence spoken by the eSpeak NG synthesizer,
resampled to 16 kHz mono 16-bit PCM (Whisper's rate).

Usage: ``python examples/make_speech.py [OUT.wav]`` (needs the ``espeak-ng`` program:
``apt-get install espeak-ng``). The clip in the repository was made with eSpeak NG 1.51, voice
``en-us``, speed 165 words a minute; another eSpeak NG version may give slightly other samples.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from math import gcd
from pathlib import Path

import numpy as np
import soundfile
from scipy.signal import resample_poly

TEXT = "Attention aligns every word with its time."
RATE = 16000


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "165", "-w", str(raw), TEXT], check=True)
        wave, rate = soundfile.read(str(raw), dtype="float32", always_2d=True)
    g = gcd(rate, RATE)
    wave = resample_poly(wave.mean(1), RATE // g, rate // g)
    wave = 0.9 * wave / max(float(np.abs(wave).max()), 1e-9)
    soundfile.write(str(out), wave.astype(np.float32), RATE, subtype="PCM_16")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("speech.wav"))
