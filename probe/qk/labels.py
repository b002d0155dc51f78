"""The head labels ``probe why`` shows beside its sources, computed once per model and cached.

A head's label describes what it does over a corpus (docs/statistics.md), not on one sentence: the
labels come from probe's analysis of its built-in sample texts (:func:`probe.text.corpus.sample_texts`;
on decoders with the repeated-random-token circuit probe, :func:`probe.patterns.circuit_probe`; an
encoder-decoder model reads each sample text as its own target), the same for every text ``why`` is
asked about. That analysis is what the why run folder's labelling part shows (heads.csv, the page's
"The run that labelled the heads"), so the labels beside the sources are the labels in heads.csv.

:func:`labelling` returns it, from (in order) a cache in memory keyed by the loaded model object (a weak
reference, so a model that goes away takes its entry with it) and the fingerprint of its weights, a
file under probe's cache folder (:func:`probe.loading.checkpoints.cache_dir`: ``$PROBE_CACHE``, else
``$XDG_CACHE_HOME/probe``, else ``~/.cache/probe``; ``labels/<model>-<key>.npz``), or the analysis run
now (then written to both). The key (:func:`cache_key`) covers the weights' fingerprint
(:func:`fingerprint`), the config, dtype and device type, the sample texts, the label rules
(:data:`probe.rules.LABEL_RULES`), the circuit probe's settings, :data:`VERSION` and the versions of
probe, torch and transformers: a model changed in place, another checkpoint or another library gets
another key. The file is written atomically (a temporary file renamed over it) and holds data only
(``numpy.load(allow_pickle=False)``: arrays plus one JSON string); a file that cannot be read back, or
holds another key, is ignored and written again.

What the file cannot hold (the raw running sums, ``stats``, which carry the tokenizer; results of
accumulators other than the sink profile and the circuit probe, e.g. a mixture-of-experts model's router
load) is left out: ``stats`` is None in every result :func:`labelling` returns, and a model whose
analysis holds another result is cached in memory only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import threading
import time
import weakref
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import __version__
from ..loading.checkpoints import cache_dir
from ..measures.accumulators import Example
from ..measures.sinks import SinkProfileResult
from ..patterns import CircuitProbe, circuit_probe
from ..patterns import circuits as circuit_settings
from ..records import AnalysisResult
from ..rules import LABEL_RULES
from ..runs.analysis import analyze
from ..sites import Site, head_name
from ..text.corpus import sample_texts
from ..text.sequence import Text

#: Raised when what the labelling rests on changes in a way the other parts of the key do not see (how the
#: analysis is called, the file's layout).
VERSION = 1
#: The cache's sub-folder of probe's cache folder.
FOLDER = "labels"
#: Parameter values read per tensor for :func:`fingerprint`.
SAMPLES = 64
#: The classes a cache file may rebuild (by name); nothing else is ever constructed from a file.
CLASSES = {cls.__name__: cls for cls in (Example, SinkProfileResult, circuit_settings.CircuitResult, Site)}

#: Non-numeric column types a cached table may hold.
TEXT_DTYPES = ("object", "str", "string")

_memory: dict[int, tuple] = {}  # id(lm) -> (weakref to lm, key, AnalysisResult)
_lock = threading.Lock()


class Unsupported(Exception):
    """A value the cache file cannot hold (the labelling then stays in memory only)."""


def fingerprint(lm) -> str:
    """A fingerprint of ``lm``'s weights: each parameter's name, shape and dtype and :data:`SAMPLES`
    values spread over it (hex SHA-256). Milliseconds on a 135M-parameter model; another checkpoint,
    dtype, a pruned head or weights changed in place give another fingerprint (a change that misses
    every sampled value does not: the sample is strided over the whole tensor)."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            h.update(f"{name}|{tuple(p.shape)}|{p.dtype}".encode())
            if p.device.type == "meta" or p.numel() == 0:
                continue
            flat = p.detach().reshape(-1)
            step = max(1, flat.numel() // SAMPLES)
            h.update(flat[::step][:SAMPLES].to("cpu", torch.float64).numpy().tobytes())
    return h.hexdigest()


def cache_key(lm) -> str:
    """The cache key of ``lm``'s labelling (hex SHA-256): :func:`fingerprint`, the model's class, config,
    dtype and device type, the sample texts, :data:`probe.rules.LABEL_RULES`, the circuit probe's
    settings (whether it runs, its tokens, batch and seed), :data:`VERSION` and the versions of probe,
    torch and transformers."""
    import transformers  # deferred: transformers takes ~1.5 s to import

    config = lm.model.config.to_json_string(use_diff=False) if hasattr(lm.model.config, "to_json_string") else ""
    p = next(lm.model.parameters())
    parts = {"version": VERSION, "probe": __version__, "torch": torch.__version__,
             "transformers": transformers.__version__, "class": type(lm.model).__name__, "kind": lm.kind,
             "config": hashlib.sha256(config.encode()).hexdigest(), "dtype": str(p.dtype), "device": p.device.type,
             "weights": fingerprint(lm), "texts": sample_texts(), "rules": LABEL_RULES,
             "circuit_probe": CircuitProbe.refusal(lm) is None,
             "circuit_settings": [circuit_settings.N_TOKENS, circuit_settings.BATCH, circuit_settings.SEED]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def cache_file(lm, key: str | None = None) -> Path:
    """The cache file of ``lm``'s labelling under probe's cache folder: ``labels/<model>-<key[:20]>.npz``
    (the model's name cut to letters, digits, ``-``, ``_`` and ``.``)."""
    key = cache_key(lm) if key is None else key
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(str(lm.name)).name)[:60] or "model"
    return cache_dir() / FOLDER / f"{name}-{key[:20]}.npz"


def labelling(lm, *, progress: bool = False) -> tuple[AnalysisResult, str]:
    """The labelling analysis of ``lm`` (see the module docstring) and where it came from.

    Args:
        lm: a loaded model (:class:`~probe.loading.models.LoadedModel`).
        progress: a progress bar where the analysis runs.

    Returns:
        ``(analysis, source)``: a fresh :class:`~probe.records.AnalysisResult` (its dicts, lists and
        heads table the caller's own; ``stats`` None; the example maps shared, read-only), ``source``
        ``"memory"``, ``"disk"`` or ``"computed"``.

    Raises:
        As :func:`probe.runs.analysis.analyze` on ``lm`` (an unreadable or unwritable cache file never
        raises: it is ignored, or the labelling stays in memory).
    """
    key = cache_key(lm)
    with _lock:
        entry = _memory.get(id(lm))
        if entry is not None and entry[0]() is lm and entry[1] == key:
            return _copy(entry[2]), "memory"
    path = cache_file(lm, key)
    found = read(path, key)
    source = "disk"
    if found is None:
        found, source = _analyze(lm, progress), "computed"
        write(path, key, found)
    _remember(lm, key, found)
    return _copy(found), source


def head_labels(lm, *, progress: bool = False) -> dict[str, str]:
    """Head name -> label of :func:`labelling` (``L3H5``; encoder-decoder models ``enc L0H1``, ``cross L1H2``)."""
    return label_map(labelling(lm, progress=progress)[0])


def label_map(analysis: AnalysisResult) -> dict[str, str]:
    """Head name -> primary label of an analysis' heads table ({} where it has no labels)."""
    heads = analysis.heads
    if "layer" not in heads.columns or "label" not in heads.columns:
        return {}
    if "stack" in heads.columns:  # encoder-decoder: the names carry the site kind (enc, dec, cross)
        return {head_name(r, int(r.head)): str(r.label) for r in heads.itertuples()}
    return {head_name(int(r.layer), int(r.head)): str(r.label) for r in heads.itertuples()}


def forget(lm=None) -> None:
    """Drop the in-memory entry of ``lm`` (every entry when None); the files stay."""
    with _lock:
        if lm is None:
            _memory.clear()
        else:
            _memory.pop(id(lm), None)


def _analyze(lm, progress: bool) -> AnalysisResult:
    texts: list = sample_texts()
    if lm.kind == "encoder-decoder":  # the analysis reads pairs: each text as its own target
        texts = [Text(t, target=t) for t in texts]
    t = time.perf_counter()
    analysis = analyze(lm, texts, progress=progress,  # labels, induction included on decoders
                       finished=[circuit_probe(lm)] if CircuitProbe.refusal(lm) is None else [])
    analysis.timings["analyze_s"] = round(time.perf_counter() - t, 4)  # the circuit probe's passes included
    return dataclasses.replace(analysis, stats=None)


def _remember(lm, key: str, analysis: AnalysisResult) -> None:
    ident = id(lm)

    def gone(_ref, ident=ident) -> None:
        with _lock:
            if ident in _memory and _memory[ident][0]() is None:
                del _memory[ident]

    with _lock:
        _memory[ident] = (weakref.ref(lm, gone), key, analysis)


def _copy(a: AnalysisResult) -> AnalysisResult:
    """``a`` with its own containers: a caller adds its results, notes and timings without touching the cache."""
    return dataclasses.replace(a, model=dict(a.model), heads=a.heads.copy(), thresholds=dict(a.thresholds),
                               counts=dict(a.counts), examples=list(a.examples), settings=dict(a.settings),
                               timings=dict(a.timings), notes=list(a.notes), results=dict(a.results))


# The file: np.savez (no pickle) of the arrays and one JSON string "meta" holding the rest, each value tagged.

def write(path: Path, key: str, analysis: AnalysisResult) -> bool:
    """Write ``analysis`` (without ``stats``) to ``path`` atomically; False (nothing written) where it
    holds a value the file cannot (:class:`Unsupported`) or the folder cannot be written."""
    arrays: dict[str, np.ndarray] = {}
    try:
        fields = {f.name: _encode(getattr(analysis, f.name), arrays)
                  for f in dataclasses.fields(AnalysisResult) if f.name != "stats"}
    except Unsupported:
        return False
    meta = json.dumps({"key": key, "version": VERSION, "fields": fields})
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                         delete=False) as f:
            tmp = Path(f.name)
            np.savez(f, meta=np.array(meta), **arrays)
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        return False


