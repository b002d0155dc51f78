"""Run every analysis of probe on one tiny random model: a row of the feature x type matrix.

:func:`try_features` builds a tiny model of a type (``tools/tiny_models.py`` for text types,
:func:`image_model` and :func:`speech_model` for the image and speech types probe knows), wraps it
with ``probe.from_pretrained_objects`` and runs each feature of :data:`FEATURES` on one or two short
inputs, one try each: a feature's cell is ``ran`` or the one-line reason it was refused (or the
exception it raised, prefixed with its class name). ``tools/feature_matrix.py`` runs it per type in a
worker process and writes the matrix.
"""

from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from tiny_models import BPE, build
from try_model import TARGETS, TEXTS, one_line

import probe.loading.models as pm
from probe.text.inputs import Text
from probe.text.pairfile import Pair

#: The matrix's columns after ``type`` and ``kind``, in order, with what each runs.
FEATURES = {
    "capture": "probe.capture_attention on one text (images, speech: probe.analyze of one input)",
    "verify": "probe.verify: probe's from-scratch attention equals the model's",
    "value_weighted": "probe.analyze's value-weighted statistics (the _by_norm columns, norm_mass)",
    "ablation": "probe.head_effects (zero ablation, 5 random-group seeds, the two texts twice: 2 held out)",
    "patch_z": "activation patching of each head's output z (probe.patch_heads)",
    "patch_q": "activation patching of each head's query",
    "patch_k": "activation patching of each key head",
    "patch_v": "activation patching of each value head",
    "patch_pattern": "activation patching of each head's attention pattern",
    "dla": "direct logit attribution (probe.direct_logit_attribution)",
    "composition": "Q/K/V composition scores (probe.composition_scores)",
    "circuit": "`probe circuit`: EAP edge scores and the faithfulness curve",
    "path": "`probe path`: path patching L0H0 -> logits",
    "steps": "probe.attention_steps of one head and query",
    "views": "probe.model_view of an analysis result",
}
RAN = "ran"
IMAGE_TYPES = {"vit": "ViTConfig", "deit": "DeiTConfig", "dinov2_with_registers": "Dinov2WithRegistersConfig",
               "siglip_vision_model": "SiglipVisionConfig", "clip_vision_model": "CLIPVisionConfig"}
SPEECH_TYPES = {"whisper": "WhisperConfig", "wav2vec2": "Wav2Vec2Config", "hubert": "HubertConfig",
                "data2vec-audio": "Data2VecAudioConfig"}
DECODER_PAIRS = [Pair("The cat and the dog ran to", "The dog and the cat ran to", " the", " a"),
                 Pair("The dog and the cat sat by", "The cat and the dog sat by", " the", " a")]
SEQ2SEQ_PAIRS = [Pair("The cat sat on the mat.", "A dog ran in the park.", " cat", " dog", "Le"),
                 Pair("The dog sat on the mat.", "A cat ran in the park.", " cat", " dog", "")]
MLM_PAIRS = [Pair("the capital of france is [MASK] .", "the river of england was [MASK] .", "paris", "london"),
             Pair("a cat sat on the [MASK] today .", "a dog ran to the [MASK] today .", "mat", "rug")]
RATE = 16000


def other_types() -> list[tuple[str, str]]:
    """The image and speech types probe knows, as ``(model_type, kind)`` (kind ``image`` or ``speech``)."""
    return [(t, "image") for t in IMAGE_TYPES] + [(t, "speech") for t in SPEECH_TYPES]


def image_model(model_type: str):
    """A tiny ``model_type`` vision model (2 layers, 4 heads, 32 wide, 32 x 32 images in 8 x 8 patches)
    wrapped with probe's pixel processor."""
    import transformers as tr

    from probe.loading.pixels import PixelProcessor

    cls = getattr(tr, IMAGE_TYPES[model_type])
    kw = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8,
              initializer_range=0.3)
    config = cls(mlp_ratio=2, num_register_tokens=3, **kw) if "registers" in model_type else cls(
        intermediate_size=64, **kw)
    torch.manual_seed(0)
    model = tr.AutoModel.from_config(config, attn_implementation="eager").eval()
    return pm.from_pretrained_objects(model, PixelProcessor.from_settings({}, model.config), name=f"tiny-{model_type}")


