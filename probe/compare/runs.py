"""Reading a run folder back: ``heads.csv`` + ``run.json`` (+ ``examples.npz``) -> AnalysisResult.

A run folder (``probe analyze``) holds what is needed to compare it with another run and to show
its first example again: the per-head table, the run's record, and the example maps as kept by
the analysis (``examples.npz``: float16 probabilities, [sites, heads, n, n] per example, n <= the
crop, with token ids, offsets, word ids and readable labels). What a folder cannot give back:
the raw running sums and counts (``stats`` is None, so a loaded run cannot be merged with
another), the results of extra accumulators beyond their heads.csv columns, and example maps
more precise than float16 (about 3 significant digits) or beyond the crop.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..accumulators import Example
from ..errors import InputError

#: The example maps file of a run folder.
EXAMPLES_FILE = "examples.npz"


def examples_bytes(examples, labels: list[list[str]]) -> bytes:
    """``examples.npz`` for a run folder: each example's maps as float16 and its tokens.

    Args:
        examples: :class:`probe.accumulators.Example` objects (maps as kept: cropped).
        labels: per example, readable token labels (:func:`probe.tokens.display_tokens`).
    """
    meta = [{"index": ex.index, "text": ex.text, "ids": list(map(int, ex.ids)),
             "offsets": [list(map(int, o)) for o in ex.offsets], "special": list(map(bool, ex.special)),
             "truncated": bool(ex.truncated), "word_ids": None if ex.word_ids is None else list(map(int, ex.word_ids)),
             "labels": list(lab)} for ex, lab in zip(examples, labels)]
    arrays = {f"probs_{i}": ex.probs.astype(np.float16) for i, ex in enumerate(examples)}
    buf = io.BytesIO()
    np.savez_compressed(buf, meta=np.array(json.dumps(meta)), **arrays)
    return buf.getvalue()


def read_examples(path: str | Path) -> list[Example]:
    """The examples of an ``examples.npz`` (probabilities back as float32).

    Raises:
        InputError: the file is not a probe examples file.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            return [Example(m["index"], m["text"], m["ids"], [tuple(o) for o in m["offsets"]], m["special"],
                            z[f"probs_{i}"].astype(np.float32), m["truncated"], m["word_ids"], m["labels"])
                    for i, m in enumerate(meta)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"cannot read the example maps {path}: {exc}") from None


def load_run(folder: str | Path):
    """Read a run folder back into the :class:`probe.analysis.AnalysisResult` the analysis returned.

    Args:
        folder: a folder written by ``probe analyze`` / :func:`probe.report.write_run`.

    Returns:
        An ``AnalysisResult`` with ``heads`` (heads.csv as written: statistics to 6 significant
        digits), ``model``, ``settings``, ``thresholds``, ``counts``, ``timings``, ``notes`` from
        run.json, ``examples`` from examples.npz (empty for folders written before it existed, with
        a note), ``stats`` None (the raw sums are not stored) and ``results`` {}.
        ``settings["run_folder"]`` is the folder.

    Raises:
        InputError: no such folder, no readable heads.csv / run.json in it, or a heads.csv that
            does not hold the heads run.json records (:func:`check_heads`).
    """
    from ..analysis import AnalysisResult

    path = Path(folder)
    if not path.is_dir():
        raise InputError(f"no run folder {folder}")
    for name in ("heads.csv", "run.json"):
        if not (path / name).is_file():
            raise InputError(f"{folder} is not a probe run folder: no {name}")
    try:
        record = json.loads((path / "run.json").read_text(encoding="utf-8"))
        heads = pd.read_csv(path / "heads.csv", keep_default_na=True)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the run folder {folder}: {exc}") from None
    if not isinstance(record, dict) or "model" not in record or not {"layer", "head"} <= set(heads.columns):
        raise InputError(f"{folder} is not a probe run folder: run.json has no model or heads.csv no layer/head")
    check_heads(heads, record["model"], folder)
    thresholds = {label: (t["threshold"] if isinstance(t, dict) else t)
                  for label, t in (record.get("thresholds") or {}).items()}
    notes = list(record.get("notes") or [])
    examples = []
    if (path / EXAMPLES_FILE).is_file():
        examples = read_examples(path / EXAMPLES_FILE)
    else:
        notes.append(f"{folder} has no {EXAMPLES_FILE}: its example maps are not available")
    settings = dict(record.get("settings") or {})
    settings["run_folder"] = str(path)
    return AnalysisResult(model=record["model"], heads=heads, stats=None, thresholds=thresholds,
                          counts=dict(record.get("counts") or {}), examples=examples, settings=settings,
                          timings=dict(record.get("timings_s") or {}), notes=notes, results={})


