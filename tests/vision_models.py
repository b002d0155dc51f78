"""Tiny random vision transformers for the image tests: 2 layers, 4 heads, 32 wide, 32 x 32 pixel
images in 8 x 8 pixel patches (a 4 x 4 grid)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

#: kind -> (config class name, special tokens before the patches)
VISION = {
    "vit": ("ViTConfig", ("[CLS]",)),
    "deit": ("DeiTConfig", ("[CLS]", "[DIST]")),
    "dinov2_with_registers": ("Dinov2WithRegistersConfig", ("[CLS]", "[REG]", "[REG]", "[REG]")),
    "siglip": ("SiglipVisionConfig", ()),
    "clip": ("CLIPVisionConfig", ("[CLS]",)),
}
IMAGE, PATCH = 32, 8


def vision_config(kind: str):
    """The tiny config of ``kind`` (:data:`VISION`)."""
    import transformers as tr

    cls = getattr(tr, VISION[kind][0])
    kw = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE, patch_size=PATCH,
              initializer_range=0.3)
    if kind == "dinov2_with_registers":
        return cls(mlp_ratio=2, num_register_tokens=3, **kw)
    return cls(intermediate_size=64, **kw)


def vision_model(kind: str, seed: int = 0):
    """A random-init ``transformers`` model of ``kind`` (eval mode)."""
    import transformers as tr

    torch.manual_seed(seed)
    return tr.AutoModel.from_config(vision_config(kind)).eval()


def zero_queries_and_keys(model) -> None:
    """Zero every query and key projection (weights and biases): every score is 0, so every
    attention weight is 1/N over the N tokens."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in ("query", "key", "q_proj", "k_proj"):
                module.weight.zero_()
                if module.bias is not None:
                    module.bias.zero_()


def tiny_vision(kind: str, *, uniform: bool = False, seed: int = 0):
    """A :class:`probe.loading.models.LoadedModel` of a tiny ``kind`` model with its processor (uniform
    attention when ``uniform``: queries and keys zeroed)."""
    from probe.loading.models import from_pretrained_objects
    from probe.loading.pixels import PixelProcessor

    model = vision_model(kind, seed)
    if uniform:
        zero_queries_and_keys(model)
    return from_pretrained_objects(model, PixelProcessor.from_settings({}, model.config), name=f"tiny {kind}")


def save_vision(kind: str, folder: Path, settings: dict | None = None) -> Path:
    """A model folder of a tiny ``kind`` model (``probe --model`` loads it), with a
    ``preprocessor_config.json`` of ``settings`` (default: resize to 32 x 32, mean = std = 0.5)."""
    vision_model(kind).save_pretrained(folder)
    settings = settings or {"size": {"height": IMAGE, "width": IMAGE}, "do_resize": True, "resample": 2,
                            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                            "image_processor_type": "ViTImageProcessor"}
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(settings))
    return Path(folder)


#: dual encoders: pair config class name -> (text tower class name, vision tower class name)
PAIRS = {"clip": ("CLIPConfig", "CLIPTextModel", "CLIPVisionModel"),
         "siglip": ("SiglipConfig", "SiglipTextModel", "SiglipVisionModel")}


def pair_model(kind: str, seed: int = 0):
    """A random-init dual encoder of ``kind`` (:data:`PAIRS`): both towers 2 layers, 4 heads, 32
    wide; the text tower with the test BPE vocabulary (1000), the vision tower on 32 x 32 images."""
    import transformers as tr

    cls = getattr(tr, PAIRS[kind][0])
    config = cls(text_config=dict(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=2),
                 vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                    image_size=IMAGE, patch_size=PATCH, initializer_range=0.3))
    torch.manual_seed(seed)
    return tr.AutoModel.from_config(config).eval()


def save_pair(kind: str, folder: Path) -> Path:
    """A model folder of a tiny dual encoder with the test tokenizer and a 32 x 32 image processor."""
    import shutil

    folder = Path(folder)
    pair_model(kind).save_pretrained(folder)
    bpe = Path(__file__).parent / "data" / "bpe"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(bpe / name, folder / name)
    save_vision_settings(folder)
    return folder


def save_vision_settings(folder: Path) -> None:
    """The 32 x 32, mean = std = 0.5 processor settings of :func:`save_vision`."""
    settings = {"size": {"height": IMAGE, "width": IMAGE}, "do_resize": True, "resample": 2, "do_rescale": True,
                "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5], "image_processor_type": "ViTImageProcessor"}
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(settings))
