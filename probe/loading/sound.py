"""A speech model's feature extractor and tokenizer as one object, and the names of its frames.

:class:`SpeechProcessor` stands where a text model keeps its tokenizer
(:attr:`probe.core.LoadedModel.tokenizer`), as :class:`probe.loading.pixels.PixelProcessor` does for an
image model. The decoder's tokens are the model's own text tokens (every attribute the class does
not define is its tokenizer's); the encoder's positions are frames of audio, and their ids name
them: frame i (audio from ``i * frame_s`` seconds) has id ``FRAME_ID + i``, labelled by its start
time (``0.42 s``). Audio is turned into log-mel features by the model's own feature extractor
(``preprocessor_config.json`` in its folder).
"""

from __future__ import annotations

import re

import numpy as np
import torch

from ..architectures.speech import alignment_heads, conv_stride, frame_seconds
from ..errors import InputError

#: Id of encoder frame 0; frame i is ``FRAME_ID + i`` (above every text vocabulary).
FRAME_ID = 10_000_000
_SPECIAL = re.compile(r"^<\|.*\|>$")


class SpeechProcessor:
    """The feature extractor, tokenizer and time axis of one speech encoder-decoder model.

    Args:
        extractor: the model's feature extractor (transformers' ``WhisperFeatureExtractor`` ...):
            ``sampling_rate``, ``hop_length``, ``n_samples`` and ``nb_max_frames`` are read.
        text: the model's tokenizer (the decoder's tokens).
        config: the model's config (``max_source_positions``).
        generation_config: the model's generation config (start tokens, ``alignment_heads``), or None.

    Attributes:
        rate: samples per second the model reads (Hz).
        window_s: seconds of audio one input holds (Whisper: 30); :class:`probe.audio.batches.Clips` cuts a
            longer clip into windows, :meth:`features` refuses one.
        mel_frames: mel frames per window (the features' length the model expects).
        positions: encoder positions per window.
        frame_s: seconds of audio per encoder position (:func:`probe.architectures.speech.frame_seconds`).

    Raises:
        InputError: a feature extractor whose frame count does not fit the model (not a whole
            multiple of its encoder positions).
    """

    def __init__(self, extractor, text, config, generation_config=None) -> None:
        self.extractor, self.text, self.config, self.generation_config = extractor, text, config, generation_config
        self.rate = int(extractor.sampling_rate)
        self.mel_frames = int(extractor.nb_max_frames)
        self.window_s = float(extractor.n_samples) / self.rate
        self.positions = int(config.max_source_positions)
        try:
            self.stride = conv_stride(config, self.mel_frames)
            self.frame_s = frame_seconds(config, int(extractor.hop_length), self.rate, self.mel_frames)
        except ValueError as exc:
            raise InputError(f"wrong frame count: {exc}") from None

    def __getattr__(self, name):
        if name in ("text", "extractor", "__setstate__", "__getstate__"):
            raise AttributeError(name)
        return getattr(self.text, name)

    def __call__(self, *args, **kwargs):
        """Text given to a speech model's encoder (``probe verify``, ``patch`` ... read text).

        Raises:
            InputError: always: the encoder reads audio.
        """
        raise InputError("this is a speech model: its encoder reads audio, not text (probe analyze --audio FILE, "
                         "or probe.audio.analyze_audio); commands that read text do not run on it")

    @property
    def alignment_heads(self) -> list[tuple[int, int]] | None:
        """The checkpoint's (decoder layer, head) alignment heads, or None."""
        return alignment_heads(self.generation_config)

    def features(self, samples: np.ndarray, name: str = "audio") -> torch.Tensor:
        """[mel bins, mel frames] float32 log-mel features of mono ``samples`` at :attr:`rate`.

        Raises:
            InputError: an empty clip, one longer than :attr:`window_s`, or features of another
                length than the model reads (a wrong frame count).
        """
        if samples.size == 0:
            raise InputError(f"{name}: no audio samples")
        if samples.size > self.extractor.n_samples:
            raise InputError(f"{name} lasts {samples.size / self.rate:.2f} s; the model reads at most "
                             f"{self.window_s:g} s at a time (cut it into pieces)")
        feats = self.extractor(samples, sampling_rate=self.rate, return_tensors="np")["input_features"][0]
        if feats.shape[-1] != self.mel_frames:
            raise InputError(f"{name}: wrong frame count: the feature extractor gave {feats.shape[-1]} mel frames, "
                             f"the model reads {self.mel_frames} ({self.positions} positions x stride {self.stride})")
        return torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float32))

    def frames_of(self, n_samples: int) -> int:
        """Encoder positions that hold audio for a clip of ``n_samples`` samples (rounded up)."""
        return min(self.positions, int(np.ceil(n_samples / self.rate / self.frame_s - 1e-9)))

    def frame_ids(self) -> list[int]:
        """Token ids of the encoder's positions: ``FRAME_ID + i``."""
        return [FRAME_ID + i for i in range(self.positions)]

    def is_special(self, token_id: int) -> bool:
        """Whether a decoder token is not text: a special token of the tokenizer or one spelled
        ``<|...|>`` (Whisper's task, language and timestamp tokens)."""
        if token_id in set(self.text.all_special_ids):
            return True
        return bool(_SPECIAL.match(str(self.text.convert_ids_to_tokens(int(token_id)))))

    def convert_ids_to_tokens(self, ids):
        """Token labels of ids (one id or a list): frames by their start time (``0.42 s``), text
        tokens by the tokenizer."""
        if isinstance(ids, int):
            return self.convert_ids_to_tokens([ids])[0]
        ids = [int(i) for i in ids]
        out = []
        for i in ids:
            out.append(f"{(i - FRAME_ID) * self.frame_s:.2f} s" if i >= FRAME_ID
                       else self.text.convert_ids_to_tokens(i))
        return out

    def discovery_inputs(self, device) -> dict:
        """The model inputs of discovery's forward pass (:mod:`probe.capture.discover`): a silent window
        and three decoder tokens."""
        start = int(getattr(self.config, "decoder_start_token_id", None) or 0)
        return {"input_features": torch.zeros(1, int(self.config.num_mel_bins), self.mel_frames, device=device),
                "decoder_input_ids": torch.full((1, 3), start, dtype=torch.long, device=device), "use_cache": False}


def speech_processor_for(source, config, tokenizer, **kw) -> SpeechProcessor:
    """The :class:`SpeechProcessor` of a model folder or Hub id (its feature extractor and
    generation config) around its already loaded ``tokenizer``.

    Raises:
        InputError: the folder has no feature extractor, or one that does not fit the model.
    """
    from transformers import AutoFeatureExtractor, GenerationConfig  # deferred: transformers takes ~1.5 s to import

    try:
        extractor = AutoFeatureExtractor.from_pretrained(source, **kw)
    except (OSError, ValueError) as exc:
        raise InputError(f"{source}: no feature extractor (preprocessor_config.json): {str(exc).splitlines()[0]}") \
            from None
    try:
        generation = GenerationConfig.from_pretrained(source, **kw)
    except OSError:
        generation = None
    return SpeechProcessor(extractor, tokenizer, config, generation)