#: Site kinds of an encoder-decoder model's heads.csv: (stack, kind), with their display prefixes.
SITE_KINDS = {("encoder", "self"): "enc ", ("decoder", "self"): "dec ", ("decoder", "cross"): "cross "}


def _expected_heads(model: dict) -> dict[tuple, str]:
    """Every head run.json's model record describes: key (layer, head), or (stack, kind, layer,
    head) for an encoder-decoder model, -> its display name (``L4H5``, ``cross L4H5``)."""
    n_heads = int(model["heads"])
    if model.get("encoder_decoder"):
        stacks = model.get("stacks") or {}
        return {(stack, kind, layer, h): f"{prefix}L{layer}H{h}" for (stack, kind), prefix in SITE_KINDS.items()
                for layer in range(int(stacks.get(stack, 0))) for h in range(n_heads)}
    return {(layer, h): f"L{layer}H{h}" for layer in range(int(model["layers"])) for h in range(n_heads)}


def check_heads(heads: pd.DataFrame, model: dict, folder) -> None:
    """Check that heads.csv holds exactly the heads run.json records: one row per head of every
    layer (and site kind), no other, and as many marked removed as run.json says were removed.

    Raises:
        InputError: one line saying what is wrong (rows missing, duplicated, outside the model,
            or a removed count that differs), and that heads.csv is incomplete or damaged.
    """
    damaged = f"heads.csv of {folder} does not match its run.json"
    try:
        expected = _expected_heads(model)
        keys = ["stack", "kind", "layer", "head"] if model.get("encoder_decoder") else ["layer", "head"]
        ints = heads[["layer", "head"]].astype("int64")
        rows = list(zip(*([heads[k].astype(str) for k in keys[:-2]] + [ints["layer"], ints["head"]])))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{damaged}: unreadable layer/head/site columns ({exc}); the file is incomplete or "
                         "damaged") from None
    rows = [tuple(str(v) if isinstance(v, str) else int(v) for v in r) for r in rows]
    what = (f"{model.get('layers')} layers x {model.get('heads')} heads" if not model.get("encoder_decoder") else
            f"{len(expected)} heads")
    extra = [r for r in rows if r not in expected]
    if extra:
        name = " ".join(map(str, extra[0][:-2])) + f" L{extra[0][-2]}H{extra[0][-1]}"
        raise InputError(f"{damaged}: it has a row for {name.strip()}, outside the model's {what}; the file is damaged")
    seen: set = set()
    twice = next((r for r in rows if r in seen or seen.add(r)), None)
    if twice is not None:
        raise InputError(f"{damaged}: {expected[twice]} has two rows; the file is damaged")
    missing = [name for key, name in expected.items() if key not in seen]
    if missing:
        raise InputError(f"{damaged}: {len(rows)} of the {len(expected)} heads run.json records ({what}); missing "
                         f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}: the file is incomplete or "
                         "damaged")
    removed = int((heads["label"] == "removed").sum()) if "label" in heads else 0
    if "removed_heads" in model and removed != int(model["removed_heads"]):
        raise InputError(f"{damaged}: {removed} heads are marked removed, run.json records {model['removed_heads']}; "
                         "the file is damaged")
