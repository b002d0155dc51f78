"""The notebooks run top to bottom in a Jupyter kernel (nbclient + ipykernel), then a check of what
they computed runs in the same kernel. Without nbclient or ipykernel the code cells run in this
process, in order, and the same check runs on their variables. The committed notebooks carry no
outputs."""

import inspect
import json
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _kernel_available() -> bool:
    try:
        import ipykernel  # noqa: F401
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
        from jupyter_client.kernelspec import KernelSpecManager

        return "python3" in KernelSpecManager().find_kernel_specs()
    except Exception:  # noqa: BLE001 - any missing piece means: run the cells in this process
        return False


def _check_cell(check) -> str:
    """The check function's source and a call on the kernel's variables; first, that the kernel
    imported probe from this checkout."""
    return (f"import probe as _p, pathlib as _pl\nassert _pl.Path(_p.__file__).resolve().is_relative_to({str(ROOT)!r}),"
            f" _p.__file__\n{textwrap.dedent(inspect.getsource(check))}\n{check.__name__}(globals())\n")


def test_notebooks_have_checks_and_no_outputs():
    assert NOTEBOOKS and sorted(CHECKS) == sorted(p.name for p in NOTEBOOKS)
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name}: outputs committed"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    check = CHECKS[path.name]
    if _kernel_available():
        import nbformat
        from nbclient import NotebookClient

        nb = nbformat.read(path, as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell(_check_cell(check)))
        monkeypatch.setenv("PYTHONWARNINGS", "ignore")
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    monkeypatch.chdir(ROOT)
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    scope: dict = {}
    for i, cell in enumerate(cells):
        exec(compile("".join(cell["source"]), f"{path.name}[cell {i}]", "exec"), scope)
    check(scope)


# Checks run inside the notebook's kernel (their source is sent there): they import what they use.

def _quickstart(scope: dict) -> None:
    """The quick start captures one sentence (rows sum to 1) and ends with a written run folder."""
    assert sorted(p.name for p in scope["path"].iterdir()) == [
        ".probe-files.json", "examples.npz", "heads.csv", "index.html", "run.json"]
    sums = scope["attn"].sum(-1)
    assert float((sums - 1).abs().max()) < 1e-5
    assert len(scope["heads"]) == 72


def _explore(scope: dict) -> None:
    """The exploration notebook: the view holds the captured probabilities (rounded to 1e-3), the
    comparison is B - A of the aligned heads, the comparison folder exists, verification passed."""
    import numpy as np

    from probe.view.data import decoded_map

    view, captured = scope["view"], scope["captured"]
    n = view.data["n"]
    assert view.data["layers"] == list(range(6)) and view.data["initial"]["layer"] == 2
    for li, layer in enumerate(view.data["layers"]):
        for h in range(12):
            err = np.abs(decoded_map(view.data, li, h) - captured.probs[layer][0, h, :n, :n].numpy()).max()
            assert err <= 5e-4, (layer, h, err)
    assert len(scope["heads"]) == 72 and len(scope["result_smol"].heads) == 270
    diff = scope["diff"]
    assert len(diff) == 72 and diff.attrs["layer_map"] == [0, 6, 12, 17, 23, 29]
    ha = scope["result"].heads.set_index(["layer", "head"])
    hb = scope["result_smol"].heads.set_index(["layer", "head"])
    both = diff[diff["status"] == "both"]
    assert len(both) == 6 * 9 and (diff.loc[diff["head"] >= 9, "status"] == "only in A").all()
    for row in both.to_dict("records"):
        want = hb.loc[(row["layer_b"], row["head"]), "prev"] - ha.loc[(row["layer"], row["head"]), "prev"]
        assert row["delta_prev"] == want
    layers = scope["layers"]
    assert abs(layers.loc[1, "first_b"] - hb.loc[6, "first"].mean()) < 1e-12
    assert sorted(p.name for p in scope["cmp_path"].iterdir()) == [
        ".probe-files.json", "compare.csv", "compare.json", "index.html"]
    assert scope["report"].passed and scope["report"].max_abs_diff <= 1e-5


#: notebook -> what it must have computed (every notebook has an entry: a new one without checks fails).
CHECKS = {"quickstart.ipynb": _quickstart, "explore.ipynb": _explore}
