"""A dual encoder (CLIP, SigLIP) analysed as the pair a user loads: its text tower on text and its
vision tower on images, in one run whose heads are named by tower.

:func:`load_towers` loads the pair once and splits it into two :class:`~probe.core.LoadedModel`\\ s
that hold the pair's own weights (:mod:`probe.architectures.towers`): the text tower with the
pair's tokenizer, the vision tower with its image processor (:class:`probe.loading.pixels.PixelProcessor`).
:func:`analyze_towers` measures each on its input and joins the results: one heads table with
``stack`` naming the tower (``text``, ``vision``), the text tower's examples and the vision
tower's pictures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd
from torch import nn

from ..architectures.towers import TOWERS, is_pair, tower_class, tower_weights
from ..core import LoadedModel
from ..errors import InputError, ModelLoadError
from ..images import analyze_images
from ..loading import models as loading  # peek_config read as an attribute: a test may stand in for it
from ..loading.checkpoints import load_folder
from ..loading.models import from_pretrained_objects
from ..loading.pixels import processor_for
from ..records import AnalysisResult
from ..runs.analysis import analyze


@dataclass
class Towers:
    """The two towers of one dual encoder.

    Attributes:
        name: the pair's name (folder or Hub id).
        text: the text tower (the pair's tokenizer).
        vision: the vision tower (its image processor).
    """

    name: str
    text: LoadedModel
    vision: LoadedModel


def split_pair(model: nn.Module) -> dict[str, nn.Module]:
    """``{"text": ..., "vision": ...}``: each tower built from its sub-config and given the pair's
    weights (eval mode, the pair's dtype).

    Raises:
        ModelLoadError: ``model`` is not a dual encoder, or a tower's weights are not in it.
    """
    if not is_pair(model.config, type(model)):
        raise ModelLoadError(f"{type(model).__name__} is not a dual encoder (a text and a vision tower)")
    state = model.state_dict()
    out = {}
    for tower, attr in TOWERS:
        sub = getattr(model.config, attr)
        try:
            built = tower_class(type(model), sub)(sub)
            built.load_state_dict(tower_weights(state, list(built.state_dict())))
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        out[tower] = built.to(next(model.parameters()).dtype).eval()
    return out


def towers_of(model: nn.Module, tokenizer, processor, name: str = "custom") -> Towers:
    """The :class:`Towers` of a built pair with its tokenizer and its vision tower's
    :class:`~probe.loading.pixels.PixelProcessor`.

    Raises:
        ModelLoadError: not a dual encoder.
        UnsupportedArchitectureError: a tower probe cannot measure.
    """
    parts = split_pair(model)
    return Towers(name, from_pretrained_objects(parts["text"], tokenizer, name=f"{name} (text tower)"),
                  from_pretrained_objects(parts["vision"], processor, name=f"{name} (vision tower)"))


def load_towers(name: str, dtype=None) -> Towers:
    """Load a dual encoder from a folder or Hub id and split it into its towers.

    Raises:
        ModelLoadError: not a dual encoder, or a folder that cannot be read.
    """
    try:
        model, tokenizer = load_folder(name, dtype)
    except OSError as exc:
        raise ModelLoadError(f"cannot load {name}: {str(exc).splitlines()[0]}") from None
    return towers_of(model, tokenizer, processor_for(name, model.config.vision_config), name)


def _named(heads: pd.DataFrame, tower: str) -> pd.DataFrame:
    heads = heads.drop(columns=[c for c in ("stack", "kind") if c in heads])
    return pd.concat([pd.DataFrame({"stack": tower, "kind": "self"}, index=heads.index), heads], axis=1)


def analyze_towers(towers: Towers, texts: Sequence, images: Sequence, **kwargs) -> AnalysisResult:
    """Measure both towers: the text tower on ``texts`` (:func:`probe.runs.analysis.analyze`), the vision
    tower on ``images`` (:func:`probe.images.analyze_images`), joined into one result.

    Args:
        towers: the pair's towers (:func:`load_towers`).
        texts: texts for the text tower.
        images: image paths or Pillow images for the vision tower.
        **kwargs: passed to both analyses (batch_size, thresholds ...).

    Returns:
        One :class:`~probe.records.AnalysisResult`: ``heads`` holds every head of both towers,
        ``stack`` naming the tower (``text`` first), the grid columns empty on the text tower's rows;
        the text tower's statistics, counts and examples; the vision tower's pictures
        (``results["image_maps"]``); ``results["towers"]`` each tower's own result.

    Raises:
        InputError: no text or no image.
    """
    if not texts or not images:
        raise InputError("a dual encoder's run needs both text (for its text tower) and images (for its vision tower)")
    text = analyze(towers.text, texts, **kwargs)
    vision = analyze_images(towers.vision, images, **kwargs)
    heads = pd.concat([_named(text.heads, "text"), _named(vision.heads, "vision")], ignore_index=True)
    model = {**text.model, "name": towers.name, "towers": {"text": text.model, "vision": vision.model}}
    notes = text.notes + [n for n in vision.notes if n not in text.notes]
    return replace(text, model=model, heads=heads, notes=notes,
                   results={**vision.results, **text.results, "image_maps": vision.results.get("image_maps"),
                            "towers": {"text": text, "vision": vision}})


def is_pair_model(model_name: str) -> bool:
    """Whether ``model_name`` is a dual encoder on this machine (its config read without weights;
    a Hub id not yet downloaded reads as False, and loading it then says what it is)."""
    config = loading.peek_config(model_name)
    return config is not None and is_pair(config)

