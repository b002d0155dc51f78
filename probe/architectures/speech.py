"""What differs between speech models: whether a config reads log-mel frames, how long one encoder
position lasts, and which cross-attention heads a checkpoint names for aligning words to time.

Whisper-style encoder-decoder models read a log-mel spectrogram (``num_mel_bins`` bins per mel
frame, one mel frame every ``hop_length`` samples) through convolutions that shorten it; the
encoder's positions are therefore longer than a mel frame by the convolutions' total stride. The
stride is read from the config and the feature extractor (mel frames per window over encoder
positions per window), not assumed.

Raw-waveform encoders (wav2vec2, HuBERT, data2vec-audio) read the samples themselves through 1-D
convolutions without padding whose kernels and strides the config lists (``conv_kernel``,
``conv_stride``): the frame count, the hop between frames and the span one frame sees follow from
them and the sampling rate.
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


#: Mel frames per encoder position of a Whisper encoder (its second convolution's stride; the first's is 1).
ENCODER_STRIDE = 2


def conv_stride(config, mel_frames: int) -> int:
    """Mel frames per encoder position: ``mel_frames`` (the feature extractor's frames per window,
    ``nb_max_frames``) over the config's ``max_source_positions``.

    Raises:
        ValueError: ``mel_frames`` is not a whole multiple of the encoder positions.
    """
    positions = int(config.max_source_positions)
    if mel_frames <= 0 or mel_frames % positions:
        raise ValueError(f"the feature extractor gives {mel_frames} mel frames per window, not a whole multiple "
                         f"of the model's {positions} encoder positions: the model needs {ENCODER_STRIDE * positions} "
                         f"({positions} positions x the stride {ENCODER_STRIDE} of its second convolution), which a "
                         "feature extractor gives with chunk_length x sampling_rate / hop_length = "
                         f"{ENCODER_STRIDE * positions}")
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


def is_waveform(config) -> bool:
    """Whether ``config`` is a speech encoder that reads the raw waveform through a stack of 1-D
    convolutions (wav2vec2, HuBERT, data2vec-audio: ``conv_kernel`` and ``conv_stride`` lists, no
    decoder, no mel bins)."""
    kernels, strides = getattr(config, "conv_kernel", None), getattr(config, "conv_stride", None)
    return (isinstance(kernels, (list, tuple)) and isinstance(strides, (list, tuple)) and len(kernels) > 0
            and len(kernels) == len(strides) and getattr(config, "num_mel_bins", None) is None
            and not bool(getattr(config, "is_encoder_decoder", False)))


def conv_layers(config) -> list[tuple[int, int]]:
    """(kernel, stride) in samples of each convolution of a waveform encoder's feature extractor, first first."""
    return [(int(k), int(s)) for k, s in zip(config.conv_kernel, config.conv_stride)]


def conv_frames(config, n_samples: int) -> int:
    """Frames the convolutions make of ``n_samples`` samples: each layer (kernel k, stride s, no
    padding) turns n into ``(n - k) // s + 1`` (0 once n < k)."""
    n = int(n_samples)
    for k, s in conv_layers(config):
        n = (n - k) // s + 1 if n >= k else 0
    return n


def conv_hop(config) -> int:
    """Samples from one frame's start to the next's: the product of the strides (wav2vec2: 320)."""
    hop = 1
    for _, s in conv_layers(config):
        hop *= s
    return hop


def receptive_field(config) -> int:
    """Samples one frame sees: 1 + sum over layers of (k_l - 1) times the strides before layer l
    (wav2vec2: 400, 25 ms at 16 kHz)."""
    field, step = 1, 1
    for k, s in conv_layers(config):
        field += (k - 1) * step
        step *= s
    return field
