"""``probe analyze --image / --images / --image-size``: images as the analysed input."""

from __future__ import annotations

import click

from ..settings import AnalyzeSettings
from .options import setting_option, stacked

#: --image, --images, --image-size: images instead of text (image models).
image_options = stacked(
    setting_option(AnalyzeSettings, "images", "--image", multiple=True, metavar="FILE",
                   help="An image to analyze with an image model (ViT, DeiT, DINOv2, CLIP or SigLIP vision; "
                        "repeatable). Read with Pillow, resized and normalised as the model's processor says."),
    setting_option(AnalyzeSettings, "image_folder", "--images", type=click.Path(file_okay=False, path_type=str),
                   metavar="FOLDER", help="Every image file of a folder (png, jpg, gif, bmp, webp, tif), by name."),
    setting_option(AnalyzeSettings, "image_size", "--image-size", metavar="HxW", callback=None,  # checked as the run's
                   help="Resize images to H x W pixels (multiples of the patch side) instead of the model's size: "
                        "a non-square grid of H/patch x W/patch patches (position embeddings interpolated)."),
)
