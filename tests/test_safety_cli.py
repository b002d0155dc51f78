"""Nothing lost, nothing shown wrong: what probe's commands write and how they end.

- ``--force`` replaces probe's own files only (a user's ``notes.txt`` and ``sub/data.csv`` in a
  ``--save-pruned`` folder survive; a folder probe did not write is refused).
- Two runs aimed at one folder: the second stops with one ``Error:`` line before loading a model.
- Ctrl-C while writing: exit status 130, one line, no half-written or hidden folder left.
- A damaged run folder (heads.csv cut short) is refused by ``probe compare`` with one line.
- The pruned copy's speed is a median of interleaved repeats with its range; an objective that is
  0 up to float rounding prints as 0.
- A written report carries no path of the author's file system.
- Head gates that never act (BLOOM with ``pretraining_tp=2, slow_but_exact=True``) stop the
  command with one line naming the setting.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import probe.loading.models as pm
from conftest import invoke_cli as run
from conftest import one_error, save_tiny, tiny_model
from probe.runfolder import MANIFEST

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ["The cat sat on the mat.", "A dog barked at the moon.", "Birds sing in the morning.",
             "It rained all day long.", "She read the old letter twice.", "We walked home after the game."]


def hidden_beside(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}"))


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny BERT saved inside a fake installed package, a corpus, and one prune run."""
    root = tmp_path_factory.mktemp("safety")
    model = save_tiny("bert", root / "venv" / "lib" / "python3.11" / "site-packages" / "tinypkg" / "model")
    corpus = root / "data" / "corpus.txt"
    corpus.parent.mkdir()
    corpus.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    result = run("prune", "--model", model, "--corpus", corpus, "--steps", 1, "--order", "importance,random",
                 "--out", root / "out" / "prune", "--save-pruned", root / "out" / "pruned", "--no-progress")
    assert result.exit_code == 0, result.output + repr(result.exception)
    return root, model, corpus, result


# --------------------------------------------------------------------------- 1. --force keeps the user's files

