"""Saving a physically pruned model, and building it again when it is loaded.

A pruned model's folder holds the ORIGINAL config (``config.json``: its layers x heads), the smaller
weights (``model.safetensors``, under the model's own parameter names, tied tensors stored once),
the tokenizer, and
:data:`~probe.pruning.heads.PRUNED_FILE`: the removed heads in the original numbering and the
layout of every layer. :func:`load_pruned_folder` builds the model from the config, removes the
same heads the same way (:func:`probe.pruning.removal.apply_layout`), then loads the weights, so
outputs are identical after the round trip. ``probe analyze/verify/prune
--model DIR`` load such a folder through :func:`probe.loading.models.load_model`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_model

from ..architectures import get_spec, head_geometry
from ..errors import InputError, ModelLoadError
from ..loading.checkpoints import declared_dtype
from ..runfolder import claim
from .heads import PRUNED_FILE, PrunedHeads, full_layout
from .removal import apply_layout, parameter_count

#: The weights file of a pruned model's folder.
WEIGHTS = "model.safetensors"


def save_pruned(lm, folder: str | Path, *, force: bool = False) -> Path:
    """Write a physically pruned model (``lm.pruned`` set by
    :func:`~probe.pruning.removal.remove_heads`) to ``folder``.

    The folder is claimed and written under a temporary name, renamed at the end
    (:mod:`probe.runfolder`): nothing is left half-written, also on an interrupt. An existing
    non-empty folder is written again only with ``force`` and only if probe wrote it as a
    pruned model; then probe's files are replaced and every other file is kept.

    Raises:
        InputError: ``lm`` has no removed head, or ``folder`` is taken (see :func:`claim_target`),
            or cannot be written.
    """
    if lm.pruned is None:
        raise InputError("the model has no removed head: prune it first (probe.pruning.remove_heads)")
    path = Path(folder)
    with claim_target(path, force) as target, target.staging() as tmp:
        try:
            _write_model(lm, tmp)
        except OSError as exc:
            raise InputError(f"cannot write the pruned model to {path}: {exc.strerror or exc}") from None
    return path


def _write_model(lm, tmp: Path) -> None:
    """The files of a pruned model's folder, written into ``tmp``."""
    lm.model.config.save_pretrained(tmp)
    if getattr(lm.model, "generation_config", None) is not None and lm.kind != "encoder":
        lm.model.generation_config.save_pretrained(tmp)
    # the module's own parameter names (no checkpoint key conversion); tied tensors stored once
    save_model(lm.model, str(tmp / WEIGHTS), metadata={"format": "pt"})
    lm.tokenizer.save_pretrained(tmp)
    record = {**lm.pruned.to_json(), "class": type(lm.model).__name__,
              "parameters": parameter_count(lm.model), "model_type": lm.model.config.model_type}
    (tmp / PRUNED_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def claim_target(path: Path, force: bool):
    """Claim ``path`` for a pruned model (:func:`probe.runfolder.claim`, kind ``pruned model``).

    Raises:
        InputError: ``path`` is a file, a non-empty folder without ``force``, a non-empty folder
            probe did not write as a pruned model, or another probe run is writing it.
    """
    return claim(path, kind="pruned model", force=force, what="--save-pruned folder")


def _state_dict(folder: Path) -> dict[str, torch.Tensor]:
    if not (folder / WEIGHTS).is_file():
        raise ModelLoadError(f"{folder}: no {WEIGHTS} beside {PRUNED_FILE}")
    return load_file(str(folder / WEIGHTS))


def _load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], folder: Path) -> None:
    """Load ``state`` into ``model``, matching keys saved with or without the base-model prefix
    (a masked-LM checkpoint loaded as the bare encoder); tied weights may be absent.

    Raises:
        ModelLoadError: a weight the model needs is missing, or a shape differs.
    """
    target = model.state_dict()
    prefix = getattr(model, "base_model_prefix", "") or ""
    mapped = {}
    for key, value in state.items():
        for cand in (key, key[len(prefix) + 1:] if key.startswith(prefix + ".") else None, f"{prefix}.{key}"):
            if cand in target:
                mapped[cand] = value
                break
    loaded_ptrs = {target[k].data_ptr() for k in mapped}
    missing = [k for k in target if k not in mapped and target[k].data_ptr() not in loaded_ptrs]
    if missing:
        raise ModelLoadError(f"{folder}: the saved weights lack {len(missing)} tensor(s) this model needs "
                             f"(first: {missing[0]}); was it saved from another model class?")
    bad = [k for k, v in mapped.items() if tuple(v.shape) != tuple(target[k].shape)]
    if bad:
        raise ModelLoadError(f"{folder}: weight {bad[0]} is {tuple(mapped[bad[0]].shape)} but the pruned layout "
                             f"gives {tuple(target[bad[0]].shape)}: {PRUNED_FILE} does not match the weights")
    model.load_state_dict(mapped, strict=False)


def load_pruned_folder(folder: str | Path, model_class, dtype: torch.dtype | None = None):
    """Build a pruned model from its folder (see the module docstring).

    Args:
        folder: a folder written by :func:`save_pruned`.
        model_class: the ``transformers`` auto class to build (``AutoModel``, ``AutoModelForCausalLM`` ...).
        dtype: parameter dtype (default: the one its config declares, else float32).

    Returns:
        ``(model, tokenizer, pruned)``: eval mode, eager attention; ``pruned`` a
        :class:`~probe.pruning.heads.PrunedHeads` in the original numbering.

    Raises:
        ModelLoadError: unreadable record, missing weights, or weights that do not fit the record.
    """
    from transformers import AutoConfig, AutoTokenizer  # deferred: transformers takes ~1.5 s to import
    from transformers.initialization import no_init_weights  # deferred: transformers takes ~1.5 s to import

    path = Path(folder)
    try:
        pruned = PrunedHeads.from_json(json.loads((path / PRUNED_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, InputError) as exc:
        raise ModelLoadError(f"cannot read {path / PRUNED_FILE}: {exc}") from None
    config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    spec = get_spec(config)
    geo = head_geometry(config)
    if (pruned.n_layers, pruned.n_heads, pruned.n_kv_heads) != (geo.n_layers, geo.n_heads, geo.n_kv_heads):
        raise ModelLoadError(f"{path / PRUNED_FILE} describes {pruned.n_layers} x {pruned.n_heads} heads but the "
                             f"config has {geo.n_layers} x {geo.n_heads}")
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    with no_init_weights():
        model = model_class.from_config(config, attn_implementation="eager", trust_remote_code=False)
    model.tie_weights()  # skipped by no_init_weights; tied tensors are saved once
    full = full_layout(geo.n_heads, geo.n_kv_heads)
    for layer, lay in enumerate(pruned.layouts):
        if lay != full:
            apply_layout(model, spec, layer, full, lay, geo.d_head)
    _load_weights(model, _state_dict(path), path)
    model = model.to(dtype or declared_dtype(config))
    model.eval()
    return model, tokenizer, pruned
