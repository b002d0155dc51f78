"""The picture of an analysed clip: the waveform on a time axis in seconds, each text token's span
from the alignment laid under it, and the alignment heads' mean cross-attention (tokens down,
time across) as a heat map on the same axis. The report's section (:mod:`probe.report.speech`) and
:func:`show_speech` draw it; it is inline SVG with a PNG data URI: the page loads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from markupsafe import escape

from ..errors import InputError
from ..images.overlay import heat_colour, png_data_uri
from ..sites import head_name
from .maps import SpeechExample

#: Width in pixels of the time axis.
WIDTH = 900
_WAVE_H, _HEAT_ROW = 80, 6


def envelope(waveform: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """([columns], [columns]) the lowest and highest sample of each of ``columns`` equal slices
    of ``waveform`` (0 for an empty slice)."""
    edges = np.linspace(0, len(waveform), columns + 1).astype(int)
    lo = np.array([waveform[a:b].min() if b > a else 0.0 for a, b in zip(edges[:-1], edges[1:])])
    hi = np.array([waveform[a:b].max() if b > a else 0.0 for a, b in zip(edges[:-1], edges[1:])])
    return lo, hi


def _wave_svg(ex: SpeechExample, seconds: float) -> str:
    used = max(1, round(WIDTH * (len(ex.waveform) / ex.rate) / seconds))
    lo, hi = envelope(ex.waveform, used)
    top = max(float(np.abs(ex.waveform).max()), 1e-9)
    mid = _WAVE_H / 2
    points = [f"{x},{mid - hi[x] / top * mid:.1f}" for x in range(used)]
    points += [f"{x},{mid - lo[x] / top * mid:.1f}" for x in range(used - 1, -1, -1)]
    return f'<polygon points="{" ".join(points)}" fill="#4a6fa5"/>'


#: Lanes of token labels under the waveform, the height of one, and a label's width per character (px;
#: 11 px sans-serif text is at most about 6.5 px a character).
_LANES, _LANE_H, _CHAR_W = 4, 17, 6.5


def token_lanes(spans: list[tuple[float, float, str]]) -> list[int | None]:
    """The lane of each token's label (x0, x1 in px, token), the first where it does not overlap the
    label before it (a label is as wide as its box or its text, whichever is wider); None where no lane
    of :data:`_LANES` has room (the box stays, its title names the token)."""
    ends = [-np.inf] * _LANES
    lanes: list[int | None] = []
    for x0, x1, tok in spans:
        right = max(x1, x0 + 2 + _CHAR_W * len(tok))
        lane = next((k for k in range(_LANES) if ends[k] <= x0), None)
        if lane is not None:
            ends[lane] = right + 2
        lanes.append(lane)
    return lanes


def _token_svg(ex: SpeechExample, seconds: float) -> tuple[str, float]:
    """The token boxes and labels under the waveform, and their height (px)."""
    spans = [(WIDTH * (s - ex.offset_s) / seconds, WIDTH * (e - ex.offset_s) / seconds, tok)
             for tok, s, e in ex.alignment()]
    lanes = token_lanes(spans)
    height = _LANE_H * (1 + max((k for k in lanes if k is not None), default=0))
    parts = []
    for i, ((x0, x1, tok), lane, (_, s, e)) in enumerate(zip(spans, lanes, ex.alignment())):
        y = _WAVE_H + 4 + (lane if lane is not None else 0) * _LANE_H
        parts.append(f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 1):.1f}" height="{_LANE_H - 2}" '
                     f'fill="{"#f2c14e" if i % 2 else "#f78154"}" opacity="0.8"><title>{escape(tok)}: '
                     f'{s:.2f}-{e:.2f} s</title></rect>')
        if lane is not None:
            parts.append(f'<text x="{x0 + 2:.1f}" y="{y + 12:.1f}" font-size="11">{escape(tok)}</text>')
    return "".join(parts), height


def _axis_svg(seconds: float, y: float, offset: float = 0.0) -> str:
    step = 0.5 if seconds <= 5 else 1.0 if seconds <= 10 else 5.0
    ticks = np.arange(0, seconds + 1e-9, step)
    return "".join(f'<line x1="{WIDTH * t / seconds:.1f}" y1="{y}" x2="{WIDTH * t / seconds:.1f}" y2="{y + 4}" '
                   f'stroke="#333"/><text x="{WIDTH * t / seconds + 2:.1f}" y="{y + 14}" font-size="10">'
                   f"{t + offset:g} s</text>" for t in ticks)


def heat_rows(ex: SpeechExample) -> np.ndarray:
    """[n + 1, frames] the alignment heads' mean cross-attention rows (each row over its maximum)."""
    if not ex.heads:
        return np.zeros((0, ex.cross.shape[-1]))
    m = np.mean([ex.cross[layer, h] for layer, h in ex.heads if layer < ex.cross.shape[0]], 0)
    top = m.max(-1, keepdims=True)
    return np.where(top > 0, m / np.where(top > 0, top, 1), 0.0)


