"""The first slow start-up is explained once (issue 19's start-up item)."""

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import probe
from probe.capture.reference.mutants import MUTANTS
from probe.cli import analyze as analyze_cli
from probe.cli import main, options
from probe.cli import verify as verify_cli
from probe.entries import analyze as analyze_run
from probe.loading import models
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


#: Libraries no text command needs before its call (plotting, scikit-learn, numba, the live page's server,
#: networkx, Pillow) and those of the call itself (torch, transformers, pandas, scipy, numpy, jinja2).
HEAVY = ("matplotlib", "seaborn", "sklearn", "numba", "starlette", "uvicorn", "networkx", "PIL", "torch",
         "transformers", "pandas", "scipy", "numpy", "jinja2")


def _heavy_after(code: str, names=HEAVY) -> list[str]:
    """Which of ``names`` (modules) a fresh interpreter has imported after running ``code``."""
    script = f"import sys\n{code}\nprint('imported:', *(m for m in {tuple(names)!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).parent.parent)
    return done.stdout.splitlines()[-1].split()[1:]


def test_importing_probe_and_every_help_import_no_heavy_library():
    """Issue 49 item 5: ``import probe`` and ``probe [COMMAND] --help`` import none of :data:`HEAVY` (the
    public names are imported on first use: ``probe.run_why``)."""
    assert _heavy_after("import probe") == []
    for args in (["--help"], ["why", "--help"], ["live", "--help"], ["circuit", "--help"], ["path", "--help"],
                 ["effects", "--help"], ["prune", "--help"], ["verify", "--help"]):
        code = f"from probe.cli import main\ntry:\n    main({args!r}, prog_name='probe')\nexcept SystemExit:\n    pass"
        assert _heavy_after(code) == [], args
    after = _heavy_after("import probe\nassert probe.run_why.__module__ == 'probe.entries.why'")
    assert "torch" in after and "pandas" in after  # the first use of a public name imports its module
    assert not set(after) & {"matplotlib", "seaborn", "sklearn", "numba", "starlette", "uvicorn", "networkx"}, after


def test_a_text_run_imports_no_image_audio_or_plotting_stack():
    """Issue 49 item 5: ``probe why`` on a text model spent about 1.4 s importing what its page never shows:
    the report's image and audio sections (networkx through the image maps' flow, scipy.stats and
    scipy.signal through the audio alignment). The command's modules, every section module of the page
    (:func:`probe.report.sections.load_sections`), the head view and the flow measure import none of them:
    each section imports its stack when it has something to show, the flow networkx only for its fallback.
    The run calls' registry (``probe analyze``'s module among them, which reads images and audio) imports
    probe's image and audio packages but not scipy's statistics and signal modules."""
    code = ("import probe.cli.why, probe.entries.why, probe.view.html, probe.measures.flow\n"
            "import probe.report.sections as s\ns.load_sections()")
    stacks = ("networkx", "scipy.stats", "scipy.signal", "scipy.ndimage", "matplotlib", "seaborn", "sklearn", "numba",
              "starlette", "uvicorn")
    assert _heavy_after(code, ("probe.images", "probe.audio", *stacks)) == []
    assert _heavy_after("import probe.entries.kinds", stacks) == []
    # where audio is measured, its stack is imported (the check can tell)
    code = "import numpy as np\nfrom probe.audio.align import monotonicity\nmonotonicity(np.eye(4))"
    assert "scipy.stats" in _heavy_after(code, stacks)


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
    from probe import bounds
    from probe.effects.components import COMPONENTS
    from probe.pruning.curves import ORDERS

    assert tuple(COMPONENTS) == bounds.COMPONENT_NAMES and ORDERS == bounds.PRUNING_ORDERS


#: Runs probe's entry point with torch and transformers made impossible to import: importing either
#: raises, and the command would end in a traceback instead of its one line.
_WITHOUT_TORCH = """
import sys
class Forbidden:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"{name} imported before the usage error was answered")
sys.meta_path.insert(0, Forbidden())
sys.argv = ["probe", *sys.argv[1:]]
from probe.cli import entry
entry()
"""