def read(path: Path, key: str) -> AnalysisResult | None:
    """The analysis :func:`write` wrote to ``path`` under ``key``; None where there is no such file, it
    cannot be read back (truncated, not a probe labels file, another layout) or holds another key."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("key") != key or meta.get("version") != VERSION:
                return None
            fields = {name: _decode(value, z) for name, value in meta["fields"].items()}
        return AnalysisResult(stats=None, **fields)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, EOFError, zipfile.BadZipFile):
        return None


def _encode(value, arrays: dict):
    """A JSON-ready, tagged form of ``value``; arrays go into ``arrays`` (referred to by name)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise Unsupported("an object array")
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {"array": name}
    if isinstance(value, (list, tuple)):
        return {"tuple" if isinstance(value, tuple) else "list": [_encode(v, arrays) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode(k, arrays), _encode(v, arrays)] for k, v in value.items()]}
    if isinstance(value, pd.DataFrame):
        return {"frame": _frame(value, arrays)}
    if dataclasses.is_dataclass(value) and CLASSES.get(type(value).__name__) is type(value):
        if not all(f.init for f in dataclasses.fields(value)):
            raise Unsupported(type(value).__name__)
        return {"class": type(value).__name__,
                "fields": {f.name: _encode(getattr(value, f.name), arrays) for f in dataclasses.fields(value)}}
    raise Unsupported(type(value).__name__)


