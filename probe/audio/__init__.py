"""Attention on speech: a speech encoder-decoder (Whisper) reads an audio clip as encoder frames
and writes its transcript as decoder tokens; the decoder's cross-attention aligns each token to
time. A raw-waveform encoder (wav2vec2, HuBERT, data2vec-audio) reads the samples as frames and has
no decoder: its self-attention is measured over time (:mod:`probe.audio.frames`).

:func:`clips` turns audio files into batches :func:`probe.runs.analysis.analyze` takes;
:func:`analyze_audio` adds the time measures and the token-to-time alignment
(:class:`SpeechAttention`, drawn by the report's section and :func:`show_speech`), or for a
waveform encoder the time measures and the frames' picture (:class:`FrameAttention`).
docs/speech.md has the definitions.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core import LoadedModel
from ..errors import InputError
from ..loading.waves import WaveProcessor
from ..records import AnalysisResult
from ..runs.analysis import analyze
from .align import dtw, median_filter, monotone_heads, monotonicity, token_times
from .batches import AUDIO_SUFFIXES, MAX_NEW_TOKENS, AudioBatch, Clips, read_audio, resample
from .frames import FrameAttention, FrameExample, frames_html
from .maps import SpeechAttention, SpeechExample
from .view import SpeechView, show_speech, speech_html
from .waves import WaveBatch, WaveClips

__all__ = [
    "AUDIO_SUFFIXES", "MAX_NEW_TOKENS", "AudioBatch", "Clips", "FrameAttention", "FrameExample", "SpeechAttention",
    "SpeechExample", "SpeechView", "WaveBatch", "WaveClips", "analyze_audio", "frames_html", "clips", "dtw",
    "median_filter", "monotone_heads", "monotonicity", "read_audio", "resample", "show_speech", "speech_accumulators",
    "speech_html", "token_times",
]


def clips(lm: LoadedModel, items: Sequence, transcripts: Sequence[str] | None = None,
          max_new_tokens: int = MAX_NEW_TOKENS) -> Clips | WaveClips:
    """The clips ``items`` (audio paths) ready for ``analyze(lm, clips(lm, items))``; see :class:`Clips`,
    or :class:`WaveClips` for a raw-waveform encoder.

    Raises:
        InputError: not a speech model, no clip, transcripts not one per clip, a transcript for a
            model without a decoder.
    """
    if isinstance(lm.tokenizer, WaveProcessor):
        if transcripts:
            raise InputError(f"{lm.name} is a speech encoder without a decoder: it reads no transcript")
        return WaveClips(lm, items)
    return Clips(lm, items, transcripts, max_new_tokens)


def speech_accumulators(lm: LoadedModel, n_clips: int = 2) -> list:
    """The speech accumulator for ``lm``: :class:`SpeechAttention` keeping ``n_clips`` clips, aligned
    with the checkpoint's ``alignment_heads`` where it has them; :class:`FrameAttention` for a
    raw-waveform encoder."""
    if isinstance(lm.tokenizer, WaveProcessor):
        return [FrameAttention(lm.sites, lm.geometry.n_heads, n_clips)]
    return [SpeechAttention(lm.sites, lm.geometry.n_heads, lm.tokenizer, lm.tokenizer.alignment_heads, n_clips)]


def analyze_audio(lm: LoadedModel, items: Sequence, *, transcripts: Sequence[str] | None = None,
                  max_new_tokens: int = MAX_NEW_TOKENS, n_clips: int = 2, **kwargs) -> AnalysisResult:
    """Measure every head of a speech model on audio clips: :func:`probe.runs.analysis.analyze` with the
    time measures and the alignment.

    Args:
        lm: a loaded speech model (Whisper, or a raw-waveform encoder: wav2vec2, HuBERT, data2vec-audio).
        items: audio file paths (WAV, FLAC, OGG, MP3 ...: what soundfile reads).
        transcripts: per clip, the text the decoder reads; None: the model writes it (greedy); none
            for a waveform encoder.
        max_new_tokens: the bound on a written transcript.
        n_clips: clips kept for pictures and alignment.
        **kwargs: passed to :func:`probe.runs.analysis.analyze` (batch_size, accumulators ...);
            ``query_block`` defaults to 0 (whole maps: Whisper's 1500 frames are above the automatic
            block capture's length, and the alignment reads whole cross-attention maps).

    Returns:
        The :class:`~probe.records.AnalysisResult`; ``heads`` has ``time_distance_s``,
        ``audio_share``, ``monotonicity`` and ``alignment_head``, ``results["speech"]`` the aligned clips
        (a waveform encoder: ``time_distance_s`` and ``uniform_time_s``, ``results["frames"]`` the clips).

    Raises:
        InputError: not a speech model, no clip, a missing or unreadable file, a clip too long (or,
            for a waveform encoder, empty or shorter than a frame), a wrong frame count.
    """
    extra = list(kwargs.pop("accumulators", ()))
    kwargs.setdefault("query_block", 0)
    batches = clips(lm, items, transcripts, max_new_tokens)
    return analyze(lm, batches, accumulators=[*speech_accumulators(lm, n_clips), *extra], **kwargs)
