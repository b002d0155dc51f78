"""Two runs head by head (``probe compare``), and reading run folders back.

    from probe import load_run, compare_runs
    a = load_run("reports/minilm-...")            # heads.csv + run.json (+ examples.npz) -> AnalysisResult
    df = compare_runs(a, "reports/smollm2-...")   # one row per head: delta_<statistic> = B - A, labels, status

:mod:`probe.compare.diff` (alignment by relative depth, removed heads), :mod:`probe.compare.runs`
(:func:`load_run`), :mod:`probe.compare.report` (the comparison folder).
"""

from .diff import align_layers, compare_runs, label_counts, layer_summary, most_changed
from .report import write_compare
from .runs import EXAMPLES_FILE, load_run

__all__ = ["load_run", "compare_runs", "align_layers", "layer_summary", "label_counts", "most_changed",
           "write_compare", "EXAMPLES_FILE"]
