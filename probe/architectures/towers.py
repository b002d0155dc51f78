"""Dual encoders (CLIP, SigLIP): one model that holds a text tower and a vision tower.

A dual encoder's config holds a ``text_config`` and a ``vision_config``, and its model class
embeds both inputs (``get_text_features`` and ``get_image_features``). Each tower is a model of
its own kind in transformers (``CLIPTextModel`` and ``CLIPVisionModel`` for CLIP), whose config
class is the sub-config's: :func:`tower_class` finds it in the pair's own modeling module by that
config class, and :func:`tower_weights` hands it the pair's weights under the prefix where they
sit (``text_model.``, ``vision_model.``), so nothing here names a family.
"""

from __future__ import annotations

import sys

#: The towers of a dual encoder, in the order probe reports them, with their sub-config attribute.
TOWERS = (("text", "text_config"), ("vision", "vision_config"))


def is_pair(config, model_class=None) -> bool:
    """Whether ``config`` is a dual encoder: a ``text_config`` and a ``vision_config``, and (when
    ``model_class`` is given) a class that embeds both (``get_text_features``, ``get_image_features``)."""
    if getattr(config, "text_config", None) is None or getattr(config, "vision_config", None) is None:
        return False
    if getattr(config, "is_encoder_decoder", False):
        return False
    return model_class is None or (hasattr(model_class, "get_text_features")
                                   and hasattr(model_class, "get_image_features"))


def tower_class(pair_class, sub_config):
    """The model class of one tower: a ``PreTrainedModel`` of the pair's modeling module whose
    ``config_class`` is ``type(sub_config)`` (the shortest name: ``CLIPTextModel`` rather than
    ``CLIPTextModelWithProjection``).

    Raises:
        ValueError: the module has none.
    """
    module = sys.modules[pair_class.__module__]
    found = [c for c in vars(module).values() if isinstance(c, type) and getattr(c, "config_class", None)
             is type(sub_config) and hasattr(c, "from_pretrained") and c.__name__.endswith("Model")]
    if not found:
        raise ValueError(f"{pair_class.__name__}: no tower model class for {type(sub_config).__name__}")
    return min(found, key=lambda c: (len(c.__name__), c.__name__))


def tower_weights(pair_state: dict, tower_keys: list[str]) -> dict:
    """The tower's weights out of the pair's state dict: every tower key under the one prefix of the
    pair (``""``, ``"text_model."`` ...) that holds them all.

    Raises:
        ValueError: no prefix holds every key.
    """
    first = tower_keys[0]
    prefixes = sorted({k[: len(k) - len(first)] for k in pair_state if k.endswith(first)}, key=len)
    for prefix in prefixes:
        if all(prefix + k in pair_state for k in tower_keys):
            return {k: pair_state[prefix + k] for k in tower_keys}
    raise ValueError(f"the pair's weights hold no prefix with every tower weight ({first} ...)")
