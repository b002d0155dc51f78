"""The first slow start-up is explained once (issue 19's start-up item)."""

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import probe
from probe.cli import analyze as analyze_cli
from probe.cli import main, options
from probe.cli import verify as verify_cli
from probe.loading import models
from probe.reference.mutants import MUTANTS
from probe.runs import analyze as analyze_run
from probe.verification import FP32_RTOL


def test_a_slow_start_up_is_explained_once(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBE_CACHE", str(tmp_path / "cache"))
    assert analyze_run.start_up_note(analyze_run.SLOW_START_S - 0.1) is None  # a quick start: nothing said
    assert not (tmp_path / "cache" / "start-up-explained").exists()
    out = analyze_run.start_up_note(14.5)
    assert out.startswith("note: start-up took 14.5 s: a first run after installing") and "(Said once.)" in out
    assert (tmp_path / "cache" / "start-up-explained").exists()
    assert analyze_run.start_up_note(20.0) is None  # said once: never again for this cache folder


def test_a_read_only_cache_folder_still_runs(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PROBE_CACHE", str(blocker / "cache"))  # cannot be created: the note, no error
    assert "start-up took 12.0 s" in analyze_run.start_up_note(12.0)


def test_only_the_probe_command_counts_its_start_up(monkeypatch):
    for argv0, own in (("/usr/local/bin/probe", True), ("/repo/probe/__main__.py", True),
                       ("/repo/probe/cli/__main__.py", True), ("/usr/local/bin/pytest", False), ("-c", False)):
        monkeypatch.setattr(analyze_cli.sys, "argv", [argv0])
        assert analyze_cli.started_as_command() is own, argv0


def _modules_after(code: str) -> list[str]:
    """The heavy libraries imported by a fresh interpreter running ``code`` (probe's command line)."""
    script = ("import sys\nfrom probe.cli import main\n" + code
              + "\nprint('imported:', *(m for m in ('torch', 'transformers', 'pandas', 'sklearn', 'scipy', 'numpy')"
                " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).parent.parent)
    return done.stdout.splitlines()[-1].split()[1:]


def test_help_and_a_missing_file_import_no_heavy_library():
    """Issue 27 item 9: ``probe --help``, a usage error and a missing file are answered before torch,
    transformers, pandas or scikit-learn are imported (they took 2-15 s of a start-up)."""
    for args in (["--help"], ["analyze", "--help"], ["analyze", "--corpus", "missing.txt"],
                 ["effects", "--pairs", "missing.tsv"], ["prune", "--corpus", "missing.txt"],
                 ["analyze", "--text", "a", "--corpus", "x"], ["effects", "--seeds", "2"], ["verify", "--mutant", "x"],
                 ["compare", "--help"], ["patch", "--help"], ["models", "--help"]):
        code = f"try:\n    main({args!r}, prog_name='probe')\nexcept SystemExit:\n    pass"
        assert _modules_after(code) == [], args


def test_a_missing_file_says_so_before_loading(tmp_path):
    result = CliRunner().invoke(main, ["analyze", "--corpus", str(tmp_path / "nope.txt")])
    assert result.exit_code == 1 and f"Error: corpus file not found: {tmp_path / 'nope.txt'}" in result.output
    result = CliRunner().invoke(main, ["effects", "--pairs", str(tmp_path / "p.tsv")])
    assert result.exit_code == 1 and f"Error: pairs file not found: {tmp_path / 'p.tsv'}" in result.output


def test_the_package_imports_its_public_names_on_first_use():
    code = ("import sys, probe\nassert 'torch' not in sys.modules\n"
            "from probe import analyze, capture_attention, load_model\n"
            "import probe.runs.analysis, probe.capture.maps, probe.loading.models\n"
            "assert analyze is probe.runs.analysis.analyze\n"
            "assert capture_attention is probe.capture.maps.capture_attention\n"
            "assert load_model is probe.loading.models.load_model and set(probe.__all__) <= set(dir(probe))\n"
            "try:\n    probe.no_such_name\nexcept AttributeError as exc:\n    print(exc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "module 'probe' has no attribute 'no_such_name'"
    assert all(getattr(probe, name) is not None for name in probe.__all__)


def test_the_command_lines_copies_of_library_names_agree():
    """The command line writes the default model and the mutant names without importing torch."""
    assert options.DEFAULT_MODEL == models.DEFAULT_MODEL
    assert list(verify_cli.MUTANT_NAMES) == sorted(MUTANTS)
    assert verify_cli.FP32_RTOL == FP32_RTOL
