"""probe.runfolder: a folder is claimed before the work, written whole or not at all, and only
probe's own files are ever replaced or removed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from probe.errors import InputError
from probe.runfolder import MANIFEST, FolderBusy, claim, claim_new, probe_files, write_folder

ROOT = Path(__file__).resolve().parents[1]


def listing(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path -> text), hidden ones included."""
    return {p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8") for p in sorted(folder.rglob("*"))
            if p.is_file()}


def siblings(folder: Path) -> list[str]:
    """Names beside ``folder`` that start with ``.<name>`` (temporary folders, lock files)."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}"))


def test_new_folder_is_complete_with_its_manifest(tmp_path):
    out = tmp_path / "a" / "b" / "run"
    write_folder(out, {"index.html": "<p>", "sub/x.csv": "1\n", "data.bin": b"\x00\x01"}, kind="run")
    assert listing(out).keys() == {"index.html", "sub/x.csv", "data.bin", MANIFEST}
    record = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    assert record["kind"] == "run" and record["files"] == ["data.bin", "index.html", "sub/x.csv"]
    assert probe_files(out) == {"data.bin", "index.html", "sub/x.csv"}
    assert siblings(out) == []  # no lock file, no temporary folder left
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # a folder as made by hand


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_force_replaces_only_probes_files(tmp_path):
    out = tmp_path / "run"
    write_folder(out, {"index.html": "old", "heads.csv": "old", "coref.csv": "old"}, kind="run")
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    (out / "sub").mkdir()
    (out / "sub" / "data.csv").write_text("mine too", encoding="utf-8")
    with pytest.raises(InputError, match="already exists and is not empty; use --force"):
        write_folder(out, {"index.html": "new"}, kind="run")
    write_folder(out, {"index.html": "new", "heads.csv": "new"}, kind="run", force=True)
    files = listing(out)
    # the user's files are kept, probe's are new, and the earlier run's coref.csv (not written again) is gone
    assert {k: v for k, v in files.items() if k != MANIFEST} == {
        "index.html": "new", "heads.csv": "new", "notes.txt": "mine", "sub/data.csv": "mine too"}
    assert probe_files(out) == {"index.html", "heads.csv"}


def test_force_never_touches_a_folder_probe_did_not_write(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    (out / "index.html").write_text("my page", encoding="utf-8")
    before = listing(out)
    with pytest.raises(InputError, match="holds files probe did not write; --force replaces only probe's own"):
        write_folder(out, {"index.html": "new"}, kind="run", force=True)
    assert listing(out) == before and siblings(out) == []
    # without --force the message says at once that --force would not help (it once advised --force)
    with pytest.raises(InputError, match="holds files probe did not write; --force replaces only probe's own"):
        write_folder(out, {"index.html": "new"}, kind="run")
    assert listing(out) == before and siblings(out) == []


def test_a_users_file_under_a_new_name_probe_writes_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    write_folder(out, {"index.html": "old"}, kind="run")
    (out / "syntax.csv").write_text("mine", encoding="utf-8")  # probe never wrote this one
    with pytest.raises(InputError, match="holds syntax.csv, which probe did not write"):
        write_folder(out, {"index.html": "new", "syntax.csv": "new"}, kind="run", force=True)
    assert (out / "syntax.csv").read_text(encoding="utf-8") == "mine"
    assert (out / "index.html").read_text(encoding="utf-8") == "old"  # checked before anything moved
    assert siblings(out) == []


def test_a_folder_of_another_kind_is_refused(tmp_path):
    out = tmp_path / "run"
    write_folder(out, {"index.html": "report"}, kind="run")
    with pytest.raises(InputError, match="holds a probe run folder, not a pruned model folder"):
        write_folder(out, {"config.json": "{}"}, kind="pruned model", force=True)
    assert (out / "index.html").read_text(encoding="utf-8") == "report"


def test_a_manifest_cannot_make_probe_delete_outside_its_folder(tmp_path):
    out = tmp_path / "run"
    write_folder(out, {"index.html": "old"}, kind="run")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep", encoding="utf-8")
    (out / MANIFEST).write_text(json.dumps({"kind": "run", "files": ["../victim.txt", str(victim), "index.html"]}),
                                encoding="utf-8")
    write_folder(out, {"heads.csv": "new"}, kind="run", force=True)
    assert victim.read_text(encoding="utf-8") == "keep"
    assert not (out / "index.html").exists()  # the one named inside the folder is probe's and was removed


def test_folders_written_before_the_manifest_are_recognised(tmp_path):
    out = tmp_path / "old-run"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"output": {"index.html": "/abs/old-run/index.html",
                                                         "heads.csv": "/abs/old-run/heads.csv"}}), encoding="utf-8")
    (out / "index.html").write_text("old", encoding="utf-8")
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    assert probe_files(out) == {"index.html", "heads.csv", "run.json"}
    write_folder(out, {"index.html": "new"}, kind="run", force=True)
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert not (out / "run.json").exists() and (out / "index.html").read_text(encoding="utf-8") == "new"


def test_interrupt_while_writing_leaves_nothing(tmp_path):
    out = tmp_path / "new" / "run"
    with pytest.raises(KeyboardInterrupt):
        with claim(out, kind="run") as folder, folder.staging() as tmp:
            (tmp / "index.html").write_text("half", encoding="utf-8")
            raise KeyboardInterrupt
    assert not (tmp_path / "new").exists()  # nor the parent made for the lock


def test_interrupt_keeps_an_existing_run_as_it_was(tmp_path):
    out = tmp_path / "run"
    write_folder(out, {"index.html": "old"}, kind="run")
    before = listing(out)
    with pytest.raises(KeyboardInterrupt):
        with claim(out, kind="run", force=True) as folder, folder.staging() as tmp:
            (tmp / "index.html").write_text("half", encoding="utf-8")
            raise KeyboardInterrupt
    assert listing(out) == before and siblings(out) == []


def test_claims_are_reentrant_in_one_process(tmp_path):
    out = tmp_path / "run"
    outer = claim(out, kind="run")
    inner = claim(out, kind="run")
    assert inner is outer
    inner.release()
    assert (tmp_path / ".run.probe-lock").exists()  # the outer claim still holds it
    outer.release()
    assert siblings(out) == []


HOLDER = textwrap.dedent("""
    import sys, time
    from probe.runfolder import claim
    c = claim(sys.argv[1], kind="run")
    (c.path.parent / (".{}.probe-" + "deadbeef").format(c.path.name)).mkdir()  # as a killed run leaves it
    print("claimed", flush=True)
    sys.stdin.read()
