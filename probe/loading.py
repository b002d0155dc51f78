"""How a checkpoint becomes a model for :func:`probe.models.load_model`: the auto class (with a
task head if asked), GGUF files dequantized and cached as float32, model folders, and where the
weights are placed (device, device map). (A pruned model's folder is rebuilt by
:mod:`probe.pruning.saving`, which :mod:`probe.models` calls: the loader knows nothing of pruning.)
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from .architectures import get_spec
from .errors import ModelLoadError, ProbeError

log = logging.getLogger("probe.models")


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
    spec = get_spec(config)
    if spec.kind == "encoder-decoder":
        return tr.AutoModelForSeq2SeqLM
    if spec.kind == "decoder":
        return tr.AutoModelForCausalLM
    return tr.AutoModelForMaskedLM if head == "mlm" else tr.AutoModel


def finish_tokenizer(tokenizer) -> None:
    """Right padding, and a pad token where the tokenizer has none (EOS, else UNK)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    tokenizer.padding_side = "right"


def load_gguf(folder: Path, gguf_file: str, cached: Path | None, dtype):
    """Load a GGUF checkpoint (dequantized to floats); cache the result as float32 safetensors.

    The cache always holds float32 weights, whatever ``dtype`` was asked for, and is then loaded
    with ``dtype`` (``from_pretrained(dtype=...)`` keeps buffers such as RoPE's ``inv_freq`` in
    float32, which a later ``.to(dtype)`` would round).
    """
    from transformers import AutoConfig, AutoTokenizer  # deferred: transformers takes ~1.5 s to import

    if cached is not None and (cached / "config.json").exists():
        return load_folder(cached, dtype)
    if cached is not None:
        log.warning("first use of %s: de-quantizing its GGUF weights to float32 and caching them in %s "
                    "(a one-time step of about 30 s; later runs load the cached copy in seconds)",
                    gguf_file, cached)
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=gguf_file)
        get_spec(config)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
        model = model_class(config).from_pretrained(
            folder, gguf_file=gguf_file, attn_implementation="eager", trust_remote_code=False,
            dtype=torch.float32 if cached is not None else (dtype or torch.float32))
    except ProbeError:
        raise
    except ImportError as exc:
        raise ModelLoadError(f"loading a GGUF file needs the 'gguf' package: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds here
        raise ModelLoadError(f"cannot load GGUF file {folder / gguf_file}: {str(exc).splitlines()[0]}") from None
    if cached is not None:
        # The weights are plain floats after dequantization; the quantizer record only blocks saving.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=cached.name + ".", dir=cached.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            if cached.exists():
                shutil.rmtree(cached)
            tmp.rename(cached)
        except OSError as exc:
            log.warning("could not cache the dequantized model in %s: %s", cached, exc)
            shutil.rmtree(tmp, ignore_errors=True)
            if dtype not in (None, torch.float32):
                model = model.to(dtype)
            return model, tokenizer
        if dtype not in (None, torch.float32):
            return load_folder(cached, dtype)
    return model, tokenizer


#: How the weights are placed (see :func:`load_model`); set for one load by :func:`probe.models.load_model`.
PLACEMENT: dict = {}


def load_folder(source, dtype, head: str | None = None, **kw):
    """(model, tokenizer) from a folder or Hub id, eager attention, placed as :data:`PLACEMENT` says.

    Raises:
        UnsupportedArchitectureError: the model type is not supported.
        ModelLoadError: ``head`` asked for but missing from the checkpoint's weights.
    """
    from transformers import AutoConfig, AutoTokenizer  # deferred: transformers takes ~1.5 s to import

    config = AutoConfig.from_pretrained(source, trust_remote_code=False, **kw)
    get_spec(config)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **kw)
    cls = model_class(config, head)
    model, info = cls.from_pretrained(source, attn_implementation="eager", trust_remote_code=False,
                                      dtype=dtype or torch.float32, output_loading_info=True, **PLACEMENT, **kw)
    if head is not None and info.get("missing_keys"):
        # a head the checkpoint does not have would be random weights: refuse rather than measure noise
        raise ModelLoadError(f"{source} has no {cls.__name__.replace('AutoModelFor', '')} head in its weights "
                             f"(missing: {sorted(info['missing_keys'])[0]} ...)")
    return model, tokenizer


DEVICES = ("cpu", "cuda", "auto")


def resolve_device(device: str | None) -> str | None:
    """``"auto"`` -> ``"cuda"`` where a GPU is present, else ``"cpu"``; under a data-parallel
    launcher, ``"cuda"`` means this rank's GPU (``LOCAL_RANK``).

    Raises:
        ModelLoadError: an unknown device, or ``"cuda"`` without a GPU.
    """
    if device is None:
        return None
    if device not in DEVICES and not device.startswith("cuda:"):
        raise ModelLoadError(f"unknown device {device!r}; choose from {', '.join(DEVICES)}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
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
