"""How a checkpoint becomes a model for :func:`probe.loading.models.load_model`: the auto class (with a
task head if asked), GGUF files dequantized and cached as float32, model folders, and where the
weights are placed (device, device map). (A pruned model's folder is rebuilt by
:mod:`probe.pruning.saving`, which :mod:`probe.loading.models` calls: the loader knows nothing of pruning.)
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from ..architectures import SPECS, get_spec, kind_of
from ..architectures.speech import is_speech, is_waveform
from ..architectures.vision import is_vision
from ..bounds import DTYPES
from ..errors import InputError, ModelLoadError, ProbeError, UnsupportedArchitectureError
from ..runfolder import claim
from .pixels import processor_for
from .sound import speech_processor_for
from .waves import wave_processor_for

log = logging.getLogger("probe.loading.models")


def cache_dir() -> Path:
    """probe's cache folder: ``$PROBE_CACHE``, else ``$XDG_CACHE_HOME/probe``, else ``~/.cache/probe``."""
    if os.environ.get("PROBE_CACHE"):
        return Path(os.environ["PROBE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "probe"



#: Task heads ``load_model(head=...)`` can load an encoder with.
HEADS = ("mlm", "classification", "auto")


def model_class(config, head: str | None = None):
    """The auto class to build: decoders with their LM head; encoders bare, or with the head asked
    for (``"mlm"``, ``"classification"``; ``"auto"``: the head the checkpoint's ``architectures`` names)."""
    import transformers as tr  # deferred: transformers takes ~1.5 s to import

    archs = " ".join(getattr(config, "architectures", None) or [])
    if head == "auto":
        head = ("mlm" if "ForMaskedLM" in archs else "classification" if "ForSequenceClassification" in archs
                else None)
    if head == "classification":
        return tr.AutoModelForSequenceClassification
    if is_speech(config):  # reads log-mel frames: the speech sequence-to-sequence class
        return tr.AutoModelForSpeechSeq2Seq
    kind = kind_of(config)
    if kind == "encoder-decoder":
        return tr.AutoModelForSeq2SeqLM
    if kind == "decoder":
        return tr.AutoModelForCausalLM
    return tr.AutoModelForMaskedLM if head == "mlm" else tr.AutoModel


def require_supported(config) -> None:
    """Refuse, before any weight is read, a model type probe cannot measure: a hand-written spec's
    refusals (:func:`probe.architectures.get_spec`), or a type without one that transformers has no model
    class for. A type whose attention is its own code, outside transformers' ``AttentionInterface``, is read
    from the maps its eager path returns once it is loaded (:mod:`probe.capture.eager_maps`; one-stack and
    encoder-decoder models), or refused then, in one line.

    Raises:
        UnsupportedArchitectureError: one line saying what is missing.
    """
    import transformers as tr  # deferred: transformers takes ~1.5 s to import

    model_type = getattr(config, "model_type", None)
    if model_type in SPECS:
        get_spec(config)
        return
    try:
        cls = tr.AutoModel._model_mapping[type(config)]
    except (KeyError, ValueError):
        cls = None
    if cls is None:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type!r}: probe has no hand-written spec for it, and transformers has no "
            f"model class for it; hand-written types: {', '.join(sorted(SPECS))}")


