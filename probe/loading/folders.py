"""What a local model folder holds, read before its weights load: whether it lacks weights or tokenizer
files, whether its model type can be measured, which attention implementation its config asks for."""

from __future__ import annotations

import json
from pathlib import Path

from .checkpoints import require_supported

#: Files that hold a tokenizer, an image processor or a feature extractor (:func:`folder_lacks`).
TOKENIZER_FILES = frozenset({"tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
                             "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "preprocessor_config.json"})


def folder_lacks(path: Path) -> list[str]:
    """What a model folder holding a config.json lacks, in words: ``weights (...)`` (no
    ``*.safetensors``, ``*.bin`` or shard index) and ``tokenizer files (...)`` (none of
    :data:`TOKENIZER_FILES` and no ``*.model``); empty when it has both."""
    names = {p.name for p in path.iterdir() if p.is_file()}
    lacks = []
    if not any(n.endswith((".safetensors", ".bin", ".index.json")) and n != "training_args.bin" for n in names):
        lacks.append("weights (model.safetensors or pytorch_model.bin)")
    if not names & TOKENIZER_FILES and not any(n.endswith(".model") for n in names):
        lacks.append("tokenizer files (tokenizer.json, tokenizer_config.json or a vocabulary)")
    return lacks


def refuse_unsupported(path: Path) -> None:
    """Raise :func:`~probe.loading.checkpoints.require_supported`'s error for a folder whose model type
    probe cannot measure; nothing for a config transformers cannot read (the caller says what is missing)."""
    from transformers import AutoConfig  # deferred: transformers takes ~1.5 s to import

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - the folder's other lacks are the message then
        return
    require_supported(config)


def asked_attention(path: Path) -> str | None:
    """The attention implementation a folder's config.json asks for (``attn_implementation`` or
    ``_attn_implementation``), or None."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    asked = config.get("attn_implementation") or config.get("_attn_implementation")
    return asked if isinstance(asked, str) else None
