"""Draw examples/shapes.png: a 64 x 48 picture made for probe's image examples (CC0 1.0).

Run from the repository root: ``python examples/make_shapes.py`` (or give the output path). The
picture is drawn from nothing but Pillow's primitives, so it is the project's own work, dedicated to
the public domain under CC0 1.0 (https://creativecommons.org/publicdomain/zero/1.0/).
"""

from __future__ import annotations

import sys
from pathlib import Path

from PIL import Image, ImageDraw


def draw() -> Image.Image:
    """Sky, a sun at top right, a green hill and a red house with a door."""
    image = Image.new("RGB", (64, 48), (120, 170, 230))
    d = ImageDraw.Draw(image)
    d.ellipse((46, 4, 58, 16), fill=(250, 210, 40))
    d.ellipse((-20, 30, 84, 80), fill=(60, 150, 60))
    d.rectangle((12, 22, 30, 38), fill=(200, 40, 40))
    d.polygon([(10, 22), (21, 12), (32, 22)], fill=(110, 60, 30))
    d.rectangle((19, 30, 23, 38), fill=(60, 30, 10))
    return image


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("shapes.png")
    draw().save(out, format="PNG")