def finish_tokenizer(tokenizer) -> None:
    """Right padding, and a pad token where the tokenizer has none (EOS, else UNK)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    tokenizer.padding_side = "right"


#: What the first use of a GGUF model costs per MB of the file, as measured on this project's 2-core
#: test machine with other work running: 11.5 s for SmolLM2-135M's 94 MB Q4_1 file (5.9 s reading
#: the header, 0.6 s the tokenizer, 4.3 s de-quantizing, 0.6 s saving 513 MB). It depends on the CPU,
#: the disk and what else runs: announced as an estimate with that caveat.
FIRST_USE_SECONDS_PER_MB = 0.15


def first_use_estimate(size_mb: float) -> int:
    """Seconds the first use of a GGUF file of ``size_mb`` MB is announced to take on 2 idle cores (to 5 s, >= 5)."""
    return max(5, 5 * round(FIRST_USE_SECONDS_PER_MB * size_mb / 5))


def busy_estimate(seconds: int, load: float | None = None, cores: int | None = None) -> str:
    """What a busy machine adds to an estimate made for idle cores ('' when it is not busy).

    A CPU-bound step shares the cores with the load: with a 1-minute load average L on C cores it
    gets about C / max(C, L + 1) of them, so it takes about ``seconds`` x (L + 1) / C (measured: the
    15 s first use of SmolLM2 took 62 s at load 11 on 2 cores, where this gives 90 s).

    Args:
        seconds: the idle estimate.
        load: the 1-minute load average (default: ``os.getloadavg()``; none where it is unknown).
        cores: CPU cores (default: ``os.cpu_count()``).
    """
    try:
        load = os.getloadavg()[0] if load is None else load
    except (AttributeError, OSError):  # Windows has no load average
        return ""
    cores = cores or os.cpu_count() or 1
    factor = (load + 1) / cores
    if factor < 1.5:
        return ""
    expected = 5 * round(seconds * factor / 5)
    return f"; this machine is busy (load {load:.1f} on {cores} cores): expect about {expected} s"


@contextmanager
def loading_step(what: str, index: int, steps: int):
    """Say on the log what a slow loading step does, then how long it took (so no step is silent): the CLI
    shows ``note:   2/3 WHAT ...`` and ``note:   2/3 WHAT: done in 4.1 s``."""
    log.warning("  %d/%d %s ...", index, steps, what)
    start = time.perf_counter()
    yield
    log.warning("  %d/%d %s: done in %.1f s", index, steps, what, time.perf_counter() - start)


@contextmanager
def _parse_once():
    """Inside: two repeated parses of transformers' GGUF loading done once each, restored on exit.

    * The header reader (``load_gguf_checkpoint`` without tensors) parses a file once and hands out
      copies: the config loader and the tokenizer loader (twice) each parse the whole header
      otherwise, several seconds apiece (the tokenizer's vocabulary and merges are in it).
    * transformers' de-quantizing bar shows only on a terminal (a redirected log gets the steps'
      lines, not its updates).
    * ``gguf.GGUFReader`` opens a file once (a read-only memory map; the tensor pass would parse the
      header again).
    * ``gguf.get_tensor_name_map(arch, layers)`` is built once per arguments: transformers builds it
      again for every sub-module while mapping tensor names (397 times for SmolLM2-135M, the
      silent stretch before the de-quantizing bar).

    Where transformers or gguf lacks these functions, nothing changes.
    """
    patched = []
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils  # deferred: transformers (seconds)
        original = gguf_utils.load_gguf_checkpoint
        read: dict = {}

        def once(path, return_tensors=False, **kw):
            if return_tensors or kw:
                return original(path, return_tensors=return_tensors, **kw)
            if str(path) not in read:
                read[str(path)] = original(path, return_tensors=False)
            return copy.deepcopy(read[str(path)])

        patched.append((gguf_utils, "load_gguf_checkpoint", original))
        gguf_utils.load_gguf_checkpoint = once
        # its de-quantizing bar only on a terminal (tqdm's disable=None): in a redirected log the steps'
        # lines say the same once, instead of ~70 bar updates
        patched.append((gguf_utils, "tqdm", gguf_utils.tqdm))
        gguf_utils.tqdm = functools.partial(gguf_utils.tqdm, disable=None)
        import gguf  # deferred: only while loading a GGUF file

        patched.append((gguf, "get_tensor_name_map", gguf.get_tensor_name_map))
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
        readers: dict = {}
        reader_class = gguf.GGUFReader

        def reader(path, mode="r"):  # read-only memory maps: one per file serves every read
            key = (str(path), mode)
            if key not in readers:
                readers[key] = reader_class(path, mode)
            return readers[key]

        patched.append((gguf, "GGUFReader", reader_class))
        gguf.GGUFReader = reader
    except (ImportError, AttributeError):
        pass
    try:
        yield
    finally:
        for module, name, original in reversed(patched):
            setattr(module, name, original)


def load_gguf(folder: Path, gguf_file: str, cached: Path | None, dtype):
    """Load a GGUF checkpoint (dequantized to floats); cache the result as float32 safetensors.

    The cache always holds float32 weights, whatever ``dtype`` was asked for, and is then loaded
    with ``dtype`` (``from_pretrained(dtype=...)`` keeps buffers such as RoPE's ``inv_freq`` in
    float32, which a later ``.to(dtype)`` would round).

    The first use logs (as notes on the CLI) an estimate from the file's size, then each step with
    its time: reading the header, building the tokenizer, de-quantizing the tensors (transformers'
    progress bar), saving the float32 copy. Repeated parses are done once (:func:`_parse_once`) and
    the model is built from the config already read.
    """
    from transformers import AutoConfig, AutoTokenizer  # deferred: transformers takes ~1.5 s to import

    if cached is not None and (cached / "config.json").exists():
        return load_folder(cached, dtype)
    size_mb = (folder / gguf_file).stat().st_size / 2**20 if (folder / gguf_file).exists() else 0.0
    steps = 4  # the same numbering with a cache folder or without (then step 4 says it is skipped)
    if cached is not None:
        estimate = first_use_estimate(size_mb)
        log.warning("first use of %s: de-quantizing its GGUF weights (%.0f MB) to float32 and caching them in %s; "
                    "a one-time step of about %d s on 2 CPU cores, longer on a busy or slower machine (it depends "
                    "on the CPU and the disk)%s; later runs load the cached copy in seconds",
                    gguf_file, size_mb, cached, estimate, busy_estimate(estimate))
    try:
        with _parse_once():
            with loading_step("reading the GGUF header (config and tokenizer vocabulary)", 1, steps):
                config = AutoConfig.from_pretrained(folder, gguf_file=gguf_file)
                require_supported(config)
            with loading_step("building the tokenizer", 2, steps):
                tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
            with loading_step("de-quantizing the tensors", 3, steps):
                model = model_class(config).from_pretrained(
                    folder, gguf_file=gguf_file, config=config, attn_implementation="eager",
                    trust_remote_code=False, dtype=torch.float32 if cached is not None else (dtype or torch.float32))
    except ProbeError:
        raise
    except ImportError as exc:
        raise ModelLoadError(f"loading a GGUF file needs the 'gguf' package: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds here
        raise ModelLoadError(f"cannot load GGUF file {folder / gguf_file}: {str(exc).splitlines()[0]}") from None
    if cached is None:
        log.warning("  4/4 saving the float32 copy: skipped (a .gguf file given by its path is not cached: it is "
                    "de-quantized on each load)")
        return model, tokenizer
    with loading_step(f"saving the float32 copy ({_megabytes(model):.0f} MB)", 4, steps):
        saved = _save_cache(model, tokenizer, cached)
    if not saved:
        return (model.to(dtype) if dtype not in (None, torch.float32) else model), tokenizer
    if dtype not in (None, torch.float32):
        return load_folder(cached, dtype)
    return model, tokenizer


def _megabytes(model: nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20


def _save_cache(model: nn.Module, tokenizer, cached: Path) -> bool:
    """Write the de-quantized model into ``cached``, claimed and staged (:mod:`probe.runfolder`: a
    cache folder is complete or absent, also on an interrupt). False, with a warning, when another
    process is caching it or it cannot be written."""
    # The weights are plain floats after dequantization; the quantizer record only blocks saving.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        with claim(cached, kind="cache", owned=True, what="cache folder") as folder, folder.staging() as tmp:
            try:
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
            except OSError as exc:
                raise InputError(f"cannot write {cached}: {exc.strerror or exc}") from None
    except InputError as exc:
        log.warning("could not cache the dequantized model: %s", exc)
        return False
    return True


#: How the weights are placed (see :func:`load_model`); set for one load by :func:`probe.loading.models.load_model`.
PLACEMENT: dict = {}


#: Parameter dtypes a model can be loaded in (``load_model(dtype=...)``, ``--dtype``).


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A parameter dtype from a torch dtype or its name (``"bfloat16"``); None stays None (the
    model's own: :func:`declared_dtype`).

    Raises:
        ModelLoadError: a dtype other than :data:`DTYPES`.
    """
    if dtype is None:
        return None
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise ModelLoadError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    return getattr(torch, name)


