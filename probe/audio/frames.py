"""A raw-waveform speech encoder's self-attention over time: the per-head time distance and the
picture of the first clips (the waveform, and per layer where the heads' attention lands, on one
time axis in seconds).

Frame i covers audio from ``i * frame_s`` seconds (:mod:`probe.loading.waves`). For each head,
over every query frame q of every clip, with A the row of probabilities over the clip's frames:

- ``time_distance_s``: sum over frames k of A[q, k] * |q - k| * frame_s, in seconds (the same
  definition as Whisper's encoder heads, :mod:`probe.audio.maps`; every frame holds audio here);
- ``uniform_time_s``: the time distance uniform attention would have over the same clips.

The picture's strip for layer l is ``received[l, k]``: the mean over query frames and heads of
A[q, k], the weight frame k receives (a column mean of the head-averaged map).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from markupsafe import escape

from ..images.overlay import heat_colour, png_data_uri
from ..measures.accumulators import Accumulator, present_heads
from ..sites import Site
from ..text.inputs import Batch
from .view import WIDTH, _axis_svg, _wave_svg

_WAVE_H, _STRIP_H = 80, 10


@dataclass
class FrameExample:
    """One clip with where the encoder's attention lands over time.

    Attributes:
        index: position of the clip among the inputs.
        name: its file name.
        waveform: [samples] float32 at ``rate`` Hz.
        rate: samples per second.
        frame_s: seconds from one frame's start to the next's.
        received: [layers, heads, frames] float32, the mean over query frames of each head's weight on each frame.
    """

    index: int
    name: str
    waveform: np.ndarray
    rate: int
    frame_s: float
    received: np.ndarray

    @property
    def frames(self) -> int:
        return int(self.received.shape[-1])


class FrameAttention(Accumulator):
    """Per-head time distance of a raw-waveform encoder's self-attention, and the first ``n`` clips' pictures.

    Args:
        sites: the model's sites (the encoder's self-attention layers).
        n_heads: heads per layer.
        n: clips kept for pictures.

    Batches must be clips (:class:`probe.audio.waves.WaveBatch`); others are skipped.
    """

    name = "frames"
    title = "attention over audio frames"
    model_kinds = ("encoder",)
    site_kinds = ("self",)

    def __init__(self, sites: list[Site], n_heads: int, n: int = 2) -> None:
        self.sites = [s for s in sites if s.kind == "self"]
        self.n_heads, self.n = n_heads, n
        self.sums = {s: np.zeros((n_heads, 3)) for s in self.sites}  # distance, uniform distance, rows
        self.kept: dict[int, dict] = {}

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, rows=None) -> None:
        """Fold in one site's probabilities [batch, heads, frames, frames] of a batch of clips."""
        if site not in self.sums or not hasattr(batch, "clip_frames"):
            return
        keep = present_heads(probs).cpu().numpy()
        for b, F in enumerate(batch.clip_frames):
            a = probs[b, :, :F, :F].double()  # [H, F, F]
            pos = torch.arange(F, device=a.device)
            dist = (pos[:, None] - pos[None, :]).abs().double() * batch.frame_s
            sums = np.stack([(a * dist).sum((-2, -1)).cpu().numpy(), np.full(len(keep), float(dist.mean(-1).sum())),
                             np.full(len(keep), float(F))], -1)
            self.sums[site][keep] += sums[keep]
            idx = batch.index[b]
            if idx < self.n:
                kept = self.kept.setdefault(idx, {"name": batch.texts[b].text, "waveform": batch.waveforms[b],
                                                  "rate": batch.rate, "frame_s": batch.frame_s, "received": {}})
                kept["received"][site.layer] = a.mean(1).float().cpu().numpy()

    def merge(self, other: FrameAttention) -> FrameAttention:
        for s in self.sums:
            self.sums[s] += other.sums[s]
        for idx, kept in other.kept.items():
            self.kept.setdefault(idx, kept)
        return self

    def result(self) -> list[FrameExample]:
        """The kept clips, in input order."""
        return [FrameExample(idx, k["name"], k["waveform"], k["rate"], k["frame_s"],
                             np.stack([k["received"][layer] for layer in sorted(k["received"])]))
                for idx, k in sorted(self.kept.items())]

    def columns(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head``, ``time_distance_s``, ``uniform_time_s`` (NaN where
        nothing was measured)."""
        out = []
        for s, t in self.sums.items():
            for h in range(self.n_heads):
                with np.errstate(invalid="ignore", divide="ignore"):
                    out.append({"stack": s.stack, "kind": s.kind, "layer": s.layer, "head": h,
                                "time_distance_s": t[h, 0] / t[h, 2], "uniform_time_s": t[h, 1] / t[h, 2]})
        return pd.DataFrame(out, columns=["stack", "kind", "layer", "head", "time_distance_s", "uniform_time_s"])


def frames_html(ex: FrameExample) -> str:
    """The HTML of one clip's picture: the waveform on a time axis in seconds, then per layer a strip
    (a PNG data URI) of the weight each frame receives, averaged over heads and query frames, each
    strip over its largest value."""
    seconds = max(ex.frames * ex.frame_s, len(ex.waveform) / ex.rate, 1e-3)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{_WAVE_H + 22}" '
           f'viewBox="0 0 {WIDTH} {_WAVE_H + 22}" class="speech-svg">'
           f'<line x1="0" y1="{_WAVE_H / 2}" x2="{WIDTH}" y2="{_WAVE_H / 2}" stroke="#ccc"/>'
           + _wave_svg(ex, seconds) + _axis_svg(seconds, _WAVE_H + 4) + "</svg>")
    parts = [f"<h3>{escape(ex.name)}: {len(ex.waveform) / ex.rate:.2f} s, {ex.frames} frames of "
             f"{ex.frame_s * 1000:g} ms</h3>", f'<div style="overflow-x:auto">{svg}</div>']
    width = max(1, round(WIDTH * ex.frames * ex.frame_s / seconds))
    for layer, heads in enumerate(ex.received):
        row = heads.mean(0)
        top = row.max() if row.size else 0.0
        row = row / top if top > 0 else np.zeros_like(row)
        cells = np.repeat(row[np.arange(width) * ex.frames // width][None], _STRIP_H, 0)
        uri = png_data_uri(np.round(heat_colour(cells) * 255).astype(np.uint8))
        parts.append(f'<div class="frames-strip" style="overflow-x:auto;white-space:nowrap">'
                     f'<img src="{uri}" width="{width}" height="{_STRIP_H}" '
                     f'alt="L{layer}: weight each frame receives" title="L{layer}: weight each frame receives, '
                     f'mean over heads and query frames" '
                     f'style="display:inline-block;vertical-align:middle;max-width:none"> '
                     f'<span style="font-size:11px">L{layer}</span></div>')
    return "".join(parts)


def caption() -> str:
    """What the picture shows, in words."""
    return ("Each clip: its waveform on a time axis in seconds and, per encoder layer, the weight each frame "
            "receives (mean over heads and query frames; dark red to yellow, each strip over its largest value). "
            "The heads table has each head's time distance in seconds (the mean time between a frame and the frames "
            "it reads) beside that of uniform attention.")
