"""Data-parallel analysis on ``torch.distributed``: shards of the corpus, one reduction.

probe's statistics are sums and counts, so shards of a corpus merge by addition. Under a launcher
that sets ``WORLD_SIZE`` and ``RANK`` (``torchrun``, ``accelerate launch``), ``probe analyze``:

1. joins the process group the launcher describes (gloo on CPU, nccl on GPU);
2. reads only its shard: the texts whose corpus position i satisfies ``i % world_size == rank``
   (deterministic, and every text keeps its corpus position, so the example maps are those of the
   first texts of the corpus whichever rank read them);
3. accumulates as one process would;
4. gathers every rank's accumulators (``all_gather_object``) and merges them in rank order into
   each rank's own (:meth:`probe.measures.accumulators.Accumulator.merge`); rank 0 writes the one report.

The result equals a single-process run on the same corpus: identical counts and labels, statistics
within float64 summation order (the tests check 1e-6).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..text.inputs import Text


@dataclass(frozen=True)
class World:
    """This process's place among the launcher's processes.

    Attributes:
        rank: this process (0 writes the report).
        size: number of processes.
        local_rank: this process on its machine (its GPU, where there are GPUs).
    """

    rank: int
    size: int
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """The process that writes results."""
        return self.rank == 0


def detect(environ=None) -> World | None:
    """The launcher's world from the environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``), or None
    for a single process (no launcher, or a world of one)."""
    env = os.environ if environ is None else environ
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError:
        return None
    if size <= 1:
        return None
    return World(rank, size, local)


@contextmanager
def process_group(world: World, backend: str | None = None, timeout_s: float = 1800.0) -> Iterator[World]:
    """Join the launcher's process group for the duration of the context (and leave it after).

    Args:
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (GPU); default nccl when CUDA is available, else gloo.
        timeout_s: how long a collective waits for the other ranks (seconds).
    """
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(backend=backend, rank=world.rank, world_size=world.size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    try:
        yield world
    finally:
        if created and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def shard(texts: Iterable, world: World | None) -> Iterator[Text]:
    """This rank's share of a corpus: the texts at positions i with ``i % size == rank``, each
    carrying its corpus position (:attr:`probe.text.inputs.Text.index`). One process: every text."""
    for i, t in enumerate(texts):
        if world is None or i % world.size == world.rank:
            t = t if isinstance(t, Text) else Text(t)
            if t.index is None:
                t.index = i
            yield t


def reducer(world: World | None):
    """A ``reduce`` callable for :func:`probe.runs.analysis.analyze`: gathers every rank's accumulators
    and merges them into this rank's, in rank order (None for one process)."""
    if world is None:
        return None

    def reduce(accumulators: list) -> None:
        gathered: list = [None] * world.size
        dist.all_gather_object(gathered, accumulators)
        for rank in range(world.size):
            if rank == world.rank:
                continue
            for mine, theirs in zip(accumulators, gathered[rank]):
                mine.merge(theirs)
    return reduce
