"""``probe analyze --image / --images / --image-size``: images as the analysed input."""

from __future__ import annotations

import re

import click

from ..errors import InputError
from .options import stacked

#: --image, --images, --image-size: images instead of text (image models).
image_options = stacked(
    click.option("--image", "image_files", multiple=True, metavar="FILE",
                 help="An image to analyze with an image model (ViT, DeiT, DINOv2, CLIP or SigLIP vision; "
                      "repeatable). Read with Pillow, resized and normalised as the model's processor says."),
    click.option("--images", "image_folder", type=click.Path(file_okay=False, path_type=str), default=None,
                 metavar="FOLDER", help="Every image file of a folder (png, jpg, gif, bmp, webp, tif), by name."),
    click.option("--image-size", default=None, metavar="HxW",
                 help="Resize images to H x W pixels (multiples of the patch side) instead of the model's size: "
                      "a non-square grid of H/patch x W/patch patches (position embeddings interpolated)."),
)


def parse_size(text: str | None) -> tuple[int, int] | None:
    """``"224x320"`` -> (224, 320); None stays None.

    Raises:
        InputError: not two positive whole numbers joined by ``x``.
    """
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m or not int(m.group(1)) or not int(m.group(2)):
        raise InputError(f"--image-size must be HEIGHTxWIDTH in pixels, e.g. 224x320; got {text!r}")
    return int(m.group(1)), int(m.group(2))