def speech_model(model_type: str, folder: Path):
    """A tiny ``model_type`` speech model: Whisper saved to ``folder`` and loaded as probe loads a folder
    (2 + 2 layers, 32 wide, a 2-second window, the test tokenizer); a raw-waveform encoder (2 layers,
    32 wide, three small convolutions) wrapped with probe's waveform processor."""
    import shutil

    import transformers as tr

    from probe.loading.waves import WaveProcessor

    torch.manual_seed(0)
    if model_type == "whisper":
        config = tr.WhisperConfig(vocab_size=1000, num_mel_bins=80, d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_source_positions=100, max_target_positions=64,
                                  decoder_start_token_id=1, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                                  begin_suppress_tokens=None, suppress_tokens=None, init_std=0.3)
        tr.WhisperForConditionalGeneration(config).eval().save_pretrained(folder)
        tr.WhisperFeatureExtractor(feature_size=80, chunk_length=2).save_pretrained(folder)
        for f in BPE.iterdir():
            shutil.copy(f, folder / f.name)
        lm = pm.load_model(str(folder))
        lm.name = "tiny-whisper"  # not the temporary folder's path: the matrix's reasons stay the same run to run
        return lm
    config = getattr(tr, SPEECH_TYPES[model_type])(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(8, 8, 8),
        conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
        initializer_range=0.3)
    model = tr.AutoModel.from_config(config, attn_implementation="eager").eval()
    extractor = tr.Wav2Vec2FeatureExtractor(sampling_rate=RATE, do_normalize=True, return_attention_mask=False)
    return pm.from_pretrained_objects(model, WaveProcessor(extractor, model.config), name=f"tiny-{model_type}")


def _clip(folder: Path) -> Path:
    import soundfile

    path = folder / "clip.wav"
    t = np.arange(int(0.5 * RATE)) / RATE
    soundfile.write(str(path), (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), RATE)
    return path


def _picture():
    from PIL import Image

    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8), "RGB")


def row(model_type: str, kind: str, cells: dict | None = None, default: str = "", seconds: float = 0.0) -> dict:
    """One row: ``type``, ``kind``, each feature's cell (``cells``, else ``default``) and ``seconds``."""
    cells = cells or {}
    return {"type": model_type, "kind": kind, **{f: cells.get(f, default) for f in FEATURES},
            "seconds": f"{seconds:.1f}"}


def _cell(fn: Callable[[], object]) -> str:
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - each feature in its own try: a refusal is the cell's reason
        return one_line(exc)
    return out if isinstance(out, str) else RAN


def _verify(lm) -> str:
    from probe.verification import verify

    result = verify(lm)
    return RAN if result.passed else f"verify failed: max difference {result.max_abs_diff:.1e}"


def _value_weighted(result) -> str:
    if "norm_mass" in result.heads.columns:
        return RAN
    left = [n for n in result.notes if "value-weighted" in n]
    return left[0].splitlines()[0] if left else "value-weighted statistics left out"


