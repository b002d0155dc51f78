"""One direction of imports: the module graph of probe/ (read with ast, nothing imported) has no
cycle, and no import hides inside a function except the deferred heavy libraries of an explicit
allow-list (and the command line's, which loads the library only when a command runs)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import probe

ROOT = Path(probe.__file__).parent

#: Libraries a function may import when it runs (each costs a second or more at start-up, and most
#: runs never need it); every such import says so in a comment.
DEFERRED = {"transformers", "sklearn", "statsmodels", "accelerate",
            "gguf",  # only while a GGUF file is loaded
            "ipywidgets", "tqdm",  # optional notebook widgets; tqdm.auto imported once with its warning silenced
            "numba",  # the statistics' compiled pass: imported (0.3-0.6 s) by its first call
            "networkx",  # the max-flow fallback only (probe.measures.maxflow)
            "scipy"}  # the audio measures' statistics, signal and filter modules (a text run imports none)
#: probe's own image and audio views, imported where a page has an image or audio to draw: a text model's page
#: imports neither stack (tests/test_start_up.py); importer -> the packages it may import in a function.
MEDIA_VIEWS = {"probe.report.images": ("probe.images",), "probe.report.speech": ("probe.audio",),
               "probe.view.html": ("probe.images",)}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _targets(module: str, path: Path, node, modules) -> list[str]:
    """The probe modules an import statement names (``from .x import y`` names ``x.y`` when y is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = _source(module, path, node)
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


def _source(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` statement imports from, resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(max(node.level - 1, 0)):
        package = package.rpartition(".")[0]
    return (package + ("." + node.module if node.module else "")) if node.level else node.module


def _graph():
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    inner = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for n in ast.walk(f)}  # module-level try/if imports (a platform fallback) are top-level
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if id(node) in in_function:
                inner.append((module, node))
                continue
            edges[module] |= {t for t in _targets(module, path, node, modules) if t in modules and t != module}
    return modules, edges, inner


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a list of modules, first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_module_graph_has_no_cycle():
    modules, edges, _ = _graph()
    assert len(modules) > 80
    assert edges["probe.capture.maps"] >= {"probe.capture.hooks", "probe.text.inputs", "probe.core"}
    assert _cycle(edges) is None, " -> ".join(_cycle(edges))


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_low_modules_do_not_reach_up():
    _, edges, _ = _graph()
    low = edges["probe.capture.maps"] | edges["probe.runs.analysis"] | edges["probe.verification"]
    assert "probe.loading.models" not in low
    assert not any(t.startswith("probe.pruning") for t in edges["probe.loading.checkpoints"])  # the loader: no pruning


def test_no_import_hides_in_a_function_but_the_deferred_heavy_libraries():
    _, _, inner = _graph()
    hidden = []
    for module, node in inner:
        if module == "probe.cli" or module.startswith("probe.cli."):
            continue  # commands import the library when they run: 'probe --help' starts without torch
        name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
        level = getattr(node, "level", 0)
        target = f"{module.rsplit('.', level)[0]}.{name}" if level else name
        if level and module in MEDIA_VIEWS and any(target.startswith(p + ".") for p in MEDIA_VIEWS[module]):
            continue  # a media view where the page draws one (MEDIA_VIEWS)
        if getattr(node, "level", 0) or name.split(".")[0] not in DEFERRED:
            hidden.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    assert hidden == []


def test_every_deferred_import_says_why():
    _, _, inner = _graph()
    modules = _modules()
    for module, node in inner:
        if module.startswith("probe.cli"):
            continue
        line = modules[module].read_text(encoding="utf-8").split("\n")[node.end_lineno - 1]
        assert "# deferred: " in line, f"{module}:{node.lineno}"


def _with_packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph Python runs: importing ``probe.a.b`` runs ``probe.a``'s ``__init__`` first, so an edge to a
    module is also an edge to each package above it (not to the top package ``probe``, which every module
    runs first, nor to a package the importer sits in, already running)."""
    out = {m: set() for m in edges}
    for module, targets in edges.items():
        for t in targets:
            bits = t.split(".")
            for p in (".".join(bits[:i]) for i in range(2, len(bits) + 1)):
                if p in edges and p != module and not module.startswith(p + "."):
                    out[module].add(p)
    return out


def test_the_graph_with_package_inits_has_no_cycle():
    _, edges, _ = _graph()
    full = _with_packages(edges)
    assert "probe.report" in full["probe.effects.report"]  # a submodule import runs its package
    assert _cycle(full) is None, " -> ".join(_cycle(full))


def test_package_edges_close_the_cycle_a_submodule_import_hides():
    edges = {"p.a": {"p.a.x"}, "p.a.x": {"p.b.y"}, "p.b": {"p.b.z"}, "p.b.y": set(), "p.b.z": {"p.a.w"},
             "p.a.w": set()}
    assert _cycle(edges) is None
    assert _cycle(_with_packages(edges)) == ["p.a", "p.a.x", "p.b", "p.b.z", "p.a"]


def _package(module: str, modules) -> str:
    """The package a module belongs to (itself for a package's ``__init__``)."""
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def test_no_private_name_is_imported_across_packages():
    modules, _, _ = _graph()
    crossing = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _source(module, path, node)
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private and source in modules and _package(source, modules) != _package(module, modules):
                crossing += [f"{module}: {name} from {source}" for name in private]
    assert crossing == []


#: Modules that run a model (a forward pass, or the loop that makes them). The views draw what they
#: are handed: probe.entries.notebook (and the commands' library functions) run the model and call them.
MODEL_RUNNING = {"probe.capture.maps", "probe.runs.analysis", "probe.entries.analyze", "probe.entries.texts",
                 "probe.entries.kinds", "probe.measures.steps",
                 "probe.measures.rollout", "probe.measures.flow", "probe.measures.rollout_examples",
                 "probe.capture.hooks", "probe.loading.models", "probe.loading.checkpoints", "probe.capture.blocks",
                 "probe.runs.distributed", "probe.entries.notebook", "probe.capture.reference", "probe.verification"}


def test_views_import_no_module_that_runs_a_model():
    _, edges, _ = _graph()
    views = [m for m in edges if m == "probe.view" or m.startswith("probe.view.")]
    assert len(views) >= 8
    running = {t for m in views for t in edges[m]
               if any(t == r or t.startswith(r + ".") for r in MODEL_RUNNING)}
    assert running == set()


#: What a command leaves to its library call (probe.entries, probe.live.session): loading a model or reading
#: its config, running it, measuring. Each name is a function of probe or transformers that does one of these.
LOADS_OR_COMPUTES = {"load_model", "peek_config", "preview_model", "from_pretrained", "from_pretrained_objects",
                     "capture_attention", "analyze", "forward", "measure", "patch_heads", "head_effects",
                     "prune", "verify", "why", "attention_rollout", "attention_flow", "composition_scores",
                     "direct_logit_attribution", "LiveSession"}
#: The libraries a model runs with: no command module imports them (its library call does).
MODEL_LIBRARIES = {"torch", "transformers", "numpy", "pandas", "accelerate"}


def test_no_command_module_loads_a_model_or_computes():
    """Every ``probe <command>`` is option parsing plus one library call: no module of probe/cli (read with
    ast, imports inside functions included) imports torch, transformers, numpy or pandas, or calls a function
    that loads a model, reads its config, runs it or measures (``probe live`` opens its session with
    :func:`probe.live.session.open_session`)."""
    modules = {m: p for m, p in _modules().items() if m == "probe.cli" or m.startswith("probe.cli.")}
    assert len(modules) >= 15
    found = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                    _source(module, path, node)]
                found += [f"{module}: imports {n}" for n in names if n.split(".")[0] in MODEL_LIBRARIES]
                if isinstance(node, ast.ImportFrom):  # a name, not a command module of probe/cli
                    found += [f"{module}: imports {a.name}" for a in node.names if a.name in LOADS_OR_COMPUTES
                              and f"{_source(module, path, node)}.{a.name}" not in modules]
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name in LOADS_OR_COMPUTES:
                    found.append(f"{module}:{node.lineno}: calls {name}")
    assert found == [], "\n".join(found)


def test_the_architecture_page_lists_every_module():
    """docs/architecture.md's layout table names every module: a top-level one in its own row, a package's
    in the package's row (``__init__.py`` of a package is the package)."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| `")}
    missing = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if len(rel.parts) == 1:
            if not any(f"`{rel.name}`" in key for key in rows):
                missing.append(str(rel))
        elif rel.name != "__init__.py":
            row = next((line for key, line in rows.items() if f"`{rel.parts[0]}/`" in key), "")
            if f"`{rel.name}`" not in row:
                missing.append(str(rel))
    assert missing == []


def _imports_alone(module: str) -> str:
    """'' when ``module`` imports in a fresh interpreter (nothing of probe imported before it), else the error."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    return "" if done.returncode == 0 else f"{module}: {done.stderr.strip().splitlines()[-1]}"


#: Modules that entered an import cycle through a package's __init__ when imported first (the graph
#: above reads ``from ..report.sections import x`` as an edge to the submodule, not to the package).
ENTRY_POINTS = ("probe.report", "probe.linguistic.report", "probe.patterns.report", "probe.view.section",
                "probe.compare", "probe.effects.report", "probe.cli")


def test_the_modules_that_closed_package_cycles_import_alone():
    """``import probe`` imports nothing heavy (its names load on first use), so no module can rely on
    probe/__init__.py having imported the others in a working order."""
    assert [e for e in map(_imports_alone, ENTRY_POINTS) if e] == []


@pytest.mark.slow
def test_every_module_imports_alone():
    """Every module imports in a fresh interpreter; a ``__main__`` module runs the command when
    imported, so it is run as the command instead (``--help``: exit status 0)."""
    modules = [m for m in sorted(_modules()) if not m.endswith("__main__")]
    assert [e for e in map(_imports_alone, modules) if e] == []
    for main in ("probe", "probe.cli"):
        done = subprocess.run([sys.executable, "-m", main, "--help"], capture_output=True, text=True)
        assert done.returncode == 0 and "Usage:" in done.stdout, (main, done.stderr[-500:])


def test_hooks_are_registered_in_one_module():
    """Every forward, pre-forward and backward hook on a module is registered by probe.capture.hooks
    (:class:`~probe.capture.hooks.Hooks`), which removes them all on exit."""
    registering = ("register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                   "register_full_backward_pre_hook", "register_backward_hook")
    found = [f"{module}:{node.lineno}" for module, path in _modules().items()
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Attribute) and node.attr in registering]
    assert found and all(f.startswith("probe.capture.hooks:") for f in found), found


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's ``lint-imports`` on the package under ``root``, with the contracts of ``root``'s
    pyproject.toml (the package found there first: PYTHONPATH)."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)


def _layers() -> list[list[str]]:
    """The layers of pyproject.toml's contract ``layers``, top first, each a list of module names."""
    config = tomllib.loads((ROOT.parent / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["id"] == "layers")
    return [[m.strip() for m in layer.split("|")] for layer in contract["layers"]]


def test_the_layer_contract_holds():
    """Every import of probe, direct or through others, goes down the layers declared in pyproject.toml
    (import-linter's ``layers`` contracts, no exception listed; ``.ci/run`` runs the same check)."""
    done = _lint_imports(ROOT.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 kept, 0 broken" in done.stdout
    assert "ignore_imports" not in (ROOT.parent / "pyproject.toml").read_text(encoding="utf-8")


def test_the_layer_contract_declares_every_package_and_matches_the_graph():
    """The contract names each package and top-level module once, and this file's own graph agrees with it:
    no edge of the module graph goes from a lower layer to a higher one."""
    layers = _layers()
    names = [m for layer in layers for m in layer]
    children = {p.stem if p.suffix else p.name for p in ROOT.iterdir()
                if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert sorted(names) == sorted(children)
    height = {m: len(layers) - i for i, layer in enumerate(layers) for m in layer}
    _, edges, _ = _graph()

    def top(module: str) -> str | None:
        bits = module.split(".")
        return bits[1] if len(bits) > 1 else None

    up = [f"{m} -> {t}" for m, ts in edges.items() for t in ts
          if top(m) and top(t) and top(m) != top(t) and height[top(m)] < height[top(t)]]
    assert up == []


def test_the_architecture_page_draws_the_declared_layers():
    """docs/architecture.md's import rules draw the contract's order, line for line."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = page[page.index("## Import rules"):].split("```text\n", 1)[1].split("```", 1)[0]
    assert [[m.strip() for m in line.split("|")] for line in block.strip().splitlines()] == _layers()


def test_an_upward_import_breaks_the_layer_contract(tmp_path):
    """The check can fail: a copy of probe with one import added from capture (low) to report (high)
    breaks the contract, and import-linter names that import."""
    shutil.copytree(ROOT, tmp_path / "probe", ignore=shutil.ignore_patterns("__pycache__", "data", "*.tsv"))
    shutil.copy(ROOT.parent / "pyproject.toml", tmp_path / "pyproject.toml")
    op = tmp_path / "probe" / "capture" / "op.py"
    op.write_text(op.read_text(encoding="utf-8") + "\nfrom ..report import page  # noqa: E402\n", encoding="utf-8")
    done = _lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "probe.capture.op -> probe.report.page" in done.stdout
    assert "probe's layers point down BROKEN" in done.stdout
