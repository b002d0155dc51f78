"""What differs between speech models: whether a config reads log-mel frames, how long one encoder
position lasts, and which cross-attention heads a checkpoint names for aligning words to time.

Whisper-style encoder-decoder models read a log-mel spectrogram (``num_mel_bins`` bins per mel
frame, one mel frame every ``hop_length`` samples) through convolutions that shorten it; the
encoder's positions are therefore longer than a mel frame by the convolutions' total stride. The
stride is read from the config and the feature extractor (mel frames per window over encoder
positions per window), not assumed.
"""

from __future__ import annotations

#: The generation-config attribute that lists the (layer, head) pairs whose cross-attention
#: aligns tokens to time (Whisper's checkpoints set it; transformers' word timestamps read it).
ALIGNMENT_HEADS = "alignment_heads"


def is_speech(config) -> bool:
    """Whether ``config`` is a speech encoder-decoder that reads log-mel frames (it has
    ``num_mel_bins`` and ``max_source_positions`` and is an encoder-decoder)."""
    return (getattr(config, "num_mel_bins", None) is not None
            and getattr(config, "max_source_positions", None) is not None
            and bool(getattr(config, "is_encoder_decoder", False)))


def conv_stride(config, mel_frames: int) -> int:
    """Mel frames per encoder position: ``mel_frames`` (the feature extractor's frames per window,
    ``nb_max_frames``) over the config's ``max_source_positions``.

    Raises:
        ValueError: ``mel_frames`` is not a whole multiple of the encoder positions.
    """
    positions = int(config.max_source_positions)
    if mel_frames <= 0 or mel_frames % positions:
        raise ValueError(f"the feature extractor gives {mel_frames} mel frames per window, not a whole multiple "
                         f"of the model's {positions} encoder positions")
    return mel_frames // positions


def frame_seconds(config, hop_length: int, sampling_rate: int, mel_frames: int) -> float:
    """Seconds of audio per encoder position: ``hop_length / sampling_rate * conv_stride`` (Whisper:
    160 / 16000 * 2 = 0.02 s).

    Raises:
        ValueError: see :func:`conv_stride`.
    """
    return hop_length / sampling_rate * conv_stride(config, mel_frames)


def alignment_heads(generation_config) -> list[tuple[int, int]] | None:
    """The (decoder layer, head) pairs of a generation config's ``alignment_heads`` (a list of
    pairs, as Whisper's checkpoints store them), or None when it names none."""
    heads = getattr(generation_config, ALIGNMENT_HEADS, None) if generation_config is not None else None
    if not heads:
        return None
    return [(int(layer), int(head)) for layer, head in heads]
