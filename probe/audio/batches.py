"""Audio clips to batches: soundfile reads them, SciPy resamples them to the model's rate, the
model's feature extractor turns them into log-mel features, and each clip becomes a source of
frames with a target of text tokens that :func:`probe.runs.analysis.analyze` takes.

A batch of clips is a :class:`probe.text.inputs.Batch` whose source ids name the encoder's frames
(:mod:`probe.loading.sound`: ``FRAME_ID + i``) and whose ``target`` holds the decoder's tokens: the prompt
(the start token, and Whisper's language, task and no-timestamps tokens where the model has them)
then the transcript, generated greedily or given (:mod:`probe.audio.transcript`).

A clip longer than the model's window (Whisper: 30 s) is cut into consecutive windows (:func:`windows`):
window w holds samples ``w * n`` to ``(w + 1) * n - 1`` (n the window's samples), the last one the
rest; each is analysed as a clip of its own, named ``name [start-end s]``, its times offset by its
start.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from math import gcd
from pathlib import Path

import numpy as np
import soundfile
import torch

from ..errors import InputError, UsageInputError
from ..loading.sound import SpeechProcessor
from ..loading.waves import WaveProcessor
from ..text.inputs import Batch, Text
from .transcript import given_ids, transcribe

#: File endings soundfile (libsndfile) reads: WAV, FLAC, OGG/Vorbis, MP3, AIFF ...
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".aiff", ".aif")
#: Tokens the model may write per clip when it transcribes (greedy), unless told otherwise.
MAX_NEW_TOKENS = 48
#: Clips transcribed at once.
GENERATE_BATCH = 8


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``samples`` [n] at ``rate`` Hz resampled to ``target`` Hz with a polyphase filter
    (:func:`scipy.signal.resample_poly`, up/down reduced by their greatest common divisor)."""
    if rate == target:
        return samples
    from scipy.signal import resample_poly  # deferred: a text run imports no scipy.signal

    g = gcd(int(rate), int(target))
    return resample_poly(samples, int(target) // g, int(rate) // g).astype(np.float32)


def read_audio(path, rate: int) -> np.ndarray:
    """[samples] float32 mono audio of a file at ``rate`` Hz: channels averaged, resampled.

    Raises:
        InputError: a missing file or one soundfile cannot read, in one line.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"audio file {str(path)!r} not found")
    try:
        data, file_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0].replace(f"Error opening {str(path)!r}: ", "")  # soundfile repeats the path
        raise InputError(f"cannot read audio {str(path)!r}: {reason}") from None
    return resample(data.mean(1), int(file_rate), rate)


def windows(samples: np.ndarray, n: int) -> list[tuple[int, np.ndarray]]:
    """(start in samples, piece) of ``samples`` cut into consecutive windows of ``n`` samples, the
    last one the rest; an empty clip is one empty piece (refused later as empty)."""
    if samples.size <= n:
        return [(0, samples)]
    return [(i, samples[i:i + n]) for i in range(0, samples.size, n)]


def window_name(name: str, start: int, size: int, rate: int) -> str:
    """``name [a-b s]``: the window of ``size`` samples from sample ``start``, in seconds."""
    return f"{name} [{start / rate:g}-{(start + size) / rate:g} s]"


@dataclass
class AudioBatch(Batch):
    """A batch of clips (:class:`probe.text.inputs.Batch` of frames, with the text tokens as ``target``).

    Attributes:
        input_features: [batch, mel bins, mel frames] float32 log-mel features.
        waveforms: per row, the clip's samples at the model's rate ([samples] float32).
        clip_frames: per row, the encoder frames that hold the clip (the rest is padding silence).
        prompt_len: per row, the decoder's prompt tokens before the transcript.
        n_text: per row, the transcript's tokens.
        frame_s: seconds per encoder frame.
        rate: samples per second of ``waveforms``.
        window_starts: per row, where its window starts in its file, in seconds (0 for a clip within one window).
    """

    input_features: torch.Tensor | None = None
    waveforms: list | None = None
    clip_frames: list | None = None
    prompt_len: list | None = None
    n_text: list | None = None
    frame_s: float = 0.0
    rate: int = 0
    window_starts: list | None = None

    def model_inputs(self) -> dict:
        """``input_features``, the decoder's ids and its mask (the encoder reads every frame)."""
        return {"input_features": self.input_features, "decoder_input_ids": self.target.input_ids,
                "decoder_attention_mask": self.target.attention_mask, "use_cache": False}

    def to(self, device) -> AudioBatch:
        """The features (and the frame and token ids) moved to ``device``."""
        super().to(device)
        self.input_features = self.input_features.to(device)
        return self


def _target(processor: SpeechProcessor, rows: list[list[int]], texts: list[Text]) -> Batch:
    """The decoder's side: the rows right-padded with the pad token."""
    B, T = len(rows), max(len(r) for r in rows)
    pad = processor.pad_token_id if processor.pad_token_id is not None else 0
    ids = torch.full((B, T), int(pad), dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    special = torch.zeros(B, T, dtype=torch.bool)
    for b, row in enumerate(rows):
        ids[b, :len(row)] = torch.tensor(row)
        mask[b, :len(row)] = 1
        special[b, :len(row)] = torch.tensor([processor.is_special(i) for i in row])
    return Batch(ids, mask, None, torch.zeros(B, T, 2, dtype=torch.long), special,
                 torch.full((B, T), -1, dtype=torch.long), texts, [t.index for t in texts], [False] * B)


def _text_run(processor: SpeechProcessor, ids: Sequence[int]) -> int:
    """How many of ``ids`` are text before the first special token (the end of the transcript)."""
    for i, t in enumerate(ids):
        if processor.is_special(t):
            return i
    return len(ids)


class Clips:
    """Audio clips for :func:`probe.runs.analysis.analyze` (in place of texts): every clip is read,
    cut into the model's windows where it is longer than one (:func:`windows`), turned into
    features and transcribed when the clips are made (before the analysis runs). Each window is one
    item: ``len(clips)`` counts windows.

    Args:
        lm: a loaded speech model (its tokenizer a :class:`~probe.loading.sound.SpeechProcessor`).
        items: audio file paths.
        transcripts: per clip, the text the decoder reads; None to let the model write it (greedy,
            at most ``max_new_tokens`` tokens).
        max_new_tokens: the bound on a written transcript.

    Raises:
        InputError: not a speech model, no clip, transcripts not one per clip, a missing or
            unreadable file, a transcript for a clip longer than one window, a wrong frame count.
    """

    #: what one item is called in messages (``Analyzing 2 clips``).
    noun = "clip"

    def __init__(self, lm, items: Sequence, transcripts: Sequence[str] | None = None,
                 max_new_tokens: int = MAX_NEW_TOKENS) -> None:
        if not isinstance(lm.tokenizer, SpeechProcessor):
            raise InputError(f"{lm.name} reads text, not audio (a speech model reads log-mel frames)")
        items = [items] if isinstance(items, (str, Path)) else list(items)
        if not items:
            raise InputError("no audio clip given")
        if transcripts is not None and len(transcripts) != len(items):
            raise InputError(f"{len(transcripts)} transcripts for {len(items)} clips: give one per clip")
        self.lm = lm
        p: SpeechProcessor = lm.tokenizer
        # read and transcribed now, before the analysis hooks the model: generation is no measured pass
        self.items, self.waves, self.offsets = [], [], []
        for it in items:
            pieces = windows(read_audio(it, p.rate), int(p.extractor.n_samples))
            if transcripts is not None and len(pieces) > 1:
                raise InputError(f"{Path(it).name} lasts longer than the model's {p.window_s:g} s window: it is cut "
                                 "into windows, and one --transcript cannot be split between them (give the clip "
                                 "in pieces of at most one window, each with its transcript)")
            for start, piece in pieces:
                name = Path(it).name if len(pieces) == 1 else window_name(Path(it).name, start, piece.size, p.rate)
                self.items.append(name)
                self.waves.append(piece)
                self.offsets.append(start / p.rate)
        self.features = [p.features(w, it) for w, it in zip(self.waves, self.items)]
        self.rows: list[tuple[int, list[int]]] = []
        for i in range(0, len(self.items), GENERATE_BATCH):
            feats = torch.stack(self.features[i:i + GENERATE_BATCH])
            if transcripts is None:
                self.rows += transcribe(lm, feats, max_new_tokens)
            else:
                self.rows += [given_ids(lm, feats[j:j + 1], transcripts[i + j]) for j in range(len(feats))]

    def __len__(self) -> int:
        return len(self.items)

    def batch(self, start: int, stop: int) -> AudioBatch:
        """One :class:`AudioBatch` of clips ``start`` to ``stop - 1``."""
        p: SpeechProcessor = self.lm.tokenizer
        items, waves = self.items[start:stop], self.waves[start:stop]
        feats = torch.stack(self.features[start:stop])
        prompt = [r[0] for r in self.rows[start:stop]]
        rows = [r[1] for r in self.rows[start:stop]]
        texts = [Text(it, index=start + i, target=p.text.decode(r[n:], skip_special_tokens=True))
                 for i, (it, r, n) in enumerate(zip(items, rows, prompt))]
        B, P = len(items), p.positions
        ids = torch.tensor([p.frame_ids()] * B, dtype=torch.long)
        n_text = [_text_run(p, r[n:]) for r, n in zip(rows, prompt)]
        return AudioBatch(ids, torch.ones(B, P, dtype=torch.long), None, torch.zeros(B, P, 2, dtype=torch.long),
                          torch.zeros(B, P, dtype=torch.bool), torch.full((B, P), -1, dtype=torch.long), texts,
                          list(range(start, start + B)), [False] * B, target=_target(p, rows, texts),
                          input_features=feats, waveforms=waves, clip_frames=[p.frames_of(w.size) for w in waves],
                          prompt_len=prompt, n_text=n_text, frame_s=p.frame_s, rate=p.rate,
                          window_starts=self.offsets[start:stop])

    def iter_batches(self, batch_size: int = 16) -> Iterator[AudioBatch]:
        """Batches of ``batch_size`` clips, in order."""
        for i in range(0, len(self.items), batch_size):
            yield self.batch(i, min(i + batch_size, len(self.items)))


def audio_input(files, transcripts, limit: int | None, other_input: bool) -> list[str] | None:
    """The audio paths of ``--audio`` (at most ``limit``), each checked to exist before a model is
    loaded; None when none was given.

    Raises:
        UsageInputError: transcripts without clips. InputError: text or images given too, a missing file,
            transcripts not one per clip.
    """
    if not files:
        if transcripts:
            raise UsageInputError("--transcript goes with --audio (the transcript of a clip)")
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


def check_speech_input(lm, paths: list[str] | None) -> None:
    """Refuse audio for a model that does not read it, and text for a speech model, in one line.

    Raises:
        InputError: the input does not fit the model.
    """
    is_speech = isinstance(lm.tokenizer, (SpeechProcessor, WaveProcessor))
    if paths is not None and not is_speech:
        raise InputError(f"{lm.name} does not read audio (a speech model reads log-mel frames, as Whisper does, "
                         "or the waveform, as wav2vec2 and HuBERT do)")
    if paths is None and is_speech:
        raise InputError(f"{lm.name} is a speech model: give audio clips with --audio FILE")
