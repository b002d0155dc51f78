"""A raw-waveform speech encoder's feature extractor and the names of its frames.

wav2vec2, HuBERT and data2vec-audio read the samples of a clip (mono, at the rate their feature
extractor names, usually normalised to zero mean and unit variance per clip) through 1-D
convolutions that make one frame every ``hop`` samples (:func:`probe.architectures.speech.conv_hop`;
320 samples, 20 ms at 16 kHz), each frame seeing ``receptive_field`` samples (400, 25 ms). The
encoder's self-attention runs over these frames. :class:`WaveProcessor` stands where a text model
keeps its tokenizer (:attr:`probe.core.LoadedModel.tokenizer`), as
:class:`probe.loading.sound.SpeechProcessor` does for Whisper: frame i (audio from ``i * frame_s``
seconds) has id ``FRAME_ID + i`` and is labelled by its start time (``0.42 s``; with as many decimals
as keep neighbouring frames apart: 2 at 20 ms, 3 below 10 ms).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..architectures.speech import conv_frames, conv_hop, receptive_field
from ..errors import InputError
from .sound import FRAME_ID

#: Id of the padding token (never a real token: every batch holds one clip).
PAD_ID = FRAME_ID - 1
#: Seconds of silence in discovery's forward pass.
DISCOVERY_SECONDS = 1.0


class WaveProcessor:
    """The feature extractor and time axis of one raw-waveform speech encoder.

    Args:
        extractor: the model's feature extractor (transformers' ``Wav2Vec2FeatureExtractor``):
            ``sampling_rate`` and ``do_normalize`` are read, and it prepares every clip.
        config: the model's config (``conv_kernel``, ``conv_stride``).

    Attributes:
        rate: samples per second the model reads (Hz).
        hop: samples from one frame's start to the next's.
        field: samples one frame sees.
        frame_s: seconds per frame, ``hop / rate``.
        decimals: decimals of the frames' labels, ``max(2, ceil(-log10(frame_s)))`` (labels stay apart).
        positions: frames of discovery's silent clip (:data:`DISCOVERY_SECONDS`).

    Raises:
        InputError: a feature extractor whose sampling rate is not a positive whole number of Hz.
    """

    pad_token = "[PAD]"
    pad_token_id = PAD_ID
    padding_side = "right"
    sep_token = eos_token = unk_token = unk_token_id = model_max_length = None
    specials: tuple[str, ...] = ()

    def __init__(self, extractor, config) -> None:
        rate = getattr(extractor, "sampling_rate", None)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0 or rate != int(rate):
            raise InputError(f"wrong sampling rate: the feature extractor says {rate!r}; a waveform encoder needs a "
                             "positive whole number of samples per second (sampling_rate in preprocessor_config.json)")
        self.extractor, self.config, self.rate = extractor, config, int(rate)
        self.hop, self.field = conv_hop(config), receptive_field(config)
        self.frame_s = self.hop / self.rate
        self.decimals = max(2, math.ceil(-math.log10(self.frame_s)))
        self.positions = conv_frames(config, round(DISCOVERY_SECONDS * self.rate))

    def frames_of(self, n_samples: int) -> int:
        """Frames of a clip of ``n_samples`` samples (:func:`probe.architectures.speech.conv_frames`)."""
        return conv_frames(self.config, n_samples)

    def input_values(self, samples: np.ndarray, name: str = "audio") -> torch.Tensor:
        """[samples] float32: what the model reads of mono ``samples`` at :attr:`rate` (the feature
        extractor's normalisation where it has one).

        Raises:
            InputError: an empty clip, or one shorter than one frame's span.
        """
        if samples.size == 0:
            raise InputError(f"{name}: no audio samples")
        if self.frames_of(samples.size) < 1:
            raise InputError(f"{name} lasts {samples.size / self.rate * 1000:.1f} ms; one frame of the model needs "
                             f"{self.field} samples ({self.field / self.rate * 1000:g} ms at {self.rate} Hz)")
        values = self.extractor(samples, sampling_rate=self.rate, return_tensors="np")["input_values"][0]
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))

    def frame_ids(self, frames: int) -> list[int]:
        """Token ids of ``frames`` frames: ``FRAME_ID + i``."""
        return [FRAME_ID + i for i in range(frames)]

    def convert_ids_to_tokens(self, ids):
        """Token labels of ids (one id or a list): frames by their start time (``0.42 s``, :attr:`decimals`
        decimals)."""
        if isinstance(ids, int):
            return self.convert_ids_to_tokens([ids])[0]
        d = self.decimals
        return [self.pad_token if int(i) == PAD_ID else f"{(int(i) - FRAME_ID) * self.hop / self.rate:.{d}f} s"
                for i in ids]

    def convert_tokens_to_string(self, tokens) -> str:
        """The labels joined by spaces."""
        return " ".join(tokens)

    def __call__(self, *args, **kwargs):
        """Text given to a speech encoder (``probe verify``, ``patch`` ... read text).

        Raises:
            InputError: always: the encoder reads audio.
        """
        raise InputError("this is a speech encoder: it reads audio, not text (probe analyze --audio FILE, or "
                         "probe.audio.analyze_audio); commands that read text do not run on it")

    def discovery_inputs(self, device) -> dict:
        """The model inputs of discovery's forward pass (:mod:`probe.capture.discover`): a silent clip
        of :data:`DISCOVERY_SECONDS` (:attr:`positions` frames)."""
        return {"input_values": torch.zeros(1, round(DISCOVERY_SECONDS * self.rate), device=device)}


def wave_processor_for(source, config, **kw) -> WaveProcessor:
    """The :class:`WaveProcessor` of a model folder or Hub id (its feature extractor).

    Raises:
        InputError: the folder has no feature extractor, or one with a bad sampling rate.
    """
    from transformers import AutoFeatureExtractor  # deferred: transformers takes ~1.5 s to import

    try:
        extractor = AutoFeatureExtractor.from_pretrained(source, **kw)
    except (OSError, ValueError) as exc:
        raise InputError(f"{source}: no feature extractor (preprocessor_config.json): {str(exc).splitlines()[0]}") \
            from None
    return WaveProcessor(extractor, config)