def declared_dtype(config) -> torch.dtype:
    """The parameter dtype a checkpoint's config declares (``dtype``, formerly ``torch_dtype``) when
    it is one of :data:`DTYPES`; float32 otherwise (none declared, ``"auto"``, float64 ...)."""
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(declared).replace("torch.", "") if declared is not None else None
    return getattr(torch, name) if name in DTYPES else torch.float32


def load_folder(source, dtype, head: str | None = None, **kw):
    """(model, tokenizer) from a folder or Hub id, eager attention, placed as :data:`PLACEMENT` says;
    in ``dtype``, or where it is None in the dtype the checkpoint declares (:func:`declared_dtype`).

    Raises:
        UnsupportedArchitectureError: the model type is not supported.
        ModelLoadError: ``head`` asked for but missing from the checkpoint's weights.
    """
    from transformers import AutoConfig, AutoTokenizer  # deferred: transformers takes ~1.5 s to import

    config = AutoConfig.from_pretrained(source, trust_remote_code=False, **kw)
    require_supported(config)
    if is_vision(config):  # an image model: its processor names the tokens (probe.loading.pixels)
        tokenizer = processor_for(source, config, **kw)
    elif is_waveform(config):  # a raw-waveform speech encoder: its frames are the tokens (probe.loading.waves)
        tokenizer = wave_processor_for(source, config, **kw)
    else:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **kw)
    if is_speech(config):  # a speech model: frames and text tokens (probe.loading.sound)
        tokenizer = speech_processor_for(source, config, tokenizer, **kw)
    cls = model_class(config, head)
    model, info = cls.from_pretrained(source, attn_implementation="eager", trust_remote_code=False,
                                      dtype=dtype or declared_dtype(config), output_loading_info=True, **PLACEMENT,
                                      **kw)
    if head is not None and info.get("missing_keys"):
        # a head the checkpoint does not have would be random weights: refuse rather than measure noise
        raise ModelLoadError(f"{source} has no {cls.__name__.replace('AutoModelFor', '')} head in its weights "
                             f"(missing: {sorted(info['missing_keys'])[0]} ...)")
    return model, tokenizer


