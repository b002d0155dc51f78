"""Images to batches: Pillow reads them, the model's processor resizes and normalises them, and
each becomes a sequence of special tokens then patches that :func:`probe.runs.analysis.analyze` takes.

A batch of images is a :class:`probe.text.inputs.Batch` whose token ids name positions
(:mod:`probe.loading.pixels`): the special tokens (``[CLS]``, registers, a distillation token) then patch
(r, c) for p = r * C + c, so the per-head statistics, example maps and views read it like text.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ..errors import InputError
from ..loading.pixels import PixelProcessor
from ..text.inputs import Batch, Text

#: File endings read from an image folder (``--images``).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff")


@dataclass
class ImageBatch(Batch):
    """A batch of images of one size (:class:`probe.text.inputs.Batch` with pixel values).

    Attributes:
        pixel_values: [batch, channels, height, width] float32 normalised pixels.
        grid: (rows, columns) of patches of every image in the batch.
        n_special: special tokens before the patches.
        images: per row, the RGB image as the model sees it (resized), a [height, width, 3] uint8 array.
        interpolate: ask the model to interpolate its position embeddings (a size other than its own).
    """

    pixel_values: torch.Tensor | None = None
    grid: tuple[int, int] = (0, 0)
    n_special: int = 0
    images: list | None = None
    interpolate: bool = False

    def model_inputs(self) -> dict:
        """``pixel_values`` (and ``interpolate_pos_encoding`` for a size other than the model's)."""
        kw = {"pixel_values": self.pixel_values}
        if self.interpolate:
            kw["interpolate_pos_encoding"] = True
        return kw

    def to(self, device) -> ImageBatch:
        """The pixels moved to ``device``."""
        self.pixel_values = self.pixel_values.to(device)
        return self


def read_image(item):
    """A Pillow image from a path (str or Path) or a Pillow image (returned as is).

    Raises:
        InputError: a missing file or one Pillow cannot read, in one line.
    """

    if isinstance(item, Image.Image):
        return item
    path = Path(item)
    if not path.is_file():
        raise InputError(f"image {str(path)!r} not found")
    try:
        with Image.open(path) as im:
            im.load()
            return im.copy()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InputError(f"cannot read image {str(path)!r}: {exc}") from None


def image_paths(folder) -> list[Path]:
    """The image files of a folder (by ending, :data:`IMAGE_SUFFIXES`), sorted by name.

    Raises:
        InputError: not a folder, or a folder without images.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"image folder {str(folder)!r} not found")
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not paths:
        raise InputError(f"no image in {str(folder)!r} (endings: {', '.join(IMAGE_SUFFIXES)})")
    return paths


def _name(item, i: int) -> str:
    return Path(item).name if isinstance(item, (str, Path)) else getattr(item, "filename", "") or f"image {i + 1}"


class Images:
    """Images for :func:`probe.runs.analysis.analyze` (in place of texts): paths or Pillow images, read
    when batched, all at one size.

    Args:
        processor: the model's :class:`~probe.loading.pixels.PixelProcessor` (``lm.tokenizer``).
        items: image paths or Pillow images.
        image_size: (height, width) in pixels, multiples of the patch side; default the model's own
            size. Another size needs a model that interpolates its position embeddings (ViT, DeiT,
            DINOv2, CLIP, SigLIP do), and gives a grid of height/patch x width/patch patches.
        interpolates: the model's forward takes ``interpolate_pos_encoding`` (sent for another size).

    Raises:
        InputError: no image, a processor that is not an image model's, or a bad size.
    """

    #: what one item is called in messages (``Analyzing 2 images``).
    noun = "image"

    def __init__(self, processor, items: Sequence, image_size: tuple[int, int] | None = None,
                 interpolates: bool = True) -> None:
        if not isinstance(processor, PixelProcessor):
            raise InputError("images need an image model (one with a patch size and an image size in its config)")
        items = [items] if isinstance(items, (str, Path)) else list(items)
        if not items:
            raise InputError("no image given")
        self.processor, self.items = processor, list(items)
        self.size = processor.target_size(image_size)
        self.resize_to = None if image_size is None else self.size
        # the switch for models that interpolate their position embeddings only when asked
        self.interpolate = interpolates and image_size is not None and tuple(image_size) != tuple(processor.size)
        self.grid = processor.grid(self.size)

    def __len__(self) -> int:
        return len(self.items)

    def batch(self, items: Sequence, start: int) -> ImageBatch:
        """One :class:`ImageBatch` of ``items`` (corpus positions from ``start``)."""
        p = self.processor
        resized = [p.resized(read_image(it), self.resize_to) for it in items]
        pixels = torch.stack([p.pixel_values(im) for im in resized])
        ids = torch.tensor([p.ids(self.grid)] * len(items), dtype=torch.long)
        B, T = ids.shape
        special = torch.zeros(B, T, dtype=torch.bool)
        special[:, :len(p.specials)] = True
        texts = [Text(_name(it, start + i), index=start + i) for i, it in enumerate(items)]
        return ImageBatch(ids, torch.ones(B, T, dtype=torch.long), None, torch.zeros(B, T, 2, dtype=torch.long),
                          special, torch.full((B, T), -1, dtype=torch.long), texts,
                          list(range(start, start + B)), [False] * B, pixel_values=pixels, grid=self.grid,
                          n_special=len(p.specials), images=[np.asarray(im, dtype=np.uint8) for im in resized],
                          interpolate=self.interpolate)

    def iter_batches(self, batch_size: int = 16) -> Iterator[ImageBatch]:
        """Batches of ``batch_size`` images, in order (all of one length: nothing to sort)."""
        for i in range(0, len(self.items), batch_size):
            yield self.batch(self.items[i:i + batch_size], i)


def images(lm, items: Sequence, image_size: tuple[int, int] | None = None) -> Images:
    """The images ``items`` (paths or Pillow images) ready for ``analyze(lm, images(lm, items))``.

    Args:
        lm: a loaded image model (:func:`probe.loading.models.load_model` of a ViT, DeiT, DINOv2, CLIP or
            SigLIP vision folder).
        items: image paths or Pillow images.
        image_size: (height, width) in pixels (see :class:`Images`).

    Raises:
        InputError: not an image model, no image, a bad size.
    """
    asks = "interpolate_pos_encoding" in inspect.signature(lm.model.forward).parameters
    return Images(lm.tokenizer, items, image_size, interpolates=asks)


def image_input(files, folder, limit: int | None, other_input: bool) -> list[str] | None:
    """The image paths of ``--image`` and ``--images`` (at most ``limit``), each checked readable
    before a model is loaded; None when neither was given.

    Raises:
        InputError: text input given too, a missing folder or file, a file Pillow cannot read.
    """
    if not files and folder is None:
        return None
    if other_input:
        raise InputError("give either images (--image, --images) or text (--text, --corpus, --pairs, --coref, "
                         "--syntax), not both")
    paths = [str(p) for p in files] + ([str(p) for p in image_paths(folder)] if folder is not None else [])
    paths = paths[:limit] if limit else paths
    for path in paths:
        read_image(path)
    return paths


def check_model_input(lm, paths: list[str] | None) -> None:
    """Refuse images for a text model and text for an image model, in one line.

    Raises:
        InputError: the input does not fit the model.
    """
    is_image_model = isinstance(lm.tokenizer, PixelProcessor)
    if paths is not None and not is_image_model:
        raise InputError(f"{lm.name} reads text, not images (an image model has a patch size and an image size "
                         "in its config)")
    if paths is None and is_image_model:
        raise InputError(f"{lm.name} is an image model: give images with --image FILE or --images FOLDER")
