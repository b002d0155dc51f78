"""Audio clips to batches for a raw-waveform speech encoder (wav2vec2, HuBERT, data2vec-audio):
soundfile reads them, SciPy resamples them to the model's rate (:func:`probe.audio.batches.read_audio`),
the model's feature extractor normalises them, and each clip becomes a sequence of frames that
:func:`probe.runs.analysis.analyze` takes.

A batch holds one clip: clips differ in length, and padding would change what these models
compute (the group-normalised convolutions of the base checkpoints see the padding; transformers
advises against an attention mask for them), so one clip per batch keeps every number exact. Its
token ids name the frames (:mod:`probe.loading.waves`: ``FRAME_ID + i``, labelled by start time).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError
from ..loading.waves import WaveProcessor
from ..text.inputs import Batch, Text
from .batches import read_audio


@dataclass
class WaveBatch(Batch):
    """One clip for a raw-waveform encoder (:class:`probe.text.inputs.Batch` of frames, with the samples).

    Attributes:
        input_values: [1, samples] float32, what the model reads (normalised where its extractor says).
        waveforms: the clip's samples at the model's rate ([samples] float32), one per row.
        clip_frames: frames of each row (every frame holds audio: nothing is padded).
        frame_s: seconds from one frame's start to the next's.
        rate: samples per second of ``waveforms``.
    """

    input_values: torch.Tensor | None = None
    waveforms: list | None = None
    clip_frames: list | None = None
    frame_s: float = 0.0
    rate: int = 0

    def model_inputs(self) -> dict:
        """``input_values`` (no attention mask: nothing is padded)."""
        return {"input_values": self.input_values}

    def to(self, device) -> WaveBatch:
        """The samples (and the frame ids) moved to ``device``."""
        super().to(device)
        self.input_values = self.input_values.to(device)
        return self


class WaveClips:
    """Audio clips for :func:`probe.runs.analysis.analyze` with a raw-waveform encoder: every clip
    is read and normalised when the clips are made.

    Args:
        lm: a loaded waveform encoder (its tokenizer a :class:`~probe.loading.waves.WaveProcessor`).
        items: audio file paths.

    Raises:
        InputError: not a waveform encoder, no clip, a missing or unreadable file, an empty clip or
            one shorter than a frame.
    """

    #: what one item is called in messages (``Analyzing 2 clips``).
    noun = "clip"

    def __init__(self, lm, items: Sequence) -> None:
        if not isinstance(lm.tokenizer, WaveProcessor):
            raise InputError(f"{lm.name} is not a raw-waveform speech encoder")
        items = [items] if isinstance(items, (str, Path)) else list(items)
        if not items:
            raise InputError("no audio clip given")
        self.lm, self.items = lm, items
        p: WaveProcessor = lm.tokenizer
        self.waves = [read_audio(it, p.rate) for it in items]
        self.values = [p.input_values(w, Path(it).name) for w, it in zip(self.waves, items)]

    def __len__(self) -> int:
        return len(self.items)

    def batch(self, i: int) -> WaveBatch:
        """The :class:`WaveBatch` of clip ``i``."""
        p: WaveProcessor = self.lm.tokenizer
        F = p.frames_of(self.waves[i].size)
        ids = torch.tensor([p.frame_ids(F)], dtype=torch.long)
        text = Text(Path(self.items[i]).name, index=i)
        return WaveBatch(ids, torch.ones(1, F, dtype=torch.long), None, torch.zeros(1, F, 2, dtype=torch.long),
                         torch.zeros(1, F, dtype=torch.bool), torch.full((1, F), -1, dtype=torch.long), [text], [i],
                         [False], input_values=self.values[i][None], waveforms=[self.waves[i]], clip_frames=[F],
                         frame_s=p.frame_s, rate=p.rate)

    def iter_batches(self, batch_size: int = 16) -> Iterator[WaveBatch]:
        """One batch per clip, in order (``batch_size`` is not used: see the module's docstring)."""
        for i in range(len(self.items)):
            yield self.batch(i)