def _text_checks(lm, kind: str) -> dict[str, Callable[[], object]]:
    """Each feature's call on a text model (the analysis result shared by statistics and views)."""
    from probe.capture.maps import capture_attention
    from probe.circuits.path_run import measure as path_measure
    from probe.circuits.run import measure as circuit_measure
    from probe.circuits.wiring import check_kind
    from probe.effects.components import check_components, patch_component
    from probe.effects.composition import composition_scores
    from probe.effects.dla import direct_logit_attribution
    from probe.effects.measure import head_effects
    from probe.effects.pairs import encode_pairs
    from probe.effects.patching import check_patchable, patch_heads
    from probe.entries.notebook import model_view
    from probe.measures.steps import attention_steps
    from probe.runs.analysis import analyze

    texts = [Text(s, target=t) for s, t in zip(TEXTS[:2], TARGETS)] if kind == "encoder-decoder" else list(TEXTS[:2])
    pairs = {"decoder": DECODER_PAIRS, "encoder-decoder": SEQ2SEQ_PAIRS}.get(kind, MLM_PAIRS)
    state: dict = {}

    def result():
        if "result" not in state:
            state["result"] = analyze(lm, texts, batch_size=2, n_examples=1)
        return state["result"]

    def patch(name):  # what the component needs of the model checked before the pairs are encoded
        return lambda: (check_patchable(lm), check_components(lm, [name]),
                        patch_component(lm, encode_pairs(lm, pairs), name))

    def graph(what, run):  # a model the graph does not fit refused before the pairs are encoded (as DLA does);
        # an encoder's metric reads its masked-LM head's logits
        return lambda: (check_kind(lm, what), check_patchable(lm) if lm.kind == "encoder" else None, run())

    return {
        "capture": lambda: capture_attention(lm, texts[0]),
        "verify": lambda: _verify(lm),
        "value_weighted": lambda: _value_weighted(result()),
        "ablation": lambda: head_effects(lm, texts + texts, kinds=("zero",), seeds=5, batch_size=2, heads=False),
        "patch_z": lambda: patch_heads(lm, pairs),
        "patch_q": patch("q"), "patch_k": patch("k"), "patch_v": patch("v"), "patch_pattern": patch("pattern"),
        "dla": lambda: direct_logit_attribution(lm, pairs),
        "composition": lambda: composition_scores(lm),
        "circuit": graph("circuits", lambda: circuit_measure(lm, pairs, method="eap", seeds=1, batch_size=2,
                                                              shares=(0.5,))),
        "path": graph("path patching", lambda: path_measure(lm, "L0H0", "logits", pairs)),
        "steps": lambda: attention_steps(lm, texts[0]),
        "views": lambda: model_view(result(), tokenizer=lm.tokenizer).head_view,
    }


def _media_checks(lm, kind: str, folder: Path) -> dict[str, Callable[[], object]]:
    """Each feature's call on an image or speech model: capture and statistics by probe.analyze of the
    input; the text analyses given that model and the text pairs (their refusal is the cell)."""
    checks = _text_checks(lm, "encoder")
    state: dict = {}

    def result():
        if "result" not in state:
            if kind == "image":
                from probe.images import analyze_images

                state["result"] = analyze_images(lm, [_picture()], n_examples=1)
            else:
                from probe.audio import analyze_audio

                state["result"] = analyze_audio(lm, [_clip(folder)], max_new_tokens=4, n_clips=1)
        return state["result"]

    from probe.entries.notebook import model_view

    checks.update(capture=result, value_weighted=lambda: _value_weighted(result()),
                  views=lambda: model_view(result()).head_view)
    return checks


def try_features(model_type: str, kind: str, built: Callable[[], None] = lambda: None,
                 report: Callable[[str, str], None] = lambda feature, cell: None) -> dict:
    """Build a tiny ``model_type`` model and run each of :data:`FEATURES` on it.

    Args:
        model_type: a ``config.model_type`` (a text type of ``tools/tiny_models.py``, or one of
            :func:`other_types`).
        kind: ``decoder``, ``encoder``, ``encoder-decoder``, ``image`` or ``speech``.
        built: called once the model is built. report: called with each feature's cell as it is known.

    Returns:
        :func:`row`: each feature ``ran`` or the one-line reason; every cell the build's error where no
        tiny model could be built.
    """
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if kind == "image":
                lm = image_model(model_type)
            elif kind == "speech":
                lm = speech_model(model_type, Path(tmp))
            else:
                model, tok = build(model_type, kind)
        except Exception as exc:  # noqa: BLE001 - the build's failure is every cell's reason
            return row(model_type, kind, default=f"could not build a tiny model: {one_line(exc)}",
                       seconds=time.perf_counter() - start)
        built()
        if kind not in ("image", "speech"):
            try:
                lm = pm.from_pretrained_objects(model, tok, name=f"tiny-{model_type}")
            except Exception as exc:  # noqa: BLE001 - probe's refusal of the type is every cell's reason
                return row(model_type, kind, default=one_line(exc), seconds=time.perf_counter() - start)
        checks = _media_checks(lm, kind, Path(tmp)) if kind in ("image", "speech") else _text_checks(lm, kind)
        cells = {}
        for feature in FEATURES:
            cells[feature] = _cell(checks[feature])
            report(feature, cells[feature])
        del lm, checks
        gc.collect()
    return row(model_type, kind, cells, seconds=time.perf_counter() - start)