""")


def hold_in_subprocess(path: Path) -> subprocess.Popen:
    """A second process that claims ``path`` and holds it until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "claimed"
    return proc


def test_a_folder_claimed_by_another_process_is_busy_until_it_ends(tmp_path):
    out = tmp_path / "same"
    proc = hold_in_subprocess(out)
    try:
        with pytest.raises(FolderBusy, match=f"another probe run is writing output folder {out}.*process {proc.pid}"):
            claim(out, kind="run")
        with pytest.raises(FolderBusy):  # force does not help
            claim(out, kind="run", force=True)
    finally:
        proc.send_signal(signal.SIGKILL)  # killed: no clean-up of its own, the system drops the lock
        proc.wait()
    assert siblings(out) == [".same.probe-deadbeef", ".same.probe-lock"]
    with claim(out, kind="run") as folder:
        assert siblings(out) == [".same.probe-lock"]  # the killed run's temporary folder is swept
        with folder.staging() as tmp:
            (tmp / "index.html").write_text("done", encoding="utf-8")
    assert siblings(out) == [] and (out / "index.html").read_text(encoding="utf-8") == "done"


def test_default_folders_skip_a_taken_name(tmp_path):
    base = tmp_path / "reports" / "model-20260101-000000"
    proc = hold_in_subprocess(base)
    try:
        with claim_new(base, kind="run") as folder:
            assert folder.path == base.with_name(base.name + "-2")
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def test_replace_file_is_whole_or_not_at_all(tmp_path, monkeypatch):
    import probe.runfolder as rf

    page = tmp_path / "view.html"
    rf.replace_file(page, "<p>first</p>")
    assert page.read_text(encoding="utf-8") == "<p>first</p>"

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(rf.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rf.replace_file(page, "<p>second</p>")
    assert page.read_text(encoding="utf-8") == "<p>first</p>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["view.html"]  # no temporary sibling left
    with pytest.raises(InputError, match="is a folder; give a file name"):
        rf.replace_file(tmp_path, "x")


def test_an_empty_current_folder_is_a_run_folder_like_any_empty_folder(tmp_path, monkeypatch):
    """``--out .`` in an empty folder said it "holds files probe did not write": the lock file was made
    inside the folder itself (beside ``.`` is ``./``). The claim now sits beside the folder, the run is
    written into it (moved in, not renamed over it: the working folder stays the same folder, so the
    shell that ran the command sees the files), and nothing is left beside it."""
    from conftest import invoke_cli, save_tiny

    model = save_tiny("bert", tmp_path / "bert")
    here = tmp_path / "empty"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = os.stat(".").st_ino
    result = invoke_cli("analyze", "--model", model, "--text", "The cat sat on the mat.", "--out", ".",
                        "--no-progress", "--examples", "0")
    assert result.exit_code == 0, result.output
    assert {"index.html", "heads.csv", "run.json", MANIFEST} <= set(os.listdir("."))  # seen from the working folder
    assert os.stat(here).st_ino == inode
    assert siblings(here) == []  # no lock file or temporary folder left beside it
    assert "did not write" not in result.output
    again = invoke_cli("analyze", "--model", model, "--text", "The cat sat.", "--out", ".", "--no-progress")
    assert again.exit_code == 1 and "already exists and is not empty; use --force" in again.stderr, again.output
    with claim(".", kind="run", force=True) as folder:  # the library's claim: the same folder, by its full path
        assert folder.path == here and (tmp_path / ".empty.probe-lock").exists()
    assert siblings(here) == []

