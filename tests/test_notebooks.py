"""The notebooks run top to bottom (code cells executed in order, plots on the Agg backend)."""

import json
from pathlib import Path

import matplotlib
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert cells, f"{path.name} has no code cell"
    scope: dict = {}
    for i, cell in enumerate(cells):
        exec(compile("".join(cell["source"]), f"{path.name}[cell {i}]", "exec"), scope)
    CHECKS[path.name](scope)


def _quickstart(scope: dict) -> None:
    """The quick start captures one sentence (rows sum to 1) and ends with a written run folder."""
    assert sorted(p.name for p in scope["path"].iterdir()) == ["examples.npz", "heads.csv", "index.html", "run.json"]
    sums = scope["attn"].sum(-1)
    assert float((sums - 1).abs().max()) < 1e-5
    assert len(scope["heads"]) == 72


#: notebook -> what it must have computed (every notebook has an entry: a new one without checks fails).
CHECKS = {"quickstart.ipynb": _quickstart}
