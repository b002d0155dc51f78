"""probe: open up the attention of pretrained transformers.

Public API (the CLI is a thin layer over it)::

    from probe import load_model, capture_attention, analyze, verify
    lm = load_model("minilm")                  # embedded all-MiniLM-L6-v2
    captured = capture_attention(lm, "The cat sat on the mat.")
    captured[0]                                 # site 0 (encoder.0.self): [batch, heads, query, key]
    result = analyze(lm, ["First sentence.", "Second one."])
    result.heads                                # pandas DataFrame, one row per (layer, head)
    result, folder = analyze_run("vit", images="photos/")  # what `probe analyze` does, one call, any input
    verify(lm).passed                           # from-scratch attention reproduces the model
    show(lm, "The cat sat on the mat.")         # interactive head view (Jupyter; offline)
    compare_runs(result, load_run("reports/smollm2-..."))  # per-head differences, B - A
    prune(lm, texts).to_json()                  # pruning curves (probe.pruning: gates, removal, saving)
    head_effects(lm, texts).heads               # zero / mean ablation effect of every head (probe.effects)
    attention_rollout(lm, "The cat sat.").row   # share of [CLS] (decoders: last token) from each input token
    attention_flow(lm, "The cat sat.").row      # the same by maximum flow (probe.measures.flow; <= 64 tokens)
    why(lm, "The cat sat.", "L1H0").contributions  # each score split by what built its query and key (probe.qk)
    run_patch(lm, PatchSettings(direction="noise")).save("reports/p")  # any command as one call (probe.settings)
    set_threads(1)                              # torch's and numba's threads (probe.threads: the thread policy)
"""

import importlib as _importlib
import time as _time

#: perf_counter() when probe was first imported (the CLI reports the time spent importing).
IMPORT_STARTED = _time.perf_counter()

from .threads import apply_environment as _apply_thread_policy  # noqa: E402

_apply_thread_policy()  # first: OpenMP workers that sleep, sized to this process's cores (probe.threads)

from .util import quiet_notebook_tqdm  # noqa: E402

quiet_notebook_tqdm()  # before transformers imports tqdm.auto: no TqdmWarning in a notebook without ipywidgets

__version__ = "0.1.0"

#: Each public name and the module it lives in. Importing probe imports none of them (torch,
#: transformers, pandas and scikit-learn take seconds): the first use of ``probe.NAME`` (or
#: ``from probe import NAME``) imports its module, so ``probe --help`` and a usage error answer at once.
_PUBLIC = {
    "Accumulator": ".measures.accumulators", "analyze": ".runs.analysis", "run": ".runs.analysis",
    "attention_hooks": ".capture.maps", "capture_attention": ".capture.maps",
    "compare_runs": ".compare", "load_run": ".compare", "LoadedModel": ".core",
    "head_effects": ".effects", "composition_scores": ".effects.composition",
    "direct_logit_attribution": ".effects.dla", "Pair": ".effects.patching", "patch_heads": ".effects.patching",
    "ProbeError": ".errors", "attention_flow": ".measures.flow",
    "Hooks": ".capture.hooks", "ensure_eager": ".capture.hooks", "measuring": ".capture.hooks", "Text": ".text.inputs",
    "from_pretrained_objects": ".loading.models", "list_models": ".loading.models", "load_model": ".loading.models",
    "prune": ".pruning.experiment", "attention": ".capture.reference",
    "swap_attention": ".capture.reference.swap",
    "Attribution": ".measures.rollout", "attention_rollout": ".measures.rollout", "Site": ".sites",
    "STATISTICS": ".measures.stats", "HeadStatistics": ".measures.stats", "attention_steps": ".measures.steps",
    "verify": ".verification", "why": ".qk", "Why": ".qk",
    "HeadView": ".view", "ModelView": ".view", "model_view": ".entries.notebook", "show": ".entries.notebook",
    "RolloutView": ".view.rollout", "rollout_view": ".entries.notebook", "analyze_run": ".entries.analyze",
    "run_analyze": ".entries.kinds", "run_verify": ".entries.kinds", "run_prune": ".entries.kinds",
    "run_effects": ".entries.kinds", "run_patch": ".entries.kinds", "run_path": ".entries.kinds",
    "run_circuit": ".entries.kinds", "run_why": ".entries.kinds", "run_compare": ".entries.kinds",
    "run_kind": ".entries.kinds", "RunResult": ".entries.result", "Console": ".entries.result",
    "Explorer": ".live.widget", "set_threads": ".threads",
}


def __getattr__(name: str):
    """``probe.NAME``: the public name, its module imported on first use (PEP 562)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'probe' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


__all__ = [
    "ProbeError", "Site", "LoadedModel", "list_models", "load_model", "from_pretrained_objects", "Hooks",
    "ensure_eager", "measuring", "Text", "capture_attention", "attention_hooks", "Accumulator", "STATISTICS",
    "HeadStatistics", "analyze", "run", "attention", "swap_attention", "verify",
    "show", "HeadView", "load_run", "compare_runs", "prune", "head_effects", "attention_rollout", "attention_flow",
    "Attribution", "Pair", "patch_heads", "direct_logit_attribution", "composition_scores",
    "rollout_view", "RolloutView",
    "attention_steps", "model_view", "ModelView", "why", "Why", "analyze_run",
    "run_analyze", "run_verify", "run_prune", "run_effects", "run_patch", "run_path", "run_circuit", "run_why",
    "run_compare", "run_kind", "RunResult", "Console", "Explorer", "set_threads",
]
