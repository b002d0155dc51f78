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
from ..analysis import AnalysisResult
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
        InputError: no such folder, or no readable heads.csv / run.json in it.
    """
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