def speech_html(ex: SpeechExample) -> str:
    """The HTML of one clip's picture (a heading, an SVG and the heat map as an ``<img>``)."""
    frames = ex.cross.shape[-1]
    seconds = max(frames * ex.frame_s, len(ex.waveform) / ex.rate, 1e-3)
    heads = ", ".join(head_name({"stack": "decoder", "kind": "cross", "layer": layer}, h)
                      for layer, h in ex.heads) or "none"
    tokens, tokens_h = _token_svg(ex, seconds)
    height = _WAVE_H + tokens_h + 22
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" class="speech-svg">'
           f'<line x1="0" y1="{_WAVE_H / 2}" x2="{WIDTH}" y2="{_WAVE_H / 2}" stroke="#ccc"/>'
           + _wave_svg(ex, seconds) + tokens
           + _axis_svg(seconds, _WAVE_H + tokens_h + 4, ex.offset_s)
           + "</svg>")
    parts = [f"<h3>{escape(ex.name)}: {len(ex.waveform) / ex.rate:.2f} s, {len(ex.tokens)} text tokens, "
             f"alignment heads ({escape(ex.source)}): {escape(heads)}</h3>",
             f'<div style="overflow-x:auto">{svg}</div>']
    rows = heat_rows(ex)
    if rows.size:
        width = max(1, round(WIDTH * frames * ex.frame_s / seconds))
        cells = rows[np.repeat(np.arange(rows.shape[0]), _HEAT_ROW)][:, np.arange(width) * frames // width]
        uri = png_data_uri(np.round(heat_colour(cells) * 255).astype(np.uint8))
        parts.append(f'<div style="overflow-x:auto"><img src="{uri}" width="{width}" height="{cells.shape[0]}" '
                     'alt="cross-attention of the '
                     'alignment heads" title="rows: the decoder while writing each text token (last: the end); '
                     'columns: frames" style="display:block;max-width:none"></div>')
    table = "".join(f"<tr><td>{escape(t)}</td><td>{s:.2f}</td><td>{e:.2f}</td></tr>" for t, s, e in ex.alignment())
    if table:
        parts.append('<details><summary>token times</summary><table class="speech-times"><tr><th>token</th>'
                     f"<th>start s</th><th>end s</th></tr>{table}</table></details>")
    return "".join(parts)


def caption() -> str:
    """What the picture shows, in words."""
    return ("Each clip: its waveform on a time axis in seconds, each text token's span from the cross-attention "
            "alignment (median filter and dynamic time warping over the alignment heads, as Whisper's word timing "
            "does), and the alignment heads' mean cross-attention (a row per token, time across; each row over its "
            "largest weight). The heads table has each encoder head's time distance in seconds and audio share, "
            "and each cross-attention head's monotonicity.")


@dataclass
class SpeechView:
    """The picture of one analysed clip for a notebook (Jupyter: ``_repr_html_``; ``.html``).

    Attributes:
        html: self-contained HTML (inline SVG, PNG data URI, no script).
    """

    html: str

    def _repr_html_(self) -> str:
        return self.html


def show_speech(result, clip: int = 0) -> SpeechView:
    """The picture of clip ``clip`` of an analysis of audio (for a notebook).

    Raises:
        InputError: no clips in ``result``, or ``clip`` out of range.
    """
    examples = result.results.get("speech") or []
    if not 0 <= clip < len(examples):
        raise InputError(f"no clip {clip} among the {len(examples)} kept clips of this result")
    return SpeechView(speech_html(examples[clip]))