def _bad_inputs(tmp: Path) -> list[tuple[list[str], int, str]]:
    """(arguments, exit status, a fragment of the one line) of the usage errors a newcomer met after
    7-14 s of importing torch (issue 42, item 4), and the others of their kind."""
    bad = tmp / "latin1.txt"
    bad.write_bytes(b"fine line\ncaf\xe9 au lait\n")
    noise = tmp / "noise.wav"
    noise.write_text("this is not audio\n")
    out = str(tmp / "out")
    return [
        (["analyze", "--text", "Hi.", "--threshold", "induction=5", "-o", out], 2, "must be in (0, 1]"),
        (["analyze", "--text", "Hi.", "--threshold", "bogus=0.5", "-o", out], 2, "unknown label 'bogus'"),
        (["analyze", "--text", "Hi.", "--health-threshold", "saturated=2", "-o", out], 2, "must be in (0, 1]"),
        (["analyze", "--labels-by", "norm", "--no-norm", "-o", out], 1, "--no-norm"),
        (["effects", "--ablation", "bogus", "-o", out], 2, "unknown ablation 'bogus'"),
        (["analyze", "--text", "", "-o", out], 1, "text 1 is empty"),
        (["analyze", "--text", "Hi.", "--text", "   ", "-o", out], 1, "text 2 is empty"),
        (["analyze", "--corpus", str(bad), "-o", out], 1, "line 2 is not valid UTF-8"),
        (["effects", "--corpus", str(bad), "-o", out], 1, "line 2 is not valid UTF-8"),
        (["prune", "--corpus", str(bad), "-o", out], 1, "line 2 is not valid UTF-8"),
        (["compare", "--model", "a", "--model", "b", "--corpus", str(bad), "-o", out], 1, "not valid UTF-8"),
        (["circuit", "--pairs", str(bad), "-o", out], 1, "line 2 is not valid UTF-8"),
        (["patch", "--pairs", str(bad), "-o", out], 1, "line 2 is not valid UTF-8"),
        (["path", "--receivers", "L9H6.q", "-o", out], 2, "Missing option '--senders'"),
        (["path", "--senders", "5.1", "--receivers", "logits", "-o", out], 2, "'5.1' is not a name of that form"),
        (["patch", "--component", "bogus", "-o", out], 2, "--component 'bogus'"),
        (["prune", "--order", "bogus", "-o", out], 2, "distinct orders"),
        (["analyze", "--model", "whisper-tiny-en", "--audio", str(noise), "-o", out], 1, "cannot read audio"),
    ]


def test_an_unreadable_audio_file_is_named_once(tmp_path):
    """soundfile's own message repeats the path ("Error opening 'F': Format not recognised."): once is enough."""
    noise = tmp_path / "noise.wav"
    noise.write_bytes(b"not audio at all")
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, "analyze", "--model", "whisper-tiny-en", "--audio",
                           str(noise), "-o", str(tmp_path / "r")], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, timeout=120)
    assert done.returncode == 1 and done.stderr.count(str(noise)) == 1, done.stderr


def test_usage_errors_are_answered_before_torch_is_imported(tmp_path):
    """Each bad input of :func:`_bad_inputs` through the real entry point, in an interpreter where
    importing torch or transformers raises: its exit status and exactly one ``Error:`` line, and no
    run folder."""
    root = Path(__file__).parent.parent
    for args, code, fragment in _bad_inputs(tmp_path):
        done = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, *args], capture_output=True, text=True,
                              cwd=root, timeout=120)
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        assert done.returncode == code and len(lines) == 1, (args, done.stderr)
        assert lines[0].startswith("Error:") and fragment in lines[0], (args, lines[0])
        assert not (tmp_path / "out").exists(), args