def _frame(df: pd.DataFrame, arrays: dict) -> dict:
    if not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 or df.index.step != 1:
        raise Unsupported("a frame with its own index")
    if not all(isinstance(c, str) for c in df.columns) or df.columns.duplicated().any():
        raise Unsupported("a frame's column names")
    columns = []
    for c in df.columns:
        s = df[c]
        if isinstance(s.dtype, np.dtype) and s.dtype.kind in "biuf":
            columns.append([c, _encode(s.to_numpy(), arrays)])
        elif str(s.dtype) in TEXT_DTYPES:  # pandas 3 reads text as "str", older pandas as "object"
            columns.append([c, {"values": [_encode(v, arrays) for v in s.tolist()], "dtype": str(s.dtype)}])
        else:
            raise Unsupported(f"a {s.dtype} column")
    return {"rows": len(df), "columns": columns, "attrs": _encode(dict(df.attrs), arrays)}


def _text_dtype(name: str):
    if name not in TEXT_DTYPES:
        raise ValueError(f"not a text column type: {name!r}")
    return object if name == "object" else name


def _decode(value, z):
    if not isinstance(value, dict):
        return value
    if "array" in value:
        return z[value["array"]]
    if "list" in value:
        return [_decode(v, z) for v in value["list"]]
    if "tuple" in value:
        return tuple(_decode(v, z) for v in value["tuple"])
    if "dict" in value:
        return {_decode(k, z): _decode(v, z) for k, v in value["dict"]}
    if "frame" in value:
        f = value["frame"]
        data = {c: (pd.Series([_decode(v, z) for v in col["values"]], dtype=_text_dtype(col["dtype"]))
                    if "values" in col else _decode(col, z)) for c, col in f["columns"]}
        df = pd.DataFrame(data, index=pd.RangeIndex(f["rows"]), columns=[c for c, _ in f["columns"]])
        df.attrs.update(_decode(f["attrs"], z))
        return df
    if "class" in value:
        return CLASSES[value["class"]](**{k: _decode(v, z) for k, v in value["fields"].items()})
    raise ValueError(f"not a probe labels value: {sorted(value)}")


__all__ = ["VERSION", "cache_file", "cache_key", "fingerprint", "head_labels", "label_map", "labelling", "forget",
           "read", "write"]
