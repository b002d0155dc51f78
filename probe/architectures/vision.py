"""What differs between vision transformers: the special tokens before the patches.

A vision transformer's sequence is its special tokens (a class token, registers, a distillation
token) followed by the image's patches in row-major order. The names below are what reports show;
the counts are checked against the sequence the model produces (:mod:`probe.images`).
"""

from __future__ import annotations

#: Special tokens of a model type, in sequence order, where they are not the default.
SPECIAL_TOKENS: dict[str, tuple[str, ...]] = {
    "deit": ("[CLS]", "[DIST]"),
    "siglip_vision_model": (),
    "siglip2_vision_model": (),
}

#: The name of a register token (DINOv2 with registers, Darcet et al. 2024).
REGISTER = "[REG]"


def is_vision(config) -> bool:
    """Whether ``config`` is an image model that splits its input into patches (it has an
    ``image_size`` and a ``patch_size`` and no token vocabulary)."""
    return (getattr(config, "patch_size", None) is not None and getattr(config, "image_size", None) is not None
            and getattr(config, "vocab_size", None) is None)


def special_tokens(config) -> tuple[str, ...]:
    """Names of the special tokens before the patches, in order: ``[CLS]`` then one ``[REG]`` per
    register (``num_register_tokens``), unless :data:`SPECIAL_TOKENS` names the type's own."""
    model_type = getattr(config, "model_type", None)
    if model_type in SPECIAL_TOKENS:
        return SPECIAL_TOKENS[model_type]
    return ("[CLS]",) + (REGISTER,) * int(getattr(config, "num_register_tokens", 0) or 0)
