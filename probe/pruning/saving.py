"""Saving a physically pruned model (:func:`probe.loading.pruned.load_pruned_folder` builds it again when it is loaded).

A pruned model's folder holds the ORIGINAL config (``config.json``: its layers x heads), the smaller
weights (``model.safetensors``, under the model's own parameter names, tied tensors stored once),
the tokenizer, and
:data:`~probe.loading.pruned.PRUNED_FILE`: the removed heads in the original numbering and the
layout of every layer. :func:`probe.loading.pruned.load_pruned_folder` builds the model from the config, removes the
same heads the same way (:func:`probe.loading.pruned.apply_layout`), then loads the weights, so
outputs are identical after the round trip. ``probe analyze/verify/prune
--model DIR`` load such a folder through :func:`probe.loading.models.load_model`.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_model

from ..errors import InputError
from ..loading.pruned import PRUNED_FILE, WEIGHTS
from ..runfolder import claim
from .removal import parameter_count


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
