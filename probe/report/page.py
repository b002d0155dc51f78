"""The pieces every report page shares (the run report, the comparison, the sections, the head
view): label colours and families, the run folder, the template environment, static files, the
Content-Security-Policy, script-safe JSON and the heads chosen for drawing.

Low in the import graph: the section builders (:mod:`probe.report.sections`) import it, and
:mod:`probe.report` re-exports it.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
from jinja2 import Environment, PackageLoader, select_autoescape

from ..measures.classify import LABEL_RULES, MIXED, REMOVED
from ..records import AnalysisResult
from ..runfolder import claim, claim_new
from ..sites import head_name
from ..util import fixed, plural

#: Colors of the primary labels in the layer x head grid (colour-blind-safe Okabe-Ito palette + greys).
LABEL_COLORS = {
    "previous-token": "#E69F00", "next-token": "#56B4E9", "self": "#009E73", "first-token": "#0072B2",
    "sep": "#D55E00", "punctuation": "#CC79A7", "broad": "#F0E442", "long-range": "#999999",
    "coreference": "#882255", "syntactic": "#44AA99", "induction": "#AA4499", "duplicate-token": "#BBCC33",
    MIXED: "#FFFFFF", REMOVED: "#BDBDBD",
}

def contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two ``#rrggbb`` colours, (L1 + 0.05) / (L2 + 0.05) with L the relative
    luminance (1: the same; 21: black on white; 4.5 is the minimum for small text, WCAG 2.1 SC 1.4.3)."""
    def luminance(c: str) -> float:
        c = c.lstrip("#")
        c = "".join(ch * 2 for ch in c) if len(c) == 3 else c
        rgb = [int(c[i:i + 2], 16) / 255 for i in (0, 2, 4)]
        r, g, b = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in rgb]
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def ink(background: str) -> str:
    """Black or white, whichever reads better on ``background`` (``#rrggbb``): the text colour of a cell."""
    return max(("#000000", "#ffffff"), key=lambda c: contrast(c, background))


#: Labels given by optional analyses (and to heads removed by pruning): shown in the legend only
#: when a head has one.
OPTIONAL_LABELS = ("coreference", "syntactic", REMOVED)

#: Short texts of the primary labels inside the grid cells.
LABEL_SHORT = {
    "previous-token": "prev", "next-token": "next", "self": "self", "first-token": "1st", "sep": "sep",
    "punctuation": "punc", "broad": "brd", "long-range": "long", "coreference": "coref", "syntactic": "syn",
    "induction": "ind", "duplicate-token": "dup",
    MIXED: "", REMOVED: "\u00d7",
}


def label_family(label: str) -> str:
    """The colour key of a label: ``"syntactic:nsubj"`` -> ``"syntactic"``."""
    return label.split(":", 1)[0]


def label_short(label: str) -> str:
    """A primary label's text inside a grid cell (:data:`LABEL_SHORT` of its family; "" for mixed)."""
    return LABEL_SHORT.get(label_family(label), label[:4])


def label_color(label: str) -> str:
    """A primary label's colour in the grids and maps (:data:`LABEL_COLORS` of its family; white if unknown)."""
    return LABEL_COLORS.get(label_family(label), "#ffffff")


def label_key(labels) -> list[tuple[str, str, list[str]]]:
    """The key of a label grid: for each cell text among ``labels`` (in :data:`LABEL_SHORT`'s order,
    then unknown families), ``(cell text, colour, the full labels it stands for, sorted)``."""
    present = sorted({str(lab) for lab in labels})
    order = {family: i for i, family in enumerate(LABEL_SHORT)}
    key: dict[str, tuple[str, list[str]]] = {}
    for lab in sorted(present, key=lambda x: (order.get(label_family(x), len(order)), x)):
        key.setdefault(label_short(lab), (label_color(lab), []))[1].append(lab)
    return [(short, color, full) for short, (color, full) in key.items()]


OUTPUT_FILES = ("index.html", "heads.csv", "run.json")

#: The page's Content-Security-Policy: nothing may be loaded; inline script and style only.
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


