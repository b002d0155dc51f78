"""The process's thread policy: OpenMP workers that sleep when they wait, and as many of them as the
cores this process may use.

torch's intra-op pool and numba's pool (the statistics' compiled pass, :mod:`probe.measures.kernel`;
numba's OpenMP threading layer, which it picks where it loads) are OpenMP thread pools, on Linux one
runtime (torch's ``libgomp.so.1``, which numba's layer links to). By default an OpenMP worker that runs
out of work spins on its core for a while before it sleeps, and each pool starts as many workers as the
machine has cores, whatever share of them the process gets. On a busy machine the spinning workers take
the cores the working ones (and the other processes) need: a run on 2 shared cores at load 11-15 took
5-20 times longer than its share of the CPU explains (``probe analyze``, 24 sentences on SmolLM2: 66.8 s
of wall time with the default policy, 10.6 s with this one). ``benchmarks/bench_contention.py`` measures
it: at load 8-10, 29.9 s against 4.4 s for the same analysis, and 78.8 s against 5.7 s beside 3 busy
processes (docs/measurements.md).

:func:`apply_environment` runs when ``probe`` is imported, before probe imports torch or numba (the
first line of ``probe/__init__.py``); it writes the environment variables the OpenMP runtimes read
when they are loaded:

- ``OMP_WAIT_POLICY=PASSIVE`` (a waiting worker sleeps) unless the user set ``OMP_WAIT_POLICY``; then
  also ``KMP_BLOCKTIME=0`` (Intel's OpenMP runtime, where one is loaded) unless the user set it;
- ``OMP_NUM_THREADS`` (torch's intra-op threads): ``PROBE_THREADS`` where it is set (an integer >= 1),
  else the user's ``OMP_NUM_THREADS`` as it is, else the cores this process may use (:func:`cores`:
  its CPU affinity, which a container or ``taskset`` narrows, not the machine's count);
- ``NUMBA_NUM_THREADS`` (the size of numba's pool) unless the user set it: the cores this process may use.
  The kernel runs on as many of them as torch has threads (:meth:`probe.measures.kernel.Compiled.set_threads`).

Where torch was imported before probe (a notebook that imported torch first), its pool has already read
the environment: the wait policy cannot apply to it in this process and ``OMP_NUM_THREADS`` no longer
sizes it. Nothing is said then (:func:`policy` reports ``late``); ``PROBE_THREADS`` is applied to torch
directly, :func:`set_threads` still sizes both pools, and the variables still reach the processes this
one starts (and numba's pool where it has a runtime of its own). Set ``OMP_WAIT_POLICY=PASSIVE`` before
Python starts to have the policy there too.

No heavy library: this module only reads ``sys.modules`` to find torch and numba where they are loaded.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

from .bounds import positive_int

#: The environment variable giving probe's thread count (an integer >= 1); ``probe --threads N`` reads it too.
ENV = "PROBE_THREADS"
#: The wait policy probe sets where the user set none: a waiting OpenMP worker sleeps instead of spinning.
WAIT_POLICY = "PASSIVE"

#: What :func:`apply_environment` and :func:`set_threads` did, read by :func:`policy`.
_state: dict = {}


def cores() -> int:
    """The number of CPU cores this process may run on: its affinity mask (``os.sched_getaffinity``,
    narrowed by a container's cpuset or ``taskset``), else ``os.cpu_count()`` (macOS, Windows), at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _env_threads(environ: MutableMapping[str, str]) -> int | None:
    """``PROBE_THREADS`` as an int >= 1, or None where it is unset or not such an integer (the command
    line refuses a bad value in one line; ``import probe`` cannot, so it falls back to the cores)."""
    try:
        n = int(environ.get(ENV, "").strip())
    except ValueError:
        return None
    return n if n >= 1 else None


def apply_environment(environ: MutableMapping[str, str] | None = None) -> dict:
    """Write probe's thread policy into ``environ`` (default ``os.environ``) where the user left it unset
    (the module docstring says which variables and when), and return what it decided (:func:`policy`'s keys).

    Called once when ``probe`` is imported. It takes effect for torch only where torch is not yet imported
    (``policy()["late"]`` says so otherwise). Given another mapping (a child process's environment), it
    writes the policy there and records nothing.
    """
    environ = os.environ if environ is None else environ
    late = "torch" in sys.modules
    usable = cores()
    policy_set = "OMP_WAIT_POLICY" not in environ
    if policy_set:
        environ["OMP_WAIT_POLICY"] = WAIT_POLICY
        environ.setdefault("KMP_BLOCKTIME", "0")
    asked = _env_threads(environ)
    if asked is not None:
        environ["OMP_NUM_THREADS"] = str(asked)
        source = ENV
    elif "OMP_NUM_THREADS" in environ:
        source = "OMP_NUM_THREADS"
    else:
        environ["OMP_NUM_THREADS"] = str(usable)
        source = "cores"
    environ.setdefault("NUMBA_NUM_THREADS", str(usable))
    if late and asked is not None and environ is os.environ:  # too late for torch's pool: sized directly
        sys.modules["torch"].set_num_threads(asked)
    record = {"wait_policy": environ["OMP_WAIT_POLICY"], "wait_policy_by_probe": policy_set,
              "threads": environ["OMP_NUM_THREADS"], "source": source, "cores": usable, "late": late}
    if environ is os.environ:
        _state.update(record)
    return record


def set_threads(n: int) -> int:
    """Run probe's computations on ``n`` threads: torch's intra-op threads (``torch.set_num_threads``) and
    numba's (``numba.set_num_threads``, at most its pool's ``NUMBA_NUM_THREADS``), where each is loaded;
    torch not yet loaded, ``OMP_NUM_THREADS`` is set instead, which torch reads when it is imported. The
    statistics kernel follows torch's count on every call. ``probe --threads N`` calls it before the
    command runs. Returns ``n``.

    Threads beyond :func:`cores` share cores and usually slow a run down. With waiting threads asleep, 2
    threads on 2 cores were faster than 1 beside 1 or 3 busy processes too (docs/measurements.md, "Fair
    under contention"). The wait policy is not changed (it is fixed when the OpenMP runtimes load:
    :func:`apply_environment`).

    Raises:
        InputError: ``n`` not an integer, or below 1 (one line).
    """
    n = positive_int("threads", n)
    numba = sys.modules.get("numba")
    if numba is not None and hasattr(numba, "set_num_threads"):  # first: it may start numba's pool (below)
        numba.set_num_threads(max(1, min(n, int(numba.config.NUMBA_NUM_THREADS))))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    else:
        os.environ["OMP_NUM_THREADS"] = str(n)
    _state.update(threads=str(n), source="set_threads")
    return n


@contextmanager
def torch_threads_kept() -> Iterator[None]:
    """Keep torch's thread count across a block that may start numba's thread pool (its first parallel
    call, ``numba.get_num_threads`` or ``numba.set_num_threads``).

    Where torch's wheel brings its own ``libgomp.so.1`` (Linux), numba's OpenMP pool links to that same
    runtime, and starting the pool sets the runtime's thread count to ``NUMBA_NUM_THREADS``, which torch
    reads as its own: a run on 4 threads of 16 cores would continue on 16 after its first statistics, and
    ``numba.set_num_threads(1)`` after ``torch.set_num_threads(1)`` would leave torch on all of them. Only
    the start does so (measured: numba's parallel calls afterwards leave torch's count as it is), and this
    puts it back.
    """
    torch = sys.modules.get("torch")
    n = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        if n is not None and torch.get_num_threads() != n:
            torch.set_num_threads(n)


def policy() -> dict:
    """The thread policy in force, as recorded: ``wait_policy`` (``OMP_WAIT_POLICY``'s value),
    ``wait_policy_by_probe`` (False: the user's own), ``threads`` (the count asked, a string as in the
    environment), ``source`` (``PROBE_THREADS``, ``OMP_NUM_THREADS``, ``cores`` or ``set_threads``),
    ``cores`` (:func:`cores`) and ``late`` (torch was imported before probe: the environment did not reach
    its pool). Empty before :func:`apply_environment` ran."""
    return dict(_state)
