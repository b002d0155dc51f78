"""Attention laid over an image: a patch grid of weights as a heat colour blended into the pixels,
written as a PNG data URI (self-contained: the page fetches nothing)."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

#: Share of the heat colour in a fully hot pixel (the rest is the image).
ALPHA = 0.6


def heat_cells(heat: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[height, width] float in [0, 1]: ``heat`` [rows, columns] scaled by its maximum and spread
    over the pixels, each patch's value over its own cell (height / rows x width / columns pixels;
    no smoothing, so a value stays on its patch). All zeros (or NaN) stays zero."""
    heat = np.nan_to_num(np.asarray(heat, dtype=np.float64))
    top = heat.max() if heat.size else 0.0
    scaled = heat / top if top > 0 else np.zeros_like(heat)
    h, w = size
    rows = np.arange(h) * heat.shape[0] // h
    cols = np.arange(w) * heat.shape[1] // w
    return scaled[rows][:, cols]


def heat_colour(v: np.ndarray) -> np.ndarray:
    """[..., 3] float RGB in [0, 1] of values in [0, 1]: dark red through red and orange to yellow."""
    v = np.clip(v, 0.0, 1.0)
    return np.stack([np.clip(0.3 + 1.4 * v, 0, 1), np.clip(2.0 * v - 0.6, 0, 1), np.clip(3.0 * v - 2.4, 0, 1)], -1)


def overlay(pixels: np.ndarray, heat: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """[height, width, 3] uint8: the image with ``heat`` [rows, columns] blended over it, a pixel's
    heat share ``alpha * v`` (v its cell's value over the maximum), so cold patches show the image."""
    pixels = np.asarray(pixels, dtype=np.float64) / 255.0
    v = heat_cells(heat, pixels.shape[:2])[..., None]
    out = (1 - alpha * v) * pixels + alpha * v * heat_colour(v[..., 0])
    return np.round(np.clip(out, 0, 1) * 255).astype(np.uint8)


def png_data_uri(pixels: np.ndarray, width: int | None = None) -> str:
    """A ``data:image/png;base64,...`` URI of an RGB uint8 image ([height, width, 3]), scaled to
    ``width`` pixels wide (nearest neighbour, keeping the aspect) when given."""

    image = Image.fromarray(np.asarray(pixels, dtype=np.uint8), "RGB")
    if width is not None and width != image.size[0]:
        image = image.resize((width, max(1, round(image.size[1] * width / image.size[0]))), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
