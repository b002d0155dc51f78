"""The first slow start-up is explained once (issue 19's start-up item)."""

from probe.cli import analyze as analyze_cli


def test_a_slow_start_up_is_explained_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PROBE_CACHE", str(tmp_path / "cache"))
    analyze_cli.slow_start_note(analyze_cli.SLOW_START_S - 0.1)  # a quick start: nothing said, no marker
    assert capsys.readouterr().out == ""
    assert not (tmp_path / "cache" / "start-up-explained").exists()
    analyze_cli.slow_start_note(14.5)
    out = capsys.readouterr().out
    assert out.startswith("note: start-up took 14.5 s: a first run after installing") and "(Said once.)" in out
    assert (tmp_path / "cache" / "start-up-explained").exists()
    analyze_cli.slow_start_note(20.0)  # said once: never again for this cache folder
    assert capsys.readouterr().out == ""


def test_a_read_only_cache_folder_still_runs(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PROBE_CACHE", str(blocker / "cache"))  # cannot be created: the note, no error
    analyze_cli.slow_start_note(12.0)
    assert "start-up took 12.0 s" in capsys.readouterr().out


def test_only_the_probe_command_counts_its_start_up(monkeypatch):
    for argv0, own in (("/usr/local/bin/probe", True), ("/repo/probe/__main__.py", True),
                       ("/repo/probe/cli/__main__.py", True), ("/usr/local/bin/pytest", False), ("-c", False)):
        monkeypatch.setattr(analyze_cli.sys, "argv", [argv0])
        assert analyze_cli.started_as_command() is own, argv0
