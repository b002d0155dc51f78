"""The distribution: a wheel built from the source works on its own.

An editable install reads templates, scripts and data from the checkout, so it hides package data
that a wheel would leave out. Here the wheel is built (``pip wheel --no-deps``), installed into an
empty folder (``pip install --no-deps --target``) and ``python -m probe analyze`` runs from
another working directory with only that folder on the path: its report needs the templates, the
inline scripts and the built-in sample and probe set.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[1]


def _setuptools_at_least(major: int) -> bool:
    try:
        return int(version("setuptools").split(".")[0]) >= major
    except (PackageNotFoundError, ValueError):
        return False


def data_files() -> list[str]:
    """Every file under probe/ that is not Python source, relative to probe/."""
    return sorted(str(p.relative_to(ROOT / "probe")) for p in (ROOT / "probe").rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts)


def test_distribution_name_and_command():
    """The distribution has a name of its own (``probe`` on the package index is another project);
    the package and the command stay ``probe``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "probe-attention"
    assert project["scripts"] == {"probe": "probe.cli:entry"}


def test_package_data_globs_cover_every_data_file():
    """Each non-Python file under probe/ matches a package-data glob, so the wheel carries it."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["probe"]
    files = data_files()
    assert "report/templates/report.html.j2" in files and "data/sample.txt" in files
    missing = [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not missing, missing


@pytest.mark.slow
def test_wheel_installs_and_analyzes_on_its_own(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                             "reports", ".venv", ".pytest_cache"))
    wheels, clean, work = tmp_path / "wheels", tmp_path / "clean", tmp_path / "elsewhere"
    work.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # build with the setuptools already installed where it is new enough (no download needed), else
    # in pip's isolated build environment (which fetches the build requirements)
    isolation = ["--no-build-isolation"] if _setuptools_at_least(68) else []
    built = subprocess.run([*pip, "wheel", "--no-deps", *isolation, str(src), "-w", str(wheels)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("*.whl")
    assert wheel.name.startswith("probe_attention-")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in data_files() if f"probe/{f}" not in names]
    assert not missing, missing
    subprocess.run([*pip, "install", "--no-deps", "--target", str(clean), str(wheel)], check=True,
                   capture_output=True, timeout=600)

    env = {**os.environ, "PYTHONPATH": str(clean), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    where = subprocess.run([sys.executable, "-c", "import probe; print(probe.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(clean)
    out = work / "run"
    done = subprocess.run([sys.executable, "-m", "probe", "analyze", "--coref", "--out", str(out)], cwd=work,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "<canvas" in page and "coref" in page
    for name in ("heads.csv", "run.json", "coref.csv", "examples.npz"):
        assert (out / name).stat().st_size > 0, name
