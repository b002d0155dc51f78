"""What ``probe path``'s ``--senders`` and ``--receivers`` decide from the names alone: a receiver that
reads none of the senders. No torch at import, so that the command line answers before the seconds
torch's import takes (the ranges the model's config gives: :func:`probe.circuits.path_run.check_arguments`)."""

from __future__ import annotations

from ..bounds import HEAD_NAME, INPUT_NAME
from ..errors import InputError


def check_reads(senders: str, receivers: str) -> None:
    """Refuse a receiver head that reads none of the senders. A head reads the stream as it enters its
    layer, which holds the outputs of the layers below only, so a receiver at or below the layer of
    every sender gets exactly 0 from each of them, in every row it is in (``logits`` read everything).

    Args:
        senders, receivers: as ``--senders`` and ``--receivers`` give them (names of another form are
            left to :func:`probe.bounds.head_names`).

    Raises:
        InputError: a receiver at or below every sender's layer (naming both).
    """
    heads = [(int(m[1]), int(m[2])) for m in map(HEAD_NAME.fullmatch, (p.strip() for p in senders.split(","))) if m]
    if not heads:
        return
    lowest = min(heads)
    for part in (p.strip() for p in receivers.split(",")):
        m = INPUT_NAME.fullmatch(part)
        if m is not None and int(m[1]) <= lowest[0]:
            raise InputError(f"--receivers: {part} reads nothing the senders write: it is at layer {int(m[1])} and "
                             f"the lowest sender, L{lowest[0]}H{lowest[1]}, at layer {lowest[0]} (a head reads only "
                             "what the layers below it wrote), so every effect into it would be exactly 0; choose "
                             "receivers above a sender, or logits")