def test_force_on_save_pruned_keeps_the_users_files(setup, tmp_path):
    root, model, corpus, _ = setup
    pruned = tmp_path / "pruned"
    shutil.copytree(root / "out" / "pruned", pruned)
    (pruned / "notes.txt").write_text("mine", encoding="utf-8")
    (pruned / "sub").mkdir()
    (pruned / "sub" / "data.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    probe_before = json.loads((pruned / MANIFEST).read_text(encoding="utf-8"))["files"]
    result = run("prune", "--model", model, "--corpus", corpus, "--steps", 1, "--order", "importance,random",
                 "--out", tmp_path / "run", "--save-pruned", pruned, "--force", "--no-progress")
    assert result.exit_code == 0, result.output
    assert (pruned / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert (pruned / "sub" / "data.csv").read_text(encoding="utf-8") == "a,b\n1,2\n"
    after = json.loads((pruned / MANIFEST).read_text(encoding="utf-8"))["files"]
    assert after == probe_before and "notes.txt" not in after
    assert set(files(pruned)) == set(after) | {MANIFEST, "notes.txt", "sub/data.csv"}
    assert pm.load_model(str(pruned)).pruned is not None  # the new copy loads


def test_force_refuses_a_folder_probe_did_not_write(setup, tmp_path):
    root, model, corpus, _ = setup
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("mine", encoding="utf-8")
    (mine / "sub" / "data.csv").write_text("1\n", encoding="utf-8")
    (mine / "config.json").write_text("{}", encoding="utf-8")
    before = files(mine)
    for option in ("--save-pruned", "--out"):
        result = run("prune", "--model", model, "--corpus", corpus, option, mine, "--force")
        one_error(result, 1, str(mine), "probe did not write")
        assert "Pruning" not in result.output  # refused before the model was loaded
    assert files(mine) == before


# --------------------------------------------------------------------------- 2. one run per folder

HOLDER = textwrap.dedent("""
    import sys
    from probe.runfolder import claim
    claim(sys.argv[1], kind=sys.argv[2])
    print("claimed", flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def held(tmp_path):
    """hold(path, kind): another process claims ``path`` until the test ends."""
    procs = []

    def hold(path: Path, kind: str = "run"):
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), kind], cwd=ROOT, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "claimed"
        return proc

    yield hold
    for proc in procs:
        proc.stdin.close()
        proc.wait(timeout=60)


def test_the_second_run_on_a_folder_stops_before_loading_a_model(setup, tmp_path, held, monkeypatch):
    root, model, corpus, _ = setup

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded for a run that cannot write its folder")

    monkeypatch.setattr(pm, "load_model", no_load)
    same = tmp_path / "same"
    proc = held(same)
    line = one_error(run("analyze", "--model", model, "--text", "Hello.", "--out", same), 1,
                     f"another probe run is writing output folder {same}", f"process {proc.pid}")
    assert line.count("Error:") == 1
    one_error(run("prune", "--model", model, "--corpus", corpus, "--out", same), 1, "another probe run")
    pruned = tmp_path / "pruned"
    held(pruned, "pruned model")
    one_error(run("prune", "--model", model, "--corpus", corpus, "--out", tmp_path / "p", "--save-pruned", pruned),
              1, f"another probe run is writing --save-pruned folder {pruned}")
    cmp = tmp_path / "cmp"
    held(cmp, "compare")
    one_error(run("compare", root / "out" / "prune", root / "out" / "prune", "--out", cmp), 1,
              f"another probe run is writing output folder {cmp}")
    one_error(run("compare", "--model", model, "--model", model, "--out", cmp), 1, "another probe run")
    assert not same.exists() and not (tmp_path / "p").exists() and not cmp.exists()


def test_two_analyze_runs_started_together_one_wins(setup, tmp_path):
    root, model, _, _ = setup
    same = tmp_path / "same"
    cmd = [sys.executable, "-m", "probe", "analyze", "--model", str(model), "--text", "Hello there, friend.",
           "--out", str(same), "--no-progress", "--no-distance"]
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(rc for rc, _, _ in outs)
    assert codes == [0, 1], outs
    rc, _, err = next(o for o in outs if o[0] == 1)
    errors = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert "another probe run is writing" in errors[0] or "already exists and is not empty" in errors[0]
    assert "Report:" in next(o for o in outs if o[0] == 0)[1]
    written = json.loads((same / MANIFEST).read_text(encoding="utf-8"))["files"]
    assert set(files(same)) == set(written) | {MANIFEST}  # one run's files, complete
    assert hidden_beside(same) == []


# --------------------------------------------------------------------------- 3. interrupts

def test_interrupt_while_saving_the_pruned_copy_exits_130_and_leaves_nothing(setup, tmp_path, monkeypatch):
    root, model, corpus, _ = setup
    import probe.pruning.saving as saving

    def interrupted(lm, tmp):
        (tmp / "config.json").write_text("{}", encoding="utf-8")  # half-way through
        raise KeyboardInterrupt

    monkeypatch.setattr(saving, "_write_model", interrupted)
    pruned = tmp_path / "pruned"
    result = run("prune", "--model", model, "--corpus", corpus, "--steps", 1, "--order", "importance,random",
                 "--out", tmp_path / "run", "--save-pruned", pruned, "--no-progress")
    assert result.exit_code == 130, result.output
    assert result.stderr.strip().splitlines()[-1] == "Interrupted."
    assert "Traceback" not in result.output and "Error" not in result.stderr
    assert not pruned.exists() and hidden_beside(pruned) == []


SIGINT_RUN = textwrap.dedent("""
    import os, signal, sys
    import probe.report as report
    real = report._write_files

    def write_then_interrupt(result, tokenizer, path, tmp, *rest):
        result.heads.to_csv(tmp / "heads.csv")  # a file is half-way written when Ctrl-C comes
        os.kill(os.getpid(), signal.SIGINT)
        real(result, tokenizer, path, tmp, *rest)

    report._write_files = write_then_interrupt
    sys.argv = ["probe", *sys.argv[1:]]
    from probe.cli import entry
    entry()
""")


def _interruptible() -> None:
    """In the child before it runs: Ctrl-C as a shell's foreground command gets it. A signal ignored
    or blocked in the test process (something earlier in a long pytest run can leave SIGINT so) is
    inherited across exec, and the interrupt this test sends would never arrive."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_mid_write_exits_130_with_one_line_and_no_folder(setup, tmp_path):
    root, model, _, _ = setup
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-c", SIGINT_RUN, "analyze", "--model", str(model), "--text", "Hello.",
                          "--out", str(out), "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
                         preexec_fn=_interruptible)
    assert res.returncode == 130, res.stderr
    assert res.stderr.strip().splitlines()[-1] == "Interrupted." and "Traceback" not in res.stderr
    assert "Report:" not in res.stdout
    assert not out.exists() and hidden_beside(out) == []


# --------------------------------------------------------------------------- 4. damaged runs

def test_compare_refuses_a_run_whose_heads_csv_was_cut_short(setup, tmp_path):
    root, _, _, _ = setup
    a = root / "out" / "prune"
    b = tmp_path / "b"
    shutil.copytree(a, b)
    lines = (b / "heads.csv").read_text(encoding="utf-8").splitlines()
    (b / "heads.csv").write_text("\n".join(lines[:4]) + "\n", encoding="utf-8")  # header + 3 of 8 heads
    result = run("compare", a, b, "--out", tmp_path / "cmp")
    one_error(result, 1, f"heads.csv of {b} does not match its run.json", "3 of the 8 heads",
              "(2 layers x 4 heads)", "missing L0H3, L1H0, L1H1 ...", "incomplete or damaged")
    assert not (tmp_path / "cmp").exists()


def test_load_run_names_what_is_wrong(setup, tmp_path):
    from probe.compare import load_run
    from probe.errors import InputError

    root, _, _, _ = setup
    source = root / "out" / "prune"
    header, *rows = (source / "heads.csv").read_text(encoding="utf-8").splitlines()
    assert len(load_run(source).heads) == 8

    def damaged(body: list[str], record=None) -> Path:
        folder = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        shutil.copytree(source, folder)
        (folder / "heads.csv").write_text("\n".join([header, *body]) + "\n", encoding="utf-8")
        if record is not None:
            rec = json.loads((folder / "run.json").read_text(encoding="utf-8"))
            rec["model"].update(record)
            (folder / "run.json").write_text(json.dumps(rec), encoding="utf-8")
        return folder

    with pytest.raises(InputError, match="L0H1 has two rows"):
        load_run(damaged([rows[0], rows[1], rows[1], *rows[3:]]))
    with pytest.raises(InputError, match=r"row for L2H0, outside the model's 2 layers x 4 heads"):
        load_run(damaged([*rows, "2" + rows[0][1:]]))
    with pytest.raises(InputError, match="0 heads are marked removed, run.json records 2"):
        load_run(damaged(rows, {"removed_heads": 2}))
    with pytest.raises(InputError, match="8 of the 12 heads run.json records"):
        load_run(damaged(rows, {"layers": 3}))


# --------------------------------------------------------------------------- 6. numbers that are noise

def test_prune_prints_a_median_speed_with_its_range_and_a_zero_as_0(setup):
    root, _, _, result = setup
    rec = json.loads((root / "out" / "prune" / "run.json").read_text(encoding="utf-8"))["pruning"]
    lo, hi = rec["speedup_range"]
    assert rec["speedup_repeats"] == 5 and lo <= rec["speedup"] <= hi
    assert f"forward {rec['speedup']:.2f}x (median of 5 interleaved repeats, {lo:.2f}x-{hi:.2f}x)" in result.stdout
    # the unpruned model's fidelity to itself is 0 exactly, not a rounding error below it
    assert rec["curves"]["importance"][0] == [0.0, 0.0]
    assert "fidelity (1 - cosine) on 3 held-out sequences: 0 unpruned;" in result.stdout


def test_speed_is_the_median_of_interleaved_ratios(monkeypatch):
    import probe.pruning.experiment as ex
    from probe.capture.maps import encode

    lm = tiny_model("bert")
    durations = iter([1, 1] + [d for pair in zip([2] * 5, [1, 4, 2, 0.5, 1]) for d in pair])  # warm-up, 5 repeats
    clock = {"t": 0.0, "start": True}

    def perf_counter():  # each timed pass reads the clock twice: start, end
        if not clock["start"]:
            clock["t"] += next(durations)
        clock["start"] = not clock["start"]
        return clock["t"]

    monkeypatch.setattr(ex.time, "perf_counter", perf_counter)
    batch = encode(lm, ["One two three.", "Four five."])
    diff, speed, spread = ex.compare_and_time(lm, lm, ex.ones(lm), [batch])
    assert diff == 0.0
    assert speed == 2.0 and spread == (0.5, 4.0)  # ratios 2, 0.5, 1, 4, 2


# --------------------------------------------------------------------------- 12. reports that travel

def test_reports_carry_no_path_of_the_authors_file_system(setup, tmp_path):
    root, model, corpus, _ = setup
    out = root / "out" / "analysis"
    result = run("analyze", "--model", model, "--corpus", corpus, "--out", out, "--no-progress")
    assert result.exit_code == 0, result.output
    cmp = root / "out" / "cmp"
    assert run("compare", out, root / "out" / "prune", "--out", cmp).exit_code == 0
    for page in (out / "index.html", out / "run.json", root / "out" / "prune" / "index.html",
                 root / "out" / "prune" / "run.json", cmp / "index.html", cmp / "compare.json"):
        text = page.read_text(encoding="utf-8")
        assert str(root) not in text and "site-packages" not in text, page
        assert str(Path.home()) not in text or str(Path.home()) == "/", page
    rec = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert rec["model"]["name"] == rec["model"]["source"] == "tinypkg/model"
    assert rec["settings"]["input"] == "corpus.txt"
    assert rec["output"]["heads.csv"] == "heads.csv"  # relative to the run folder
    html = (out / "index.html").read_text(encoding="utf-8")
    assert "<td>tinypkg/model</td>" in html


def test_no_page_or_record_of_any_command_holds_an_absolute_path(tmp_path):
    """Every page and record the commands on prompt pairs, a corpus and run folders write, with the model,
    the pairs file and the corpus in folders of the author's: no absolute path (``probe circuit``,
    ``path`` and ``patch --pairs FILE`` wrote the file's absolute path into index.html, and ``effects``
    the model's folder in a note, while run.json was clean)."""
    from test_edge_circuits import PAIRS_TSV

    model = save_tiny("llama", tmp_path / "models" / "llama")
    data = tmp_path / "data"
    data.mkdir()
    (data / "pairs.tsv").write_text(PAIRS_TSV, encoding="utf-8")
    (data / "corpus.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    (data / "two.tsv").write_text("The cat sat.\tIt was warm.\nA dog ran.\tIt was fast.\n", encoding="utf-8")
    out = tmp_path / "out"
    pairs = ["--pairs", data / "pairs.tsv"]
    for name, args in {
        "circuit": ["circuit", *pairs, "--steps", 1, "--edges", 5, "--seeds", 1, "--no-progress"],
        "path": ["path", *pairs, "--senders", "L0H1", "--receivers", "logits,L1H0.q", "--no-progress"],
        "patch": ["patch", *pairs],
        "analyze": ["analyze", "--corpus", data / "corpus.txt", "--no-progress"],
        "segments": ["analyze", "--pairs", data / "two.tsv", "--no-progress"],
        "effects": ["effects", "--corpus", data / "corpus.txt", "--seeds", 5, "--copies", 1, "--no-progress"],
    }.items():
        result = run(*args[:1], "--model", model, *args[1:], "--out", out / name)
        assert result.exit_code == 0, (name, result.output)
    assert run("compare", out / "analyze", out / "segments", "--out", out / "compare").exit_code == 0
    written = [f for f in out.rglob("*") if f.suffix in (".html", ".json", ".svg")]
    assert {f.parent.name for f in written if f.name == "index.html"} == {
        "circuit", "path", "patch", "analyze", "segments", "effects", "compare"}
    for page in written:
        text = page.read_text(encoding="utf-8")
        assert str(tmp_path) not in text and str(tmp_path.resolve()) not in text, page
    assert "(pairs.tsv)" in (out / "path" / "index.html").read_text(encoding="utf-8")  # the file, by its name


def test_short_path_rules():
    from probe.report.portable import short_path, shorten_paths

    assert short_path("/home/me/models/tiny") == "tiny"
    assert short_path("/x/venv/lib/python3.11/site-packages/pkg/model") == "pkg/model"
    assert short_path("/runs/r1/heads.csv", "/runs/r1") == "heads.csv"
    assert short_path("org/name") == "org/name" and short_path("models/tiny") == "models/tiny"
    note = "loaded the copy cached in /root/.cache/probe/smollm2 at 2.0 tokens/s (1/2 done)"
    assert shorten_paths({"notes": [note]}) == {"notes": ["loaded the copy cached in smollm2 at 2.0 tokens/s "
                                                          "(1/2 done)"]}
    # a result object (a dataclass) is copied with its paths shortened, and returned itself when it holds none
    from probe.circuits.path_run import PathRun

    run_ = PathRun(frame=None, ld_clean=1.0, ld_corrupted=0.0, pairs=[], source="/home/me/data/pairs.tsv",
                   notes=["read /home/me/data/pairs.tsv"])
    shown = shorten_paths({"path": run_})["path"]
    assert (shown.source, shown.notes, shown.ld_clean) == ("pairs.tsv", ["read pairs.tsv"], 1.0)
    assert run_.source == "/home/me/data/pairs.tsv"  # the run's own record is left as it was
    kept = PathRun(frame=None, ld_clean=1.0, ld_corrupted=0.0, pairs=[], source="built-in IOI set")
    assert shorten_paths(kept) is kept


# --------------------------------------------------------------------------- gates that never act

def tp2_bloom():
    """A tiny BLOOM set up as a checkpoint trained with tensor parallelism 2 and exact slicing."""
    model, tok = tiny_model("bloom", wrap=False)
    model.config.pretraining_tp, model.config.slow_but_exact = 2, True
    for module in model.modules():
        if hasattr(module, "slow_but_exact"):
            module.pretraining_tp, module.slow_but_exact = 2, True
    return model, tok


def test_heads_behind_a_projection_never_called_stop_every_method_with_the_setting_named(tmp_path):
    # BLOOM with pretraining_tp=2 and slow_but_exact=True computes its attention output
    # projection as F.linear on slices of dense.weight without calling dense, so a hook on dense
    # never runs: gates would close nothing and patching would read an empty cache. Every method
    # that reads or writes heads must stop with one line naming the setting, not a KeyError.
    from probe.causal.gates import gated
    from probe.effects.pairs import Pair
    from probe.effects.patching import patch_heads
    from probe.errors import UnsupportedAnalysisError

    model, tok = tp2_bloom()
    lm = pm.from_pretrained_objects(model, tok, name="tiny-bloom-tp2")
    said = (r"output projection \(self_attention.dense\) is never called: "
            r"the setting pretraining_tp=2, slow_but_exact=True")
    with pytest.raises(UnsupportedAnalysisError, match=said):
        with gated(lm):
            pass
    with pytest.raises(UnsupportedAnalysisError, match=said):
        patch_heads(lm, [Pair("The cat and the dog ran to", "The dog and the cat ran to", " the", " a")])
    folder = tmp_path / "bloom"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("clean\tcorrupted\tanswer\twrong\n"
                     "The cat and the dog ran to\tThe dog and the cat ran to\t the\t a\n",
                     encoding="utf-8")
    for command in (("prune", "--corpus", corpus, "--steps", 1), ("patch", "--pairs", pairs),
                    ("effects", "-n", 4)):
        out = tmp_path / command[0]
        line = one_error(run(command[0], "--model", folder, *command[1:], "--out", out), 1,
                         "is never called", "pretraining_tp=2, slow_but_exact=True", "slow_but_exact=False")
        assert "objective" not in line and "KeyError" not in line
        assert not out.exists()


def test_gates_that_act_pass_the_check():
    from probe.capture.maps import encode, forward
    from probe.causal.gates import gated, ones

    lm = tiny_model("bloom")  # pretraining_tp=1: dense is called, the gate acts
    batch = encode(lm, "The cat sat on the mat.")
    with torch.no_grad(), gated(lm) as state:
        assert state.fired == {0, 1}
        ref = forward(lm, batch).logits
        closed = ones(lm)
        closed[0, 0] = 0.0
        state.values = closed
        assert (forward(lm, batch).logits - ref).abs().max() > 1e-6


def test_capture_names_the_sites_that_never_ran():
    from probe.capture.maps import check_fired
    from probe.errors import CaptureError

    lm = tiny_model("bert")
    check_fired(lm, set(lm.sites))
    with pytest.raises(CaptureError, match=r"1 of 2 attention sites of tiny-bert-wordpiece gave no probabilities "
                                           r"in a forward pass \(encoder.1.self\)"):
        check_fired(lm, {lm.sites[0]})


def test_load_run_checks_every_site_kind_of_an_encoder_decoder_run(tmp_path):
    from probe.compare import load_run
    from probe.errors import InputError
    from probe.report import write_run
    from probe.runs.analysis import analyze
    from probe.text.inputs import Text

    lm = tiny_model("bart")
    path = write_run(analyze(lm, [Text("The cat sat.", target="Le chat."), Text("Two dogs.", target="Deux chiens.")]),
                     lm.tokenizer, tmp_path / "run")
    heads = load_run(path).heads
    assert len(heads) == 3 * 2 * 4  # encoder self, decoder self, cross: 2 layers x 4 heads each
    header, *rows = (path / "heads.csv").read_text(encoding="utf-8").splitlines()
    kept = [r for r in rows if not r.startswith("decoder,cross,1,")]  # cross-attention of layer 1 cut out
    (path / "heads.csv").write_text("\n".join([header, *kept]) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"20 of the 24 heads run.json records \(24 heads\); missing cross L1H0, "
                                         r"cross L1H1, cross L1H2 \.\.\."):
        load_run(path)
