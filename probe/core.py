"""The loaded model every part of probe works on: :class:`LoadedModel`.

A small module at the bottom of the import graph, so that capture, analyses and verification can
name the type without importing the loader (:mod:`probe.loading.models` builds it and re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from .architectures import ArchSpec, HeadGeometry, sites
from .errors import UnsupportedAnalysisError
from .sites import Site


@dataclass
class LoadedModel:
    """A model ready for probing, with everything probe needs to know about it.

    Attributes:
        model: the ``transformers`` model, eval mode, eager attention.
        tokenizer: its tokenizer (a pad token is set if it had none; padding side is right).
        spec: where its attention pieces live (:class:`~probe.architectures.ArchSpec`).
        geometry: layer/head counts and sizes.
        name: what the user asked for (alias, Hub id, path).
        source: where it was loaded from (folder, Hub id or GGUF path).
        max_length: longest sequence in tokens the model accepts.
        load_seconds: wall time of loading (seconds).
        notes: what loading changed or the user should know.
        pruned: for a model whose heads were physically removed, which heads are gone and how each
            layer's heads sit in its projections (:class:`probe.loading.pruned.PrunedHeads`, original
            numbering); None for a complete model.
    """

    model: nn.Module
    tokenizer: object
    spec: ArchSpec
    geometry: HeadGeometry
    name: str
    source: str
    max_length: int
    load_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    pruned: object | None = None

    def require_all_heads(self, analysis: str) -> None:
        """Refuse a causal analysis on a model whose heads were physically removed (its weight slots no
        longer follow the original numbering): the one refusal every entry point raises.

        Args:
            analysis: what was asked, for the message ("ablation effects", "patching", ...).

        Raises:
            UnsupportedAnalysisError: ``pruned`` is set.
        """
        if self.pruned is not None:
            raise UnsupportedAnalysisError(f"{self.name} has heads removed from its weights: {analysis} needs "
                                           "every head; measure the original model")

    @property
    def kind(self) -> str:
        """``"encoder"``, ``"decoder"`` (decoder-only, causal) or ``"encoder-decoder"``
        (:data:`probe.architectures.MODEL_KINDS`)."""
        return self.spec.kind

    @property
    def sites(self) -> list[Site]:
        """Every attention site of the model, in forward order (see :mod:`probe.sites`)."""
        return sites(self.model.config)

    @property
    def model_type(self) -> str:
        """The Hugging Face ``config.model_type`` (``bert``, ``gpt2``, ``llama`` ...)."""
        return self.model.config.model_type
