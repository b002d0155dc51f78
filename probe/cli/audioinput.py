"""``probe analyze --audio / --transcript``: audio clips as the analysed input (speech models)."""

from __future__ import annotations

from ..errors import InputError
from ..settings import AnalyzeSettings
from .options import setting_option, stacked

#: --audio, --transcript: audio clips instead of text (speech encoder-decoder models).
audio_options = stacked(
    setting_option(AnalyzeSettings, "audio", "--audio", multiple=True, metavar="FILE",
                   help="An audio clip to analyze with a speech model (Whisper, wav2vec2, HuBERT, data2vec-audio; "
                        "repeatable): WAV, FLAC, OGG or MP3, "
                        "read with soundfile, mixed to mono and resampled to the model's rate. The model writes the "
                        "transcript (greedy, at most --generate tokens, default 48) unless --transcript gives it."),
    setting_option(AnalyzeSettings, "transcripts", "--transcript", multiple=True, metavar="TEXT",
                   help="The transcript the decoder reads, one per --audio clip in order (default: the model's own)."),
)


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
        reason = str(exc).splitlines()[0].replace(f"Error opening {path!r}: ", "")  # soundfile repeats the path
        raise InputError(f"cannot read audio {path!r}: {reason}") from None
