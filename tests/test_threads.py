"""The process's thread policy (probe.threads, issue 49 item 7): set when probe is imported in a fresh
process, the user's own values respected, ``probe.set_threads`` and ``probe --threads N``, and the same
numbers on one thread as on two."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import probe
from conftest import assert_statistics_close, invoke_cli, one_error
from probe import threads
from probe.errors import InputError
from probe.measures import kernel

ROOT = Path(__file__).resolve().parent.parent
#: The variables the policy writes or reads; a fresh process here starts without any of them.
VARS = ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "PROBE_THREADS")


def usable_cores() -> int:
    """The cores this process may use, computed here (not with probe.threads.cores)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def fresh(code: str, silent: bool = True, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter (the repository first on the path), its environment without
    :data:`VARS` but ``env``; ``code`` leaves a dict in ``out``, returned (``silent``: stderr must be empty)."""
    base = {k: v for k, v in os.environ.items() if k not in VARS}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")])
    script = f"import json, os, sys\n{code}\nprint(json.dumps(out))"
    done = subprocess.run([sys.executable, "-c", script], env={**base, **env}, capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert done.stderr == "" or not silent, done.stderr  # the policy is applied in silence
    return json.loads(done.stdout.strip().splitlines()[-1])


ENVIRONMENT = f"out = {{k: os.environ.get(k) for k in {VARS!r}}}\n"


@pytest.fixture
def restore_threads(monkeypatch):
    """Put back torch's thread count, numba's where loaded, OMP_NUM_THREADS and the recorded policy."""
    torch_threads = torch.get_num_threads()
    numba = sys.modules.get("numba")
    numba_threads = numba.get_num_threads() if numba is not None else None
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", ""))  # undone by monkeypatch
    state = dict(threads._state)
    yield
    torch.set_num_threads(torch_threads)
    if numba_threads is not None:
        numba.set_num_threads(numba_threads)
    threads._state.clear()
    threads._state.update(state)


def test_importing_probe_sets_the_passive_policy_sized_to_the_cores():
    out = fresh("import probe\n" + ENVIRONMENT
                + "out['policy'] = probe.threads.policy()\nimport torch\nout['torch'] = torch.get_num_threads()")
    n = usable_cores()
    assert out["OMP_WAIT_POLICY"] == "PASSIVE" and out["KMP_BLOCKTIME"] == "0"
    assert out["OMP_NUM_THREADS"] == str(n) and out["NUMBA_NUM_THREADS"] == str(n)
    assert out["torch"] == n  # torch's pool read the size when it loaded
    assert out["policy"] == {"wait_policy": "PASSIVE", "wait_policy_by_probe": True, "threads": str(n),
                             "source": "cores", "cores": n, "late": False}


def test_the_users_own_values_are_kept():
    out = fresh("import probe\n" + ENVIRONMENT
                + "out['policy'] = probe.threads.policy()\nimport torch\nout['torch'] = torch.get_num_threads()",
                OMP_WAIT_POLICY="ACTIVE", KMP_BLOCKTIME="50", OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    assert [out[k] for k in VARS[:4]] == ["ACTIVE", "50", "1", "1"]
    assert out["torch"] == 1
    assert out["policy"]["wait_policy_by_probe"] is False and out["policy"]["source"] == "OMP_NUM_THREADS"
    # a wait policy of the user's own: KMP_BLOCKTIME is not set either
    assert fresh("import probe\n" + ENVIRONMENT, OMP_WAIT_POLICY="ACTIVE")["KMP_BLOCKTIME"] is None


def test_probe_threads_sizes_torch_and_a_bad_value_falls_back_to_the_cores():
    code = "import probe\nimport torch\nout = {'torch': torch.get_num_threads(), **probe.threads.policy()}"
    out = fresh(code, PROBE_THREADS="1", OMP_NUM_THREADS="2")  # probe's own variable wins
    assert (out["torch"], out["threads"], out["source"]) == (1, "1", "PROBE_THREADS")
    for bad in ("0", "x", "-2", "1.5"):  # import probe cannot refuse: the cores (the command line refuses it)
        out = fresh(code, PROBE_THREADS=bad)
        assert (out["torch"], out["source"]) == (usable_cores(), "cores"), bad


def test_torch_imported_first_is_said_by_the_policy_not_on_stderr():
    out = fresh("import torch\nn = torch.get_num_threads()\nimport probe\nout = probe.threads.policy()\n"
                "out['unchanged'] = torch.get_num_threads() == n")
    assert out["late"] is True and out["unchanged"] is True  # fresh() asserted an empty stderr
    out = fresh("import torch\nimport probe\nout = {'torch': torch.get_num_threads()}", PROBE_THREADS="1")
    assert out["torch"] == 1  # PROBE_THREADS still sizes torch's pool, set directly


def test_set_threads_before_torch_is_imported_sizes_its_pool():
    out = fresh("import probe\nprobe.set_threads(1)\nimport torch\nout = {'torch': torch.get_num_threads()}")
    assert out == {"torch": 1}


def test_set_threads_sets_torch_and_numba(restore_threads):
    numba = pytest.importorskip("numba")
    for n in (1, 2):
        assert probe.set_threads(n) == n
        assert torch.get_num_threads() == n
        assert numba.get_num_threads() == min(n, numba.config.NUMBA_NUM_THREADS)
        assert threads.policy()["threads"] == str(n) and threads.policy()["source"] == "set_threads"


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_set_threads_refuses_what_is_not_an_integer_of_at_least_1(bad, restore_threads):
    before = torch.get_num_threads()
    with pytest.raises(InputError) as err:
        probe.set_threads(bad)
    assert "\n" not in str(err.value) and str(err.value).startswith("threads must be")
    assert torch.get_num_threads() == before


def test_the_threads_option_runs_the_command_on_n_threads(restore_threads):
    result = invoke_cli("--threads", 1, "models")
    assert result.exit_code == 0, result.output
    assert "minilm" in result.stdout
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("bad, fragment", [("0", "--threads must be at least 1, got 0"),
                                           ("x", "'x' is not a valid integer"), ("1.5", "not a valid integer")])
def test_a_bad_threads_option_is_one_usage_error(bad, fragment, restore_threads):
    before = torch.get_num_threads()
    one_error(invoke_cli("--threads", bad, "models"), 2, "--threads", fragment)
    assert torch.get_num_threads() == before


def test_a_bad_probe_threads_variable_is_one_usage_error_on_the_command_line(monkeypatch, restore_threads):
    monkeypatch.setenv("PROBE_THREADS", "0")
    one_error(invoke_cli("models"), 2, "--threads must be at least 1")


def test_the_console_script_refuses_threads_0_in_one_line():
    done = subprocess.run([sys.executable, "-m", "probe", "--threads", "0", "models"], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "Error: Invalid value for '--threads': --threads must be at least 1, got 0 (see 'probe --help')"]


def test_the_numbers_are_the_same_on_one_thread_and_two(make_tiny, monkeypatch, restore_threads):
    """A tiny BERT analysed on 1 and on 2 threads (numba's parallel kernel forced from any map size):
    every statistic of every head within the tolerance of a sum added in another order."""
    monkeypatch.setattr(kernel, "PARALLEL_FROM", 0)
    lm = make_tiny("bert")
    texts = ["The cat sat on the mat because it was warm.", "A dog barked.",
             "Every head sees the same sentence twice, and once more."]
    results = {}
    for n in (1, 2):
        probe.set_threads(n)
        results[n] = probe.analyze(lm, texts, batch_size=2)
    one, two = results[1].heads, results[2].heads
    assert len(one) == lm.geometry.n_layers * lm.geometry.n_heads
    assert (one[["layer", "head"]].values == two[["layer", "head"]].values).all()
    assert_statistics_close(two, one)


def test_starting_numbas_pool_leaves_torchs_thread_count():
    """numba's OpenMP pool, started by the kernel's first parallel call, may share torch's runtime (Linux:
    torch's libgomp.so.1) and set its count to NUMBA_NUM_THREADS; the kernel puts torch's count back."""
    out = fresh("import probe\nimport torch\nfrom probe.measures import kernel\nfn = kernel._compiled()\n"
                "out = {'after_compile': torch.get_num_threads()}\nfn.set_threads(2)\n"
                "out['after_set'] = torch.get_num_threads()", silent=False, OMP_NUM_THREADS="2",
                NUMBA_NUM_THREADS="1")  # stderr: the kernel's load time, where it is slow
    assert out == {"after_compile": 2, "after_set": 2}
