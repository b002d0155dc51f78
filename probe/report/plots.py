"""Figures for the report (matplotlib/seaborn, Agg backend), returned as inline PNG data URIs."""

from __future__ import annotations

import base64
import io
import math
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from ..stats import STATISTICS  # noqa: E402

#: Units shown in figure titles.
UNITS = {"entropy": "nats", "distance": "tokens"}


def to_data_uri(fig) -> str:
    """Render a figure to a base64 PNG data URI and close it.

    Glyphs missing from the installed fonts (e.g. CJK or emoji tokens) are drawn as boxes without
    a warning per glyph.
    """
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def statistic_heatmaps(heads: pd.DataFrame) -> list[dict]:
    """One layer x head heatmap per statistic, each its own small figure.

    (One figure per statistic: seaborn redraws the whole figure for every heatmap it adds, so a
    grid of subplots costs quadratic time.)

    Returns:
        [{"statistic", "title", "img" (PNG data URI) or None where the statistic is undefined for
        this model (e.g. ``next`` for a decoder)}], in :data:`probe.stats.STATISTICS` order.
    """
    n_layers = int(heads["layer"].max()) + 1
    n_heads = int(heads["head"].max()) + 1
    width = max(2.8, 0.26 * n_heads + 1.4)
    height = max(2.4, 0.13 * n_layers + 1.0)
    out = []
    for stat in STATISTICS:
        grid = heads.pivot(index="layer", columns="head", values=stat).to_numpy(dtype=float)
        title = f"{stat} ({UNITS[stat]})" if stat in UNITS else stat
        if np.isnan(grid).all():
            out.append({"statistic": stat, "title": title, "img": None})
            continue
        fig, ax = plt.subplots(figsize=(width, height))
        sns.heatmap(grid, ax=ax, cmap="viridis", vmin=0.0, vmax=None if stat in UNITS else 1.0, cbar=True,
                    xticklabels=max(1, n_heads // 6), yticklabels=max(1, n_layers // 10))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=10)
        out.append({"statistic": stat, "title": title, "img": to_data_uri(fig)})
    return out


def attention_heatmap(attn: np.ndarray, tokens: list[str], title: str) -> str:
    """Heatmap of one head's [T, T] attention probabilities with token labels (query rows, key columns)."""
    T = len(tokens)
    tokens = [t.replace("$", r"\$") for t in tokens]  # '$...$' would be parsed as mathtext
    size = min(9.0, max(6.0, 0.28 * T + 1.5))  # same font scale for short and long examples
    fig, ax = plt.subplots(figsize=(size + 0.8, size))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
        sns.heatmap(attn, ax=ax, cmap="Blues", vmin=0.0, vmax=1.0, square=True,
                    xticklabels=tokens, yticklabels=tokens, cbar_kws={"shrink": 0.6})
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.tick_params(axis="both", labelsize=7 if T > 30 else 8)
    ax.set_title(title, fontsize=10)
    return to_data_uri(fig)
