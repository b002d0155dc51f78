"""What ``probe path``'s ``--senders`` and ``--receivers`` decide before anything heavy is imported:
a receiver that reads none of the senders (refused from the names alone, at once), and a head out of
the range the model's config gives (read only once the names pass). No torch at import: the command
line calls it before the model, and torch, load."""

from __future__ import annotations

from ..bounds import HEAD_NAME, INPUT_NAME
from ..errors import InputError


def check_arguments(senders: str, receivers: str, model=None) -> None:
    """Refuse what ``--senders`` and ``--receivers`` decide before any weight loads (a second where
    loading the model and patching take minutes): a receiver head that reads none of the senders, and
    a head out of the model's range. A head reads the stream as it enters its layer, which holds the
    outputs of the layers below only, so a receiver at or below the layer of every sender gets exactly
    0 from each of them, in every row it is in.

    Args:
        senders, receivers: as ``--senders`` and ``--receivers`` give them
            (:func:`probe.circuits.path_run.parse_senders`, :func:`~probe.circuits.path_run.parse_receivers`).
        model: the model's ``transformers`` config, or its name (an alias or a folder: its config is
            read without the weights, :func:`probe.loading.models.peek_config`, once the names pass), or
            None (the ranges are checked once the model has loaded).

    Raises:
        InputError: a receiver at or below every sender's layer (naming both); a name out of range (the
            words of ``parse_senders`` and ``parse_receivers``).
    """
    heads = [(int(m[1]), int(m[2])) for m in map(HEAD_NAME.fullmatch, (p.strip() for p in senders.split(","))) if m]
    if heads:
        lowest = min(heads)
        for part in (p.strip() for p in receivers.split(",")):
            m = INPUT_NAME.fullmatch(part)
            if m is not None and int(m[1]) <= lowest[0]:
                raise InputError(f"--receivers: {part} reads nothing the senders write: it is at layer {int(m[1])} "
                                 f"and the lowest sender, L{lowest[0]}H{lowest[1]}, at layer {lowest[0]} (a head "
                                 "reads only what the layers below it wrote), so every effect into it would be "
                                 "exactly 0; choose receivers above a sender, or logits")
    if isinstance(model, str):
        from ..loading.models import peek_config  # deferred: torch and transformers, only once the names pass

        model = peek_config(model)
    if model is None:
        return
    from ..architectures.modules import head_geometry  # deferred: torch
    from .graph import Graph
    from .path_run import parse_receivers, parse_senders

    try:
        g = head_geometry(model)
    except Exception:  # noqa: BLE001 - an architecture the config alone does not describe: checked once loaded
        return
    names = Graph(g.n_layers, g.n_heads, g.n_kv_heads)
    parse_senders(senders, names)
    parse_receivers(receivers, names)
