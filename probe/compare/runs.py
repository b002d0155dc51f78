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

from ..errors import InputError
from ..measures.accumulators import Example
from ..records import AnalysisResult
from ..sites import head_name

#: The example maps file of a run folder.
EXAMPLES_FILE = "examples.npz"


def examples_bytes(examples, labels: list[list[str]], target_labels: list[list[str] | None] | None = None) -> bytes:
    """``examples.npz`` for a run folder: each example's maps as float16 and its tokens.

    Args:
        examples: :class:`probe.measures.accumulators.Example` objects (maps as kept: cropped).
        labels: per example, readable token labels (:func:`probe.text.tokens.display_tokens`).
        target_labels: encoder-decoder models: per example, the target's token labels (the
            decoder start token first); the example's decoder maps are stored with them.
    """
    target_labels = target_labels or [None] * len(examples)
    meta, arrays = [], {}
    for i, (ex, lab, tlab) in enumerate(zip(examples, labels, target_labels)):
        m = {"index": ex.index, "text": ex.text, "ids": list(map(int, ex.ids)),
             "offsets": [list(map(int, o)) for o in ex.offsets], "special": list(map(bool, ex.special)),
             "truncated": bool(ex.truncated), "word_ids": None if ex.word_ids is None else list(map(int, ex.word_ids)),
             "labels": list(lab)}
        arrays[f"probs_{i}"] = ex.probs.astype(np.float16)
        if ex.decoder:
            t = ex.target
            m["target"] = {"text": t["text"], "ids": list(map(int, t["ids"])), "special": list(map(bool, t["special"])),
                           "offsets": [list(map(int, o)) for o in t["offsets"]],
                           "labels": None if tlab is None else list(tlab)}
            m["decoder"] = list(ex.decoder)
            for name, p in ex.decoder.items():
                arrays[f"decoder_{i}_{name}"] = np.asarray(p).astype(np.float16)
        meta.append(m)
    buf = io.BytesIO()
    np.savez_compressed(buf, meta=np.array(json.dumps(meta)), **arrays)
    return buf.getvalue()


def read_examples(path: str | Path) -> list[Example]:
    """The examples of an ``examples.npz`` (probabilities back as float32; an encoder-decoder
    model's examples with their target and decoder maps).

    Raises:
        InputError: the file is not a probe examples file.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            return [Example(m["index"], m["text"], m["ids"], [tuple(o) for o in m["offsets"]], m["special"],
                            z[f"probs_{i}"].astype(np.float32), m["truncated"], m["word_ids"], m["labels"],
                            target=m.get("target"),
                            decoder={name: z[f"decoder_{i}_{name}"].astype(np.float32) for name in m["decoder"]}
                            if m.get("decoder") else None)
                    for i, m in enumerate(meta)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"cannot read the example maps {path}: {exc}") from None


def load_run(folder: str | Path):
    """Read a run folder back into the :class:`probe.records.AnalysisResult` the analysis returned.

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


#: Site kinds of an encoder-decoder model's heads.csv: (stack, kind).
SITE_KINDS = (("encoder", "self"), ("decoder", "self"), ("decoder", "cross"))


def is_encoder_decoder(model: dict) -> bool:
    """Whether run.json's model record describes an encoder-decoder model (``kind``; runs written
    before the kind was recorded say ``encoder_decoder: true``)."""
    return model.get("kind") == "encoder-decoder" or bool(model.get("encoder_decoder"))


def _expected_heads(model: dict) -> dict[tuple, str]:
    """Every head run.json's model record describes: key (layer, head), or (stack, kind, layer,
    head) for an encoder-decoder model, -> its display name (``L4H5``, ``cross L4H5``)."""
    n_heads = int(model["heads"])
    if is_encoder_decoder(model):
        stacks = model.get("stacks") or {}
        return {(stack, kind, layer, h): head_name({"stack": stack, "kind": kind, "layer": layer}, h)
                for stack, kind in SITE_KINDS for layer in range(int(stacks.get(stack, 0))) for h in range(n_heads)}
    return {(layer, h): head_name(layer, h) for layer in range(int(model["layers"])) for h in range(n_heads)}


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
        keys = ["stack", "kind", "layer", "head"] if is_encoder_decoder(model) else ["layer", "head"]
        ints = heads[["layer", "head"]].astype("int64")
        rows = list(zip(*([heads[k].astype(str) for k in keys[:-2]] + [ints["layer"], ints["head"]])))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{damaged}: unreadable layer/head/site columns ({exc}); the file is incomplete or "
                         "damaged") from None
    rows = [tuple(str(v) if isinstance(v, str) else int(v) for v in r) for r in rows]
    what = (f"{model.get('layers')} layers x {model.get('heads')} heads" if not is_encoder_decoder(model) else
            f"{len(expected)} heads")
    extra = [r for r in rows if r not in expected]
    if extra:
        key = extra[0]
        try:
            name = head_name(dict(zip(("stack", "kind"), key[:-2]), layer=key[-2]), key[-1])
        except ValueError:  # a site kind the model does not have
            name = f"{'/'.join(map(str, key[:-2]))} {head_name(key[-2], key[-1])}"
        raise InputError(f"{damaged}: it has a row for {name}, outside the model's {what}; the file is damaged")
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
