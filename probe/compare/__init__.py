"""Two runs head by head (``probe compare``), and reading run folders back.

    from probe import load_run, compare_runs
    a = load_run("reports/minilm-...")            # heads.csv + run.json (+ examples.npz) -> AnalysisResult
    df = compare_runs(a, "reports/smollm2-...")   # one row per head: delta_<statistic> = B - A, labels, status

:mod:`probe.compare.diff` (alignment by relative depth, removed heads), :mod:`probe.compare.runs`
(:func:`load_run`), :mod:`probe.compare.report` (the comparison folder).
"""

import importlib as _importlib

from .diff import align_layers, compare_runs, label_counts, layer_summary, most_changed
from .runs import EXAMPLES_FILE, load_run


def __getattr__(name: str):
    """``write_compare``, imported on first use: :mod:`.report` imports :mod:`probe.report`, whose
    sections read run files through :mod:`.runs` (this package), so importing it here would make
    ``import probe.report`` in a fresh interpreter a cycle."""
    if name == "write_compare":
        return _importlib.import_module(".report", __name__).write_compare
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["load_run", "compare_runs", "align_layers", "layer_summary", "label_counts", "most_changed",
           "write_compare", "EXAMPLES_FILE"]
