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


def statistic_heatmaps(heads: pd.DataFrame) -> str:
    """One layer x head heatmap per statistic, in a grid (statistics undefined for the model are
    drawn blank with "n/a")."""
    n_layers = int(heads["layer"].max()) + 1
    n_heads = int(heads["head"].max()) + 1
    cols = 4
    rows = math.ceil(len(STATISTICS) / cols)
    cell_w = max(2.6, 0.28 * n_heads + 1.2)
    cell_h = max(2.2, 0.16 * n_layers + 1.0)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * cell_w, rows * cell_h), squeeze=False)
    for ax, stat in zip(axes.flat, STATISTICS):
        grid = heads.pivot(index="layer", columns="head", values=stat).to_numpy(dtype=float)
        title = f"{stat} ({UNITS[stat]})" if stat in UNITS else stat
        if np.isnan(grid).all():
            ax.text(0.5, 0.5, "n/a for this model", ha="center", va="center")
            ax.set_axis_off()
        else:
            vmax = None if stat in UNITS else 1.0
            sns.heatmap(grid, ax=ax, cmap="viridis", vmin=0.0, vmax=vmax, cbar=True,
                        xticklabels=max(1, n_heads // 6), yticklabels=max(1, n_layers // 10))
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
        ax.set_title(title, fontsize=10)
    for ax in list(axes.flat)[len(STATISTICS):]:
        ax.set_axis_off()
    fig.tight_layout()
    return to_data_uri(fig)


def attention_heatmap(attn: np.ndarray, tokens: list[str], title: str) -> str:
    """Heatmap of one head's [T, T] attention probabilities with token labels (query rows, key columns)."""
    T = len(tokens)
    size = min(9.0, max(3.5, 0.28 * T + 1.5))
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
