"""``probe analyze --audio / --transcript``: audio clips as the analysed input (speech models)."""

from __future__ import annotations

import click

from ..errors import InputError
from .options import stacked

#: --audio, --transcript: audio clips instead of text (speech encoder-decoder models).
audio_options = stacked(
    click.option("--audio", "audio_files", multiple=True, metavar="FILE",
                 help="An audio clip to analyze with a speech model (Whisper, wav2vec2, HuBERT, data2vec-audio; "
                      "repeatable): WAV, FLAC, OGG or MP3, "
                      "read with soundfile, mixed to mono and resampled to the model's rate. The model writes the "
                      "transcript (greedy, at most --generate tokens, default 48) unless --transcript gives it."),
    click.option("--transcript", "transcripts", multiple=True, metavar="TEXT",
                 help="The transcript the decoder reads, one per --audio clip in order (default: the model's own)."),
)


def audio_input(files, transcripts, limit: int | None, other_input: bool) -> list[str] | None:
    """The audio paths of ``--audio`` (at most ``limit``), each checked to exist before a model is
    loaded; None when none was given.

    Raises:
        InputError: text or images given too, a missing file, transcripts not one per clip.
    """
    from pathlib import Path

    if not files:
        if transcripts:
            raise InputError("--transcript goes with --audio (the transcript of a clip)")
        return None
    if other_input:
        raise InputError("give either audio (--audio) or text or images, not both")
    paths = [str(p) for p in files]
    paths = paths[:limit] if limit else paths
    for path in paths:
        if not Path(path).is_file():
            raise InputError(f"audio file {path!r} not found")
    if transcripts and len(transcripts) != len(paths):
        raise InputError(f"{len(transcripts)} --transcript for {len(paths)} --audio clips: give one per clip")
    return paths


def check_audio(path: str) -> None:
    """Refuse a file that is not audio soundfile reads (its header only: milliseconds), before torch is
    imported and a speech model loads, with :func:`probe.audio.batches.read_audio`'s words. A missing
    file is left to :func:`audio_input`.

    Raises:
        InputError: ``cannot read audio 'PATH': <soundfile's reason>``.
    """
    import os

    if not os.path.isfile(path):
        return
    import soundfile  # numpy and libsndfile, no torch

    try:
        soundfile.info(path)
    except (soundfile.LibsndfileError, RuntimeError, OSError, ValueError) as exc:
        raise InputError(f"cannot read audio {path!r}: {str(exc).splitlines()[0]}") from None


def check_speech_input(lm, paths: list[str] | None) -> None:
    """Refuse audio for a model that does not read it, and text for a speech model, in one line.

    Raises:
        InputError: the input does not fit the model.
    """
    from ..loading.sound import SpeechProcessor
    from ..loading.waves import WaveProcessor

    is_speech = isinstance(lm.tokenizer, (SpeechProcessor, WaveProcessor))
    if paths is not None and not is_speech:
        raise InputError(f"{lm.name} does not read audio (a speech model reads log-mel frames, as Whisper does, "
                         "or the waveform, as wav2vec2 and HuBERT do)")
    if paths is None and is_speech:
        raise InputError(f"{lm.name} is a speech model: give audio clips with --audio FILE")


def speech_input(lm, paths: list[str], transcripts, generate: int | None, examples: int):
    """The clips of a run (read, featurized and transcribed: at most ``generate`` tokens, default
    :data:`probe.audio.MAX_NEW_TOKENS`) and the speech accumulator keeping ``min(examples, 2)`` clips.

    Raises:
        InputError: an unreadable clip, one too long, a wrong frame count, transcripts not one per clip.
    """
    from ..audio import MAX_NEW_TOKENS, clips, speech_accumulators

    seqs = clips(lm, paths, list(transcripts) or None, generate or MAX_NEW_TOKENS)
    return seqs, speech_accumulators(lm, n_clips=min(examples, 2))