DEVICES = ("cpu", "cuda", "mps", "auto")


def resolve_device(device: str | None) -> str | None:
    """``"auto"`` -> ``"cuda"`` where a GPU is present, else ``"cpu"``; under a data-parallel
    launcher, ``"cuda"`` means this rank's GPU (``LOCAL_RANK``).

    Raises:
        ModelLoadError: an unknown device, ``"cuda"`` without a GPU or ``"mps"`` without Apple's MPS.
    """
    if device is None:
        return None
    if device not in DEVICES and not device.startswith("cuda:"):
        raise ModelLoadError(f"unknown device {device!r}; choose from {', '.join(DEVICES)}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelLoadError("--device mps: no Apple MPS device is available")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ModelLoadError("--device cuda: no CUDA device is available")
        if device == "cuda" and os.environ.get("LOCAL_RANK"):
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return device


def place(model: nn.Module, device: str | None, device_map: str | None) -> list[str]:
    """Put the weights where asked (after loading, for models not loaded with a device map)."""
    notes = []
    if device_map is not None and getattr(model, "hf_device_map", None) is None:
        from accelerate import dispatch_model, infer_auto_device_map  # deferred: accelerate takes ~0.2 s to import

        placement = infer_auto_device_map(model, no_split_module_classes=getattr(model, "_no_split_modules", None))
        offload = cache_dir() / "offload"
        dispatch_model(model, device_map=placement, offload_dir=str(offload))
    if getattr(model, "hf_device_map", None) is not None:
        where = sorted({str(v) for v in model.hf_device_map.values()})
        notes.append(f"layers spread over {', '.join(where)} (device map {device_map})")
    elif device is not None:
        model.to(device)
    return notes
