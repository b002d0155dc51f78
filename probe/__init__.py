"""probe: open up the attention of pretrained transformers.

Public API (the CLI is a thin layer over it)::

    from probe import load_model, capture_attention, analyze, verify
    lm = load_model("minilm")                  # embedded all-MiniLM-L6-v2
    captured = capture_attention(lm, "The cat sat on the mat.")
    result = analyze(lm, ["First sentence.", "Second one."])
    result.heads                                # pandas DataFrame, one row per (layer, head)
    verify(lm).passed                           # from-scratch attention reproduces the model
"""

from .errors import ProbeError
from .models import LoadedModel, list_models, load_model, from_pretrained_objects
from .capture import capture_attention, attention_hooks, ensure_eager
from .stats import STATISTICS, HeadStatistics
from .analysis import analyze
from .reference import attention, swap_attention
from .verify import verify

__version__ = "0.1.0"

__all__ = [
    "ProbeError", "LoadedModel", "list_models", "load_model", "from_pretrained_objects",
    "capture_attention", "attention_hooks", "ensure_eager", "STATISTICS", "HeadStatistics",
    "analyze", "attention", "swap_attention", "verify",
]
