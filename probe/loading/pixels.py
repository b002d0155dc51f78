"""A vision model's image processor and the vocabulary of its sequence, without torchvision.

The model folder's processor settings (``preprocessor_config.json``: size, crop, mean, std,
resample, rescale factor) are applied with Pillow and NumPy: resize (to ``height`` x ``width``, or
the shorter edge to ``shortest_edge`` then a centre crop to ``crop_size``), scale to [0, 1], then
``(x - mean) / std`` per channel. :class:`PixelProcessor` also stands where a text model keeps its
tokenizer (:attr:`probe.core.LoadedModel.tokenizer`): it names the tokens of the sequence, so
reports and views label them like text tokens. Token ids are positions, not a vocabulary: special
token i has id i, the patch at row r and column c has id ``PATCH_ID + r * ROW_ID + c``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from ..architectures.vision import special_tokens
from ..errors import InputError

#: Id of the patch at row 0, column 0; patch (r, c) is ``PATCH_ID + r * ROW_ID + c``.
PATCH_ID = 1_000_000
#: Id step from one row of patches to the next.
ROW_ID = 10_000
#: Id of the padding token (never a real token: every image of a batch has the same grid).
PAD_ID = PATCH_ID - 1
_RESAMPLE = {0: "NEAREST", 1: "LANCZOS", 2: "BILINEAR", 3: "BICUBIC", 4: "BOX", 5: "HAMMING"}


def patch_label(r: int, c: int) -> str:
    """The label of the patch at row ``r``, column ``c`` (counted from 0, top left)."""
    return f"patch ({r}, {c})"


def _pair(value, default: int) -> tuple[int, int]:
    if value is None:
        return default, default
    if isinstance(value, dict):
        if "height" in value:
            return int(value["height"]), int(value["width"])
        return int(value.get("shortest_edge", default)), int(value.get("shortest_edge", default))
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)


@dataclass
class PixelProcessor:
    """Images to the pixel values of one vision model, and the names of its sequence's tokens.

    Attributes:
        size: (height, width) in pixels the model's processor resizes to (after the crop, if any).
        shortest_edge: resize the shorter edge to this many pixels keeping the aspect (then crop to
            ``size``), or None to resize straight to ``size``.
        mean, std: per-channel normalisation (three floats each).
        rescale: factor from 8-bit values to [0, 1] (1/255).
        resample: Pillow resampling filter number (2: bilinear, 3: bicubic).
        patch: patch side in pixels.
        specials: names of the special tokens before the patches (``[CLS]``, ``[REG]`` ...).
        channels: input channels (3).
    """

    size: tuple[int, int]
    shortest_edge: int | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rescale: float
    resample: int
    patch: int
    specials: tuple[str, ...]
    channels: int = 3
    # the tokenizer's attributes that probe reads
    pad_token: str = "[PAD]"
    pad_token_id: int = PAD_ID
    padding_side: str = "right"
    sep_token = None
    eos_token = None
    unk_token = None
    unk_token_id = None
    model_max_length = None

    @classmethod
    def from_settings(cls, settings: dict, config) -> PixelProcessor:
        """From a processor's settings (``preprocessor_config.json`` as a dict; missing entries
        default to the config's ``image_size`` and mean = std = 0.5) and the model's config."""
        side = int(_pair(config.image_size, 224)[0])
        size = settings.get("crop_size") if settings.get("do_center_crop") else settings.get("size")
        edge = settings.get("size", {}) if settings.get("do_center_crop") else {}
        shortest = edge.get("shortest_edge") if isinstance(edge, dict) else None
        norm = settings.get("do_normalize", True)
        mean = tuple(settings.get("image_mean") or (0.5, 0.5, 0.5)) if norm else (0.0,) * 3
        std = tuple(settings.get("image_std") or (0.5, 0.5, 0.5)) if norm else (1.0,) * 3
        rescale = float(settings.get("rescale_factor", 1 / 255)) if settings.get("do_rescale", True) else 1.0
        return cls(size=_pair(size, side), shortest_edge=shortest, mean=mean, std=std, rescale=rescale,
                   resample=int(settings.get("resample", 2)), patch=int(_pair(config.patch_size, 16)[0]),
                   specials=special_tokens(config), channels=int(getattr(config, "num_channels", 3)))

    def target_size(self, image_size: tuple[int, int] | None = None) -> tuple[int, int]:
        """(height, width) the pixels will have: ``image_size`` if given, else the processor's.

        Raises:
            InputError: a size that is not a positive multiple of the patch side.
        """
        h, w = self.size if image_size is None else image_size
        if h < self.patch or w < self.patch or h % self.patch or w % self.patch:
            raise InputError(f"image size {h}x{w} is not a multiple of the patch side {self.patch} pixels")
        return int(h), int(w)

    def resized(self, image, image_size: tuple[int, int] | None = None):
        """The RGB Pillow image as the model sees it (resized, centre-cropped), before normalising."""

        h, w = self.target_size(image_size)
        image = image.convert("RGB")
        method = getattr(Image.Resampling, _RESAMPLE.get(self.resample, "BILINEAR"))
        if image_size is None and self.shortest_edge is not None:
            scale = self.shortest_edge / min(image.size)
            image = image.resize((max(w, round(image.size[0] * scale)), max(h, round(image.size[1] * scale))), method)
            left, top = (image.size[0] - w) // 2, (image.size[1] - h) // 2
            return image.crop((left, top, left + w, top + h))
        return image.resize((w, h), method)

    def pixel_values(self, image) -> torch.Tensor:
        """[channels, height, width] float32 normalised pixel values of an already
        :meth:`resized` RGB image."""
        x = np.asarray(image, dtype=np.float32) * self.rescale
        x = (x - np.asarray(self.mean, dtype=np.float32)) / np.asarray(self.std, dtype=np.float32)
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))

    def grid(self, image_size: tuple[int, int] | None = None) -> tuple[int, int]:
        """(rows, columns) of patches of an image of ``image_size`` (default: the processor's)."""
        h, w = self.target_size(image_size)
        return h // self.patch, w // self.patch

    def ids(self, grid: tuple[int, int]) -> list[int]:
        """Token ids of a sequence: the special tokens, then every patch row by row."""
        rows, cols = grid
        return list(range(len(self.specials))) + [PATCH_ID + r * ROW_ID + c for r in range(rows) for c in range(cols)]

    def convert_ids_to_tokens(self, ids):
        """Token labels of ids (one id or a list): special tokens by name, patches ``patch (r, c)``."""
        if isinstance(ids, int):
            return self.convert_ids_to_tokens([ids])[0]
        out = []
        for i in ids:
            if i == PAD_ID:
                out.append(self.pad_token)
            elif i >= PATCH_ID:
                out.append(patch_label((i - PATCH_ID) // ROW_ID, (i - PATCH_ID) % ROW_ID))
            else:
                out.append(self.specials[i] if 0 <= i < len(self.specials) else f"[TOKEN {i}]")
        return out

    def __call__(self, *args, **kwargs):
        """Text given to an image model (``probe verify``, ``patch``, ``prune`` ... read text).

        Raises:
            InputError: always: an image model reads images.
        """
        raise InputError("this is an image model: it reads images, not text (probe analyze --image FILE, or "
                         "probe.images.analyze_images); commands that read text do not run on it")

    def convert_tokens_to_string(self, tokens) -> str:
        """The labels joined by spaces."""
        return " ".join(tokens)

    def discovery_inputs(self, device) -> dict:
        """The model inputs of discovery's forward pass (:mod:`probe.capture.discover`): one grey image."""
        h, w = self.size
        return {"pixel_values": torch.zeros(1, self.channels, h, w, device=device)}


def processor_for(source, config, **kw) -> PixelProcessor:
    """The :class:`PixelProcessor` of a model folder or Hub id (its ``preprocessor_config.json``;
    the config's image size and mean = std = 0.5 where it has none)."""
    from transformers import ImageProcessingMixin  # deferred: transformers takes ~1.5 s to import

    try:
        settings, _ = ImageProcessingMixin.get_image_processor_dict(source, **kw)
    except OSError:
        settings = {}
    return PixelProcessor.from_settings(settings, config)
