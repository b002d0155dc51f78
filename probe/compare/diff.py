"""Two runs head by head: per-head differences of every statistic, label changes, removed heads.

Alignment (stated in every comparison's notes):

- Layers: runs of equal depth compare layer i with layer i. Otherwise by relative depth: layer i
  of A (L_A layers) is compared with layer round(i * (L_B - 1) / (L_A - 1)) of B (rounded half up;
  a one-layer A is matched to B's layer 0). Rows follow A's layers: when B is deeper, some of B's
  layers are not compared; when A is deeper, a layer of B is compared with several of A's.
- Heads: by index within the matched layers (head h of A with head h of B). Heads of two
  different models have no natural correspondence; per-layer means (:func:`layer_summary`) and
  label counts are the meaningful comparison there. A head index only one model has is
  ``only in A`` / ``only in B``.
- Encoder-decoder runs: each head is matched within its own site kind (stack, kind): encoder
  self-attention with encoder self-attention, cross-attention with cross-attention, the layers of
  each kind aligned as above; rows then start with ``stack`` and ``kind``. A run of an
  encoder-decoder model and one of a one-stack model are not compared (their sites differ).
- Removed heads (a physically pruned model, :mod:`probe.pruning`): a head whose heads.csv row is
  missing, or whose label is ``removed``, is removed; its statistics are not compared (NaN).

Columns of :func:`compare_runs`: ``layer``, ``head``, ``layer_b``, ``status`` (``both``,
``removed in A``, ``removed in B``, ``removed in both``, ``only in A``, ``only in B``),
``label_a``, ``label_b``, ``label_changed``, ``change`` (the mean |difference| over the
statistics in probability units: all of :data:`probe.measures.stats.STATISTICS` but ``entropy`` (nats)
and ``distance`` (tokens)), then ``delta_<statistic>`` = B - A for each compared statistic, then
``<statistic>_a`` and ``<statistic>_b``. Compared statistics: those of STATISTICS both runs have,
then every other numeric column both heads tables have (importance, coreference accuracy ...),
except :data:`NOT_COMPARED`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import InputError
from ..measures.stats import STATISTICS
from ..sites import SITE_PREFIX
from ..util import plural
from .runs import load_run

#: heads.csv columns that are identifiers, arbitrary ids or settings (a head's sliding window), never differenced.
NOT_COMPARED = {"layer", "head", "layer_b", "cluster", "group", "stack", "kind", "window"}  # window: a setting

#: The label of a physically removed head (probe.pruning writes it into heads.csv).
REMOVED = "removed"

#: Statistics not in probability units, left out of ``change``.
NOT_PROBABILITY = {"entropy", "distance"}


def as_result(run):
    """An analysis result as given, or a run folder read with :func:`probe.compare.load_run`."""
    return load_run(run) if isinstance(run, (str, Path)) else run


def align_layers(n_a: int, n_b: int) -> list[int]:
    """The layer of B compared with each layer of A: round(i * (n_b - 1) / (n_a - 1)), half up.

    >>> align_layers(6, 30)
    [0, 6, 12, 17, 23, 29]
    """
    if n_a < 1 or n_b < 1:
        raise ValueError("both runs need at least one layer")
    if n_a == 1:
        return [0]
    return [int(math.floor(i * (n_b - 1) / (n_a - 1) + 0.5)) for i in range(n_a)]


def geometry(result) -> tuple[int, int]:
    """(layers, heads per layer) of a run: from its model record, else from its heads table."""
    heads = result.heads
    layers = int(result.model.get("layers") or (heads["layer"].max() + 1))
    n_heads = int(result.model.get("heads") or (heads["head"].max() + 1))
    return layers, n_heads


def compared_columns(heads_a: pd.DataFrame, heads_b: pd.DataFrame) -> list[str]:
    """Statistics both tables have (STATISTICS order first), then their other shared numeric columns."""
    shared = [c for c in heads_a.columns if c in heads_b.columns and c not in NOT_COMPARED]
    types = pd.api.types
    numeric = [c for c in shared if types.is_numeric_dtype(heads_a[c]) and types.is_numeric_dtype(heads_b[c])
               and not types.is_bool_dtype(heads_a[c])]
    return [s for s in STATISTICS if s in numeric] + [c for c in numeric if c not in STATISTICS]


def compare_runs(a, b) -> pd.DataFrame:
    """Compare two runs head by head (B - A).

    Args:
        a, b: analysis results (:class:`probe.records.AnalysisResult`) or run folders
            (read with :func:`probe.compare.load_run`).

    Returns:
        One row per (layer of A, head index), columns as in the module docstring; ``.attrs``
        holds ``layer_map`` (B's layer per A layer), ``statistics`` (compared columns), ``notes``
        (alignment and what is not comparable) and ``names`` (A's and B's model names). Two runs
        of encoder-decoder models are compared site kind by site kind: the rows start with
        ``stack`` and ``kind``, each head is matched within its own (stack, kind), and
        ``layer_map`` holds one map per site kind (``{"encoder.self": [...], ...}``).

    Raises:
        InputError: a folder that is not a run folder, or one run of an encoder-decoder model and
            the other of a one-stack model (their sites do not correspond).
    """
    a, b = as_result(a), as_result(b)
    seq2seq = ["stack" in run.heads for run in (a, b)]
    if seq2seq[0] != seq2seq[1]:
        which = a if seq2seq[0] else b
        raise InputError(f"{which.model.get('name', 'a run')} is an encoder-decoder model and the other run's model "
                         "is not: their attention sites do not correspond; compare runs of the same kind of model")
    cols = compared_columns(a.heads, b.heads)
    if not seq2seq[0]:
        (la, ha), (lb, hb) = geometry(a), geometry(b)
        df = _compare_heads(a.heads, b.heads, la, ha, lb, hb, cols)
        layer_map, notes = align_layers(la, lb), alignment_notes(a, b, la, ha, lb, hb)
    else:
        frames, layer_map, notes = [], {}, []
        for stack, kind in site_kinds(a.heads):
            sa, sb = (r.heads[(r.heads["stack"] == stack) & (r.heads["kind"] == kind)] for r in (a, b))
            if sb.empty:
                raise InputError(f"run B has no {stack} {kind}-attention heads to compare with run A's")
            (la, ha), (lb, hb) = ((int(x["layer"].max()) + 1, geometry(r)[1]) for x, r in ((sa, a), (sb, b)))
            part = _compare_heads(sa, sb, la, ha, lb, hb, cols)
            part.insert(0, "kind", kind)
            part.insert(0, "stack", stack)
            frames.append(part)
            layer_map[f"{stack}.{kind}"] = align_layers(la, lb)
            notes += [f"{stack} {kind}-attention: {n}" for n in alignment_notes(a, b, la, ha, lb, hb)
                      if not n.startswith(("A and B are different", "one run is"))]
        df = pd.concat(frames, ignore_index=True)
        notes += [n for n in alignment_notes(a, b, 1, 1, 1, 1)]
    df.attrs.update({"layer_map": layer_map, "statistics": cols, "notes": notes + input_notes(a, b),
                     "names": [a.model.get("name", "A"), b.model.get("name", "B")]})
    return df


def site_kinds(heads) -> list[tuple[str, str]]:
    """(stack, kind) of an encoder-decoder model's heads table, in site order (encoder self,
    decoder self, cross)."""
    present = set(zip(heads["stack"], heads["kind"]))
    return [sk for sk in SITE_PREFIX if sk in present]


def _compare_heads(heads_a, heads_b, la: int, ha: int, lb: int, hb: int, cols: list[str]) -> pd.DataFrame:
    """The rows of :func:`compare_runs` for one kind of site (its heads tables, depths and widths)."""
    layer_map = align_layers(la, lb)
    width = max(ha, hb)
    grid = pd.DataFrame([(i, layer_map[i], h) for i in range(la) for h in range(width)],
                        columns=["layer", "layer_b", "head"])
    side_a = heads_a[["layer", "head", "label", *cols]].rename(
        columns={"label": "label_a", **{c: f"{c}_a" for c in cols}})
    side_b = heads_b[["layer", "head", "label", *cols]].rename(
        columns={"layer": "layer_b", "label": "label_b", **{c: f"{c}_b" for c in cols}})
    df = grid.merge(side_a, on=["layer", "head"], how="left").merge(side_b, on=["layer_b", "head"], how="left")
    in_a, in_b = df["head"] < ha, df["head"] < hb
    gone_a = in_a & (df["label_a"].isna() | (df["label_a"] == REMOVED))
    gone_b = in_b & (df["label_b"].isna() | (df["label_b"] == REMOVED))
    status = np.select([~in_b, ~in_a, gone_a & gone_b, gone_a, gone_b],
                       ["only in A", "only in B", "removed in both", "removed in A", "removed in B"], "both")
    df["status"] = status
    df["label_a"] = np.where(gone_a, REMOVED, df["label_a"].fillna(""))
    df["label_b"] = np.where(gone_b, REMOVED, df["label_b"].fillna(""))
    both = df["status"] == "both"
    df["label_changed"] = both & (df["label_a"] != df["label_b"])
    for c in cols:
        df.loc[~both, [f"{c}_a", f"{c}_b"]] = np.nan
        df[f"delta_{c}"] = df[f"{c}_b"] - df[f"{c}_a"]
    prob = [f"delta_{c}" for c in cols if c in STATISTICS and c not in NOT_PROBABILITY]
    df["change"] = df[prob].abs().mean(axis=1, skipna=True) if prob else np.nan
    order = ["layer", "head", "layer_b", "status", "label_a", "label_b", "label_changed", "change"]
    return df[order + [f"delta_{c}" for c in cols] + [f"{c}_{s}" for c in cols for s in "ab"]]


def alignment_notes(a, b, la: int, ha: int, lb: int, hb: int) -> list[str]:
    """What the alignment did, in sentences for the report."""
    notes = []
    if la != lb:
        pairs = "; ".join(f"{i}->{j}" for i, j in enumerate(align_layers(la, lb)))
        unused = lb - len(set(align_layers(la, lb)))
        notes.append(f"A has {la} layers and B {lb}: layers are aligned by relative depth, layer i of A compared "
                     f"with layer round(i * {lb - 1} / {max(la - 1, 1)}) of B ({pairs})"
                     + (f"; {unused} of B's layers are not compared" if unused else ""))
    if ha != hb:
        notes.append(f"A has {ha} heads per layer and B {hb}: heads are compared by index, and heads of different "
                     "models have no natural correspondence; read the per-layer means and label counts")
    elif not same_model(a, b):
        notes.append("A and B are different models: heads are compared by index within each layer")
    if a.model.get("causal") != b.model.get("causal"):
        notes.append("one run is an encoder and the other a decoder: next-token and [SEP] statistics exist "
                     "only for one of them, and a decoder's rows see fewer keys")
    return notes


#: The entries of a run's ``model`` record that must agree for two runs to be of one model.
MODEL_IDENTITY = ("name", "source", "parameters", "removed_heads", "dtype")


def same_model(a, b) -> bool:
    """Whether runs ``a`` and ``b`` measured one model: the same name, source, parameter count,
    removed heads and dtype in their ``model`` records (an entry neither record has is not compared)."""
    return all(a.model.get(k) == b.model.get(k) for k in MODEL_IDENTITY)


def _input_of(run) -> str:
    c = run.counts
    where = run.settings.get("input")
    return ((f"{where}, " if where else "") + plural(c.get("sequences", 0), "sequence")
            + (f" ({run.examples[0].text[:40]!r} ...)" if run.examples else ""))


def input_notes(a, b) -> list[str]:
    """A note when the runs analysed different text: another input (``settings["input"]``: the
    corpus file, ``--text``, the built-in sample), another number of sequences, or another first
    text. Of two models, differences then mix the models with their input; of one model
    (:func:`same_model`), they are the text's alone."""
    ia, ib = a.settings.get("input"), b.settings.get("input")
    na, nb = a.counts.get("sequences"), b.counts.get("sequences")
    ta = a.examples[0].text if a.examples else None
    tb = b.examples[0].text if b.examples else None
    if (ia and ib and ia != ib) or (na is not None and nb is not None and na != nb) or (ta and tb and ta != tb):
        inputs = f"the runs analysed different text (A: {_input_of(a)}; B: {_input_of(b)})"
        if same_model(a, b):
            return [f"{inputs} with the same model ({a.model.get('name')}): every difference is the text's, not the "
                    "model's (how its heads behave on the one text and on the other)"]
        return [f"{inputs}: each difference mixes the models with their input; for a comparison of heads, analyse "
                "the same corpus with both"]
    return []


