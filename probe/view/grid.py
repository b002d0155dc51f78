"""The layer x head grid for notebooks: a pandas Styler (labels in the report's colours, or one
statistic as a colour gradient)."""

from __future__ import annotations

from ..errors import InputError
from ..report.page import LABEL_COLORS, label_family
from ..sites import SITE_PREFIX, site_prefix


def label_grid(source, value: str = "label"):
    """The layer x head grid of one column of the heads table, coloured.

    Args:
        source: an analysis result (``.heads``) or a heads DataFrame (``layer``, ``head``, ...).
        value: ``"label"`` (primary labels, coloured as in the report) or a numeric column such
            as ``"prev"`` (a viridis gradient, 3 decimals).

    Returns:
        A ``pandas.io.formats.style.Styler`` (rows: layers, columns: heads); ``.data`` is the
        plain DataFrame. An encoder-decoder model's table (``stack`` and ``kind`` columns) gets
        one row per site, (site, layer) with site ``enc`` / ``dec`` / ``cross``: each head is
        keyed by its own site, never by (layer, head) alone.

    Raises:
        InputError: ``value`` is not a column of the heads table.
    """
    heads = source.heads if hasattr(source, "heads") else source
    if value not in heads.columns:
        raise InputError(f"no column {value!r} in the heads table; columns: {', '.join(map(str, heads.columns))}")
    if "stack" in heads.columns:
        order = {prefix: i for i, prefix in enumerate(SITE_PREFIX.values())}
        heads = heads.assign(site=[site_prefix(s, k) for s, k in zip(heads["stack"], heads["kind"])])
        grid = heads.pivot(index=["site", "layer"], columns="head", values=value)
        grid = grid.sort_index(key=lambda ix: ix.map(order) if ix.name == "site" else ix)
    else:
        grid = heads.pivot(index="layer", columns="head", values=value)
        grid.index.name = "layer"
    grid.columns.name = "head"
    if value == "label":
        return grid.style.map(
            lambda v: f"background-color: {LABEL_COLORS.get(label_family(str(v)), '#ffffff')}; font-size: 11px")
    grid = grid.astype(float)
    return grid.style.background_gradient(cmap="viridis", axis=None).format("{:.3f}", na_rep="")