def default_run_dir(model_name: str, root: str | Path = "reports") -> Path:
    """A new folder ``root/<model>-<YYYYmmdd-HHMMSS>`` (suffixed -2, -3 ... if taken)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model_name).name or model_name).strip("-") or "model"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{slug}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def claim_run_dir(out: str | Path | None, model_name: str, force: bool = False, kind: str = "run"):
    """Claim the run folder ``out`` (default: a new ``reports/<model>-<timestamp>``) before the work
    starts, so that two runs never write one folder (:func:`probe.runfolder.claim`).

    Returns:
        A :class:`probe.runfolder.Claim` (``.path`` is the folder); release it (or use ``with``).

    Raises:
        InputError: ``out`` is a file, or not empty and ``force`` is False, or holds files probe
            did not write, or another probe run is writing it.
    """
    if out is None:
        return claim_new(default_run_dir(model_name), kind=kind)
    return claim(out, kind=kind, force=force)


def choose_heads(result: AnalysisResult, per_label: int = 1, limit: int = 8) -> list[tuple[int, int, str, str]]:
    """Heads to draw: the strongest head of each primary label (statistic / threshold), then the
    most focused ``mixed`` head. Returns (layer, head, label, reason) tuples.

    The strongest are the first rows of the label's heads sorted by the statistic, largest first, as
    ``DataFrame.sort_values(ascending=False)`` orders them (ties and NaN too: :func:`descending`)."""
    heads = result.heads
    if "stack" in heads:  # encoder-decoder: the examples' maps here are the encoder's (cross-attention has its section)
        heads = heads[(heads["stack"] == "encoder") & (heads["kind"] == "self")]
    labels = np.asarray(heads["label"], dtype=object)
    layers, numbers = np.asarray(heads["layer"]), np.asarray(heads["head"])
    chosen = []

    def strongest(label: str, stat: str, k: int) -> None:
        rows = np.flatnonzero(labels == label)
        if len(rows) == 0:
            return
        column = heads[stat]  # KeyError where the column is missing, as sort_values raised
        values = column.to_numpy()[rows]
        if values.dtype.kind in "fiu":
            order = descending(values)
        else:  # an extension dtype: pandas' own order of the label's rows
            order = np.asarray(column.iloc[rows].reset_index(drop=True).sort_values(ascending=False).index)
        for j in order[:k]:
            chosen.append((int(layers[rows[j]]), int(numbers[rows[j]]), label, f"{stat} = {values[j]:.2f}"))

    for label, (stat, _) in LABEL_RULES.items():
        strongest(label, stat, per_label)
    strongest(MIXED, "max_weight", 1)
    return chosen[:limit]


def descending(values: np.ndarray) -> np.ndarray:
    """The positions of ``values`` [n] in the order ``pandas.Series.sort_values(ascending=False)`` gives
    (pandas' ``nargsort``: the non-NaN values reversed, ``argsort(kind="quicksort")``, reversed back;
    NaN last in their order): the same order, ties included, without building a frame per sort."""
    values = np.asarray(values)
    idx = np.arange(len(values))
    nan = np.isnan(values) if values.dtype.kind == "f" else np.zeros(len(values), dtype=bool)
    kept, kept_idx = values[~nan][::-1], idx[~nan][::-1]
    return np.concatenate([kept_idx[kept.argsort(kind="quicksort")][::-1], idx[nan]])


#: The columns that together name a head in a heads table (``stack`` and ``kind`` only in an
#: encoder-decoder model's); an HTML table shows them as one ``head`` column, CSVs keep them apart.
HEAD_KEYS = ("stack", "kind", "layer", "head")


def named_rows(frame, fmt=str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of an HTML table of heads: the frame's ``stack``/``kind``/``layer``/``head``
    columns replaced by one ``head`` column first (:func:`probe.sites.head_name`: ``L4H5``,
    ``cross L4H5``), then its other columns in order, each value passed through ``fmt``.

    Args:
        frame: a DataFrame with ``layer`` and ``head`` columns (a heads table, one row per head).
        fmt: value -> cell text.
    """
    rest = [c for c in frame.columns if c not in HEAD_KEYS]
    rows = [[head_name(row, row["head"]), *(fmt(row[c]) for c in rest)] for row in frame.to_dict("records")]
    return ["head", *rest], rows


def json_for_script(data) -> str:
    """JSON safe inside a <script> element (no '<', '>' or '&' that could close it)."""
    text = json.dumps(data, separators=(",", ":"), default=json_default)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@lru_cache(maxsize=1)
def template_environment():
    """The Jinja environment of ``report/templates`` (autoescaped; filters and globals for heads and labels),
    built once."""
    env = Environment(loader=PackageLoader("probe", "report/templates"), autoescape=select_autoescape(["html", "j2"]))
    env.filters["plural"] = plural  # {{ n|plural("sequence") }} -> "1 sequence", "2 sequences"
    env.filters["fixed"] = fixed  # {{ x|fixed(3) }} -> "0.123"; -0.0001 -> "0.000"
    env.globals["head_name"] = head_name
    env.globals["label_short"] = label_short
    env.globals["label_color"] = label_color
    env.globals["label_key"] = label_key
    return env


@cache
def static_text(name: str) -> str:
    """A file of ``probe/report/static`` (inlined into pages)."""
    return resources.files("probe").joinpath(f"report/static/{name}").read_text(encoding="utf-8")


def json_default(obj):
    """``json.dumps``' fallback: NumPy integers and floats as numbers (NaN as null), arrays as lists, else ``str``."""
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return None if math.isnan(obj) else float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)
