"""Per-head measures of a speech model's attention over time, and the clips kept for pictures.

Encoder self-attention, over the query frames that hold the clip (frame i covers audio from
``i * frame_s`` seconds; the frames after the clip hold the feature extractor's padding silence
and are left out as queries, kept as keys):

- ``time_distance_s``: sum over keys k of A[q, k] * |q - k| * frame_s, seconds (the mean time
  between a frame and the frames it attends to);
- ``audio_share``: the mass on frames that hold the clip (the rest goes to padding silence).

Decoder cross-attention, over the rows that place the text tokens (:mod:`probe.audio.align`):

- ``monotonicity``: the Spearman correlation between row and peak frame, averaged over clips;
- ``alignment_head``: 1 for the heads the alignment uses (the checkpoint's ``alignment_heads``,
  else the most monotone), 0 for the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..measures.accumulators import Accumulator
from ..sites import Site
from ..text.inputs import Batch
from ..text.tokens import token_surface
from .align import monotone_heads, monotonicity, token_times


@dataclass
class SpeechExample:
    """One clip with the attention drawn over its time axis.

    Attributes:
        index: position of the clip among the inputs.
        name: its file name.
        waveform: [samples] float32 at ``rate`` Hz.
        rate: samples per second.
        frame_s: seconds per encoder frame.
        tokens: the transcript's text tokens, as the text each stands for (``' word'``).
        cross: [decoder layers, heads, n + 1, frames] float32 cross-attention of the rows that place
            the n text tokens, over the frames that hold the clip.
        heads: the (layer, head) pairs the alignment uses.
        source: where they come from (``"checkpoint"`` or ``"monotone"``).
        starts, ends: [n] each token's start and end in seconds, from the window's start.
        offset_s: where the window starts in its file, in seconds (0 unless a long clip was cut).
    """

    index: int
    name: str
    waveform: np.ndarray
    rate: int
    frame_s: float
    tokens: list[str]
    cross: np.ndarray
    heads: list[tuple[int, int]] = field(default_factory=list)
    source: str = ""
    starts: np.ndarray | None = None
    ends: np.ndarray | None = None
    offset_s: float = 0.0

    def align(self, heads: list[tuple[int, int]], source: str) -> SpeechExample:
        """Set :attr:`heads` and the token times from their rows (:func:`probe.audio.align.token_times`)."""
        self.heads, self.source = list(heads), source
        usable = [(layer, h) for layer, h in heads if layer < self.cross.shape[0] and h < self.cross.shape[1]]
        if usable and self.tokens and self.cross.shape[-1] > 0:
            self.starts, self.ends = token_times(np.stack([self.cross[layer, h] for layer, h in usable]), self.frame_s)
        return self

    def alignment(self) -> list[tuple[str, float, float]]:
        """(token, start s, end s) per text token, in seconds of the file (the window's times plus
        :attr:`offset_s`); empty where none was aligned."""
        if self.starts is None:
            return []
        o = self.offset_s
        return [(t, float(s) + o, float(e) + o) for t, s, e in zip(self.tokens, self.starts, self.ends)]


class SpeechAttention(Accumulator):
    """Encoder time distances and audio shares, cross-attention monotonicity, and the first ``n``
    clips' alignment rows.

    Args:
        sites: the model's sites.
        n_heads: heads per layer.
        tokenizer: the model's :class:`~probe.loading.sound.SpeechProcessor` (token labels).
        alignment: the checkpoint's (decoder layer, head) alignment heads, or None to choose the
            most monotone (:func:`probe.audio.align.monotone_heads`).
        n: clips kept for pictures and alignment.

    Batches must be clips (:class:`probe.audio.batches.AudioBatch`); others are skipped.
    """

    name = "speech"
    title = "attention over audio"
    model_kinds = ("encoder-decoder",)
    site_kinds = ("self", "cross")
    transient = ("tokenizer",)

    def __init__(self, sites: list[Site], n_heads: int, tokenizer, alignment=None, n: int = 2) -> None:
        self.encoder = [s for s in sites if s.stack == "encoder" and s.kind == "self"]
        self.cross = [s for s in sites if s.kind == "cross"]
        self.n_heads, self.tokenizer, self.alignment, self.n = n_heads, tokenizer, alignment, n
        self.time = {s: np.zeros((n_heads, 3)) for s in self.encoder}  # distance sum, audio share sum, rows
        self.mono = {s: np.zeros((n_heads, 2)) for s in self.cross}  # correlation sum, clips
        self.kept: dict[int, dict] = {}

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, rows=None) -> None:
        """Fold in one site's probabilities [batch, heads, query, key] of a batch of clips."""
        if not hasattr(batch, "clip_frames"):
            return
        if site in self.time:
            self._encoder(site, probs, batch)
        elif site in self.mono:
            self._cross(site, probs, batch)

    def _encoder(self, site: Site, probs: torch.Tensor, batch) -> None:
        T = probs.shape[-1]
        for b, F in enumerate(batch.clip_frames):
            a = probs[b, :, :F, :].double()  # [H, F, T]
            q, k = torch.arange(F, device=a.device), torch.arange(T, device=a.device)
            dist = (q[:, None] - k[None, :]).abs().double() * batch.frame_s
            self.time[site][:, 0] += (a * dist).sum((-2, -1)).cpu().numpy()
            self.time[site][:, 1] += a[..., :F].sum((-2, -1)).cpu().numpy()
            self.time[site][:, 2] += F

    def _cross(self, site: Site, probs: torch.Tensor, batch) -> None:
        for b, (F, p, n) in enumerate(zip(batch.clip_frames, batch.prompt_len, batch.n_text)):
            if n < 1:
                continue
            r = probs[b, :, p - 1:p + n, :F].float().cpu().numpy()  # [H, n + 1, F]
            for h in range(r.shape[0]):
                rho = monotonicity(r[h])
                if rho == rho:
                    self.mono[site][h] += (rho, 1)
            idx = batch.index[b]
            if idx < self.n:
                kept = self.kept.setdefault(idx, self._example(batch, b, p, n))
                kept["cross"].append(r)

    def _example(self, batch, b: int, p: int, n: int) -> dict:
        ids = batch.target.input_ids[b, p:p + n].tolist()
        return {"name": batch.texts[b].text, "waveform": batch.waveforms[b], "rate": batch.rate,
                "frame_s": batch.frame_s, "offset_s": (batch.window_starts or [0.0] * (b + 1))[b],
                "tokens": [token_surface(self.tokenizer.text, t) for t in self.tokenizer.convert_ids_to_tokens(ids)],
                "cross": []}

    def merge(self, other: SpeechAttention) -> SpeechAttention:
        for s in self.time:
            self.time[s] += other.time[s]
        for s in self.mono:
            self.mono[s] += other.mono[s]
        for idx, kept in other.kept.items():
            self.kept.setdefault(idx, kept)
        return self

    def scores(self) -> dict[tuple[int, int], float]:
        """(decoder layer, head) -> mean monotonicity over the clips (NaN where never measured)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return {(s.layer, h): float(m[h, 0] / m[h, 1]) for s, m in self.mono.items() for h in range(self.n_heads)}

    def chosen(self) -> tuple[list[tuple[int, int]], str]:
        """The alignment heads and where they come from (``"checkpoint"`` or ``"monotone"``)."""
        if self.alignment:
            return list(self.alignment), "checkpoint"
        return monotone_heads(self.scores()), "monotone"

    def result(self) -> list[SpeechExample]:
        """The kept clips, in input order, aligned with :meth:`chosen` heads."""
        heads, source = self.chosen()
        return [SpeechExample(idx, k["name"], k["waveform"], k["rate"], k["frame_s"], k["tokens"], np.stack(k["cross"]),
                              offset_s=k.get("offset_s", 0.0)).align(heads, source)
                for idx, k in sorted(self.kept.items())]

    def columns(self) -> pd.DataFrame:
        """One row per encoder self-attention head (``time_distance_s``, ``audio_share``) and per
        cross-attention head (``monotonicity``, ``alignment_head``), keyed by stack, kind, layer, head."""
        out = []
        for s, t in self.time.items():
            for h in range(self.n_heads):
                with np.errstate(invalid="ignore", divide="ignore"):
                    out.append({"stack": s.stack, "kind": s.kind, "layer": s.layer, "head": h,
                                "time_distance_s": t[h, 0] / t[h, 2], "audio_share": t[h, 1] / t[h, 2]})
        heads = set(self.chosen()[0])
        scores = self.scores()
        for s in self.mono:
            for h in range(self.n_heads):
                out.append({"stack": s.stack, "kind": s.kind, "layer": s.layer, "head": h,
                            "monotonicity": scores[(s.layer, h)], "alignment_head": float((s.layer, h) in heads)})
        return pd.DataFrame(out, columns=["stack", "kind", "layer", "head", "time_distance_s", "audio_share",
                                          "monotonicity", "alignment_head"])
