"""The pictures of an analysed image: the report's section (:mod:`probe.report.images`), the
notebook view, and ``probe.show(result)`` on an analysis of images draw them.

For each kept image (:class:`probe.images.maps.ImageExample`): the image as the model saw it, the
attention rollout and the attention flow of the drawn query (the class token, or a chosen patch)
over the patches (flow where it is within the image's solve limit, else a line saying why), and per
layer the head mean and every head's row, each laid over the image as a heat overlay
(:mod:`probe.images.overlay`). Pictures are PNG data URIs: the page stays one file that loads
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from markupsafe import escape

from ..errors import InputError
from ..sites import head_name
from .grid import GRID_LABELS
from .maps import ImageExample
from .overlay import overlay, png_data_uri

#: Width in pixels of each head's picture (the image, rollout and layer means are drawn larger).
TILE = 96
#: Width in pixels of the image, its rollout and its flow.
LARGE = 224


def _figure(uri: str, caption: str, width: int) -> str:
    return (f'<figure class="img-att"><img src="{uri}" width="{width}" alt="{escape(caption)}" '
            f'title="{escape(caption)}"><figcaption>{escape(caption)}</figcaption></figure>')


def image_html(ex: ImageExample, tile: int = TILE) -> str:
    """The HTML of one image's pictures: the image, the rollout and the flow (or why the flow is
    left out), then a row per layer (its head mean and each head), every picture an ``<img>`` with
    a PNG data URI. Computes the flow (:meth:`~probe.images.maps.ImageExample.flow`) if not yet done."""
    R, C = ex.grid
    what = ex.query_name
    flow = ex.flow()
    parts = [f"<h3>{escape(ex.name)}: {R} x {C} patches, attention of {escape(what)}</h3>",
             '<div class="img-att-row">',
             _figure(png_data_uri(ex.pixels, LARGE), "the image as the model saw it", LARGE),
             _figure(png_data_uri(overlay(ex.pixels, ex.patches(ex.rollout())), LARGE),
                     f"rollout of {what} over the patches", LARGE)]
    if flow is not None:
        parts.append(_figure(png_data_uri(overlay(ex.pixels, ex.patches(flow)), LARGE),
                             f"flow of {what} over the patches", LARGE))
    parts.append("</div>")
    if flow is None:
        parts.append(f'<p class="img-att-note">{escape(ex.flow_note())}</p>')
    for layer, rows in enumerate(ex.rows):
        cells = [_figure(png_data_uri(overlay(ex.pixels, ex.patches(np.nanmean(rows, 0))), tile),
                         f"L{layer} mean of heads", tile)]
        cells += [_figure(png_data_uri(overlay(ex.pixels, ex.patches(row)), tile), head_name(layer, h), tile)
                  for h, row in enumerate(rows)]
        parts.append('<div class="img-att-row">' + "".join(cells) + "</div>")
    return "".join(parts)


STYLE = ("<style>.img-att-row{display:flex;flex-wrap:wrap;gap:4px;margin:4px 0}"
         ".img-att{margin:0;font-size:11px;text-align:center}.img-att-note{font-size:12px;color:#555}"
         ".img-att img{display:block;image-rendering:pixelated}"
         "</style>")


def caption() -> str:
    """What the pictures show, in words."""
    labels = ", ".join(GRID_LABELS)
    return ("Each picture lays one attention row over the image: a patch's colour (dark red to yellow) is its "
            "weight over the row's largest patch weight; cold patches show the image. The drawn row is the class "
            "token's (or the mean over every query row, for models without one). Rollout multiplies the layers' "
            "head means with the residual as an equal share (Abnar & Zuidema 2020); flow takes the same mixed maps "
            "as capacities and draws the maximum flow from the drawn token to each patch through the layers, "
            "the row divided by its sum (same paper). The heads table has each "
            f"head's grid distance and CLS, register, local, row and column shares, and the labels {labels}.")


@dataclass
class ImageView:
    """The pictures of one analysed image for a notebook (Jupyter: ``_repr_html_``; ``.html``).

    Attributes:
        html: the pictures' HTML (self-contained: PNG data URIs, no script).
    """

    html: str

    def _repr_html_(self) -> str:
        return STYLE + self.html


def show_image(result, image: int = 0, tile: int = TILE) -> ImageView:
    """The attention pictures of image ``image`` of an analysis of images (for a notebook).

    Args:
        result: an :class:`probe.records.AnalysisResult` of :func:`probe.images.analyze_images`
            (or of ``analyze`` with an :class:`probe.images.maps.ImageMaps` accumulator).
        image: which kept image (0: the first).
        tile: width in pixels of each head's picture.

    Raises:
        InputError: no image pictures in ``result``, or ``image`` out of range.
    """
    examples = result.results.get("image_maps") or []
    if not 0 <= image < len(examples):
        raise InputError(f"no image {image} among the {len(examples)} kept images of this result")
    return ImageView(image_html(examples[image], tile))