def layer_summary(a, b, df: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per aligned layer: each run's mean of every compared statistic over its own present heads,
    and the difference (B - A). Columns ``layer``, ``layer_b``, then ``<stat>_a``, ``<stat>_b``,
    ``delta_<stat>`` (encoder-decoder runs: ``stack`` and ``kind`` first, one block per site kind)."""
    a, b = as_result(a), as_result(b)
    df = compare_runs(a, b) if df is None else df
    cols = df.attrs["statistics"]

    def means(heads):
        keep = heads[heads["label"] != REMOVED] if "label" in heads else heads
        return keep.groupby("layer")[cols].mean()

    maps = df.attrs["layer_map"]
    groups = [(None, a.heads, b.heads, maps)] if not isinstance(maps, dict) else [
        (key, *(r.heads[(r.heads["stack"] == key.split(".")[0]) & (r.heads["kind"] == key.split(".")[1])]
                for r in (a, b)), m) for key, m in maps.items()]
    rows = []
    for key, heads_a, heads_b, layer_map in groups:
        ma, mb = means(heads_a), means(heads_b)
        for i, j in enumerate(layer_map):
            row = {} if key is None else dict(zip(("stack", "kind"), key.split(".")))
            row.update({"layer": i, "layer_b": j})
            for c in cols:
                va = ma[c].get(i, np.nan) if c in ma else np.nan
                vb = mb[c].get(j, np.nan) if c in mb else np.nan
                row.update({f"{c}_a": va, f"{c}_b": vb, f"delta_{c}": vb - va})
            rows.append(row)
    return pd.DataFrame(rows)


def most_changed(df: pd.DataFrame, k: int = 4) -> pd.DataFrame:
    """The k heads present in both runs with the largest ``change`` (ties: lower layer, head first)."""
    both = df[(df["status"] == "both") & df["change"].notna()]
    return both.sort_values(["change", "layer", "head"], ascending=[False, True, True], kind="stable").head(k)


def label_counts(a, b) -> pd.DataFrame:
    """Primary labels: number of heads in A and in B, each from its own whole heads table."""
    a, b = as_result(a), as_result(b)
    out = pd.concat([a.heads["label"].value_counts().rename("A"), b.heads["label"].value_counts().rename("B")],
                    axis=1).fillna(0).astype(int)
    out.index.name = "label"
    return out.sort_index().reset_index()
