"""Attention on images: vision transformers (ViT, DeiT, DINOv2 with registers, CLIP and SigLIP
vision towers) read images as special tokens then a grid of patches.

:func:`images` turns image files or Pillow images into batches :func:`probe.runs.analysis.analyze`
takes; :func:`analyze_images` adds the grid measures (:class:`GridAttention`) and the pictures
(:class:`ImageMaps`, drawn by :func:`show_image`, ``probe.show(result)`` and the report's
section). docs/images.md has the definitions.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core import LoadedModel
from ..records import AnalysisResult
from ..runs.analysis import analyze
from .batches import IMAGE_SUFFIXES, ImageBatch, Images, image_paths, images, read_image
from .grid import GRID_LABELS, MEASURES, GridAttention, grid_geometry
from .maps import MAX_FLOW_SOLVES, ImageExample, ImageMaps
from .overlay import heat_cells, overlay, png_data_uri
from .view import ImageView, image_html, show_image

__all__ = [
    "GRID_LABELS", "IMAGE_SUFFIXES", "MAX_FLOW_SOLVES", "MEASURES", "GridAttention", "ImageBatch", "ImageExample",
    "ImageMaps", "ImageView", "Images", "analyze_images", "grid_accumulators", "grid_geometry", "heat_cells",
    "image_html", "image_paths", "images", "overlay", "png_data_uri", "read_image", "show_image",
]


def grid_accumulators(lm: LoadedModel, n_images: int = 2, query=None, flow_limit: int = MAX_FLOW_SOLVES) -> list:
    """The image accumulators for ``lm``: :class:`GridAttention` and :class:`ImageMaps` (the first
    ``n_images`` images, drawn row ``query``: None for ``[CLS]`` or the mean over queries, a
    (row, column) pair for a patch; flow drawn within ``flow_limit`` maximum-flow solves per image)."""
    specials = lm.tokenizer.specials
    return [GridAttention(lm.sites, lm.geometry.n_heads, specials),
            ImageMaps(lm.sites, specials, n_images, query, flow_limit)]


def analyze_images(lm: LoadedModel, items: Sequence, *, image_size: tuple[int, int] | None = None,
                   n_images: int = 2, query=None, flow_limit: int = MAX_FLOW_SOLVES, **kwargs) -> AnalysisResult:
    """Measure every head of an image model on images: :func:`probe.runs.analysis.analyze` with the grid
    measures and the pictures.

    Args:
        lm: a loaded image model.
        items: image paths or Pillow images.
        image_size: (height, width) in pixels (default: the model's processor's size).
        n_images: images whose attention is kept for pictures.
        query: the row drawn (see :func:`grid_accumulators`).
        flow_limit: most maximum-flow solves per image for its attention flow (T for one row, T^2 for
            the mean over queries; default :data:`MAX_FLOW_SOLVES`); above it the flow is left out.
        **kwargs: passed to :func:`probe.runs.analysis.analyze` (batch_size, accumulators ...).

    Returns:
        The :class:`~probe.records.AnalysisResult`; ``heads`` has the grid columns
        (``grid_distance``, ``cls_share`` ...) and labels, ``results["image_maps"]`` the pictures.

    Raises:
        InputError: not an image model, no image, a missing or unreadable file, a bad size.
    """
    extra = list(kwargs.pop("accumulators", ()))
    batches = images(lm, items, image_size)
    return analyze(lm, batches, accumulators=[*grid_accumulators(lm, n_images, query, flow_limit), *extra], **kwargs)
