"""probe: open up the attention of pretrained transformers.

Public API (the CLI is a thin layer over it)::

    from probe import load_model, capture_attention, analyze, verify
    lm = load_model("minilm")                  # embedded all-MiniLM-L6-v2
    captured = capture_attention(lm, "The cat sat on the mat.")
    captured[0]                                 # site 0 (encoder.0.self): [batch, heads, query, key]
    result = analyze(lm, ["First sentence.", "Second one."])
    result.heads                                # pandas DataFrame, one row per (layer, head)
    verify(lm).passed                           # from-scratch attention reproduces the model
    show(lm, "The cat sat on the mat.")         # interactive head view (Jupyter; offline)
    compare_runs(result, load_run("reports/smollm2-..."))  # per-head differences, B - A
    prune(lm, texts).to_json()                  # pruning curves (probe.pruning: gates, removal, saving)
    head_effects(lm, texts).heads               # zero / mean ablation effect of every head (probe.effects)
    attention_rollout(lm, "The cat sat.").row   # share of [CLS] (decoders: last token) from each input token
    attention_flow(lm, "The cat sat.").row      # the same by maximum flow (probe.flow; <= 64 tokens by default)
"""

import time as _time

#: perf_counter() when probe was first imported (the CLI reports the time spent importing).
IMPORT_STARTED = _time.perf_counter()

from .util import quiet_notebook_tqdm  # noqa: E402

quiet_notebook_tqdm()  # before transformers imports tqdm.auto: no TqdmWarning in a notebook without ipywidgets

from . import effects, linguistic, patterns, pruning, view  # noqa: E402,F401  their report sections register
from .accumulators import Accumulator  # noqa: E402
from .analysis import analyze, run  # noqa: E402
from .capture import attention_hooks, capture_attention  # noqa: E402
from .compare import compare_runs, load_run  # noqa: E402
from .core import LoadedModel  # noqa: E402
from .effects import head_effects  # noqa: E402
from .effects.composition import composition_scores  # noqa: E402
from .effects.dla import direct_logit_attribution  # noqa: E402
from .effects.patching import Pair, patch_heads  # noqa: E402
from .errors import ProbeError  # noqa: E402
from .flow import attention_flow  # noqa: E402
from .hooks import Hooks, ensure_eager, measuring  # noqa: E402
from .inputs import Text  # noqa: E402
from .models import from_pretrained_objects, list_models, load_model  # noqa: E402
from .pruning.experiment import prune  # noqa: E402
from .reference import attention, swap_attention  # noqa: E402
from .rollout import Attribution, attention_rollout  # noqa: E402
from .sites import Site  # noqa: E402
from .stats import STATISTICS, HeadStatistics  # noqa: E402
from .steps import attention_steps  # noqa: E402
from .verification import verify  # noqa: E402
from .view import HeadView, ModelView, model_view, show  # noqa: E402
from .view.rollout import RolloutView, rollout_view  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ProbeError", "Site", "LoadedModel", "list_models", "load_model", "from_pretrained_objects", "Hooks",
    "ensure_eager", "measuring", "Text", "capture_attention", "attention_hooks", "Accumulator", "STATISTICS",
    "HeadStatistics", "analyze", "run", "attention", "swap_attention", "verify",
    "show", "HeadView", "load_run", "compare_runs", "prune", "head_effects", "attention_rollout", "attention_flow",
    "Attribution", "Pair", "patch_heads", "direct_logit_attribution", "composition_scores",
    "rollout_view", "RolloutView",
    "attention_steps", "model_view", "ModelView",
]
