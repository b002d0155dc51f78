"""Path patching (Wang et al. 2022, "Interpretability in the Wild", sec. 3.1 and appendix B): the effect
of sender heads on chosen receivers only, every other path between them frozen.

Three kinds of pass on the clean prompts:

1. the clean and the corrupted runs, recording every head's output z;
2. the clean run with the senders' outputs taken from the corrupted run and every other head's output
   frozen at its clean value (MLPs and norms recomputed, as in the paper), recording what the
   receivers read: a head's query, key or value input reads its block's input stream, the logits
   read the stream before the final norm;
3. the clean run with only the receivers' inputs replaced by what pass 2 recorded (each receiver's
   norm recomputed from that stream; the receiver's other inputs, and every other input, as in the
   clean run).

The effect is M(pass 3) - M(clean), M the mean logit difference. With one last-layer head as sender and
the logits as receiver, it is the activation patching of that head (noising: the clean run with the
head's corrupted output).

Exactly 0, not a rounding of it, where nothing reaches the receivers: with no sender, with clean prompts
equal to the corrupted ones, and for a receiver at or below every sender's layer (it reads the stream
before any sender writes). Pass 3 feeds only the receivers whose stream pass 2 changed (a receiver whose
stream is bit for bit the clean run's, or that no sender can reach, is the model's own), keeps every
other head's input as the model computed it (a recomputation from the same stream may round otherwise
in another order), and is not run at all when no receiver changed.
"""

from __future__ import annotations

import torch

from ..effects.pairs import EncodedPairs
from .attribution import logit_diff
from .feeds import Capture
from .forward import Feed, split_pass
from .graph import Graph
from .wiring import Wiring


class _ZCapture(Capture):
    """Capture, plus every layer's z [batch, T, heads, d_head] (:attr:`zs`)."""

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph)
        self.zs: dict[int, torch.Tensor] = {}

    def z(self, layer, received):
        self.zs[layer] = received.detach()
        return received


class _Senders(Capture):
    """Pass 2: senders' z from the corrupted run, every other head's frozen at the clean run's."""

    def __init__(self, graph: Graph, clean: dict, corrupted: dict, senders: set) -> None:
        super().__init__(graph)
        self.clean, self.corrupted, self.senders = clean, corrupted, senders

    def z(self, layer, received):
        heads = [h for (lay, h) in self.senders if lay == layer]
        z = self.clean[layer].clone()
        z[:, :, heads] = self.corrupted[layer][:, :, heads]
        return z.to(received.dtype)


class _Receivers(Feed):
    """Pass 3: the receivers' inputs fed pass 2's streams; every other head input as the model computed it."""

    def __init__(self, graph: Graph, receivers: list, moved: dict) -> None:
        self.graph, self.receivers, self.moved = graph, receivers, moved

    def _rows(self, kind, layer) -> list[int]:
        return [index for (k, lay, index) in self.receivers if (k, lay) == (kind, layer)]

    def recomputed(self, kind, layer, received, new):
        """The receivers' heads recomputed from the fed stream, the other heads as received."""
        rows = self._rows(kind, layer)
        out = received.clone()
        out[:, rows] = new[:, rows]
        return out

    def delta(self, kind, layer):
        rows = self._rows(kind, layer)
        if not rows:
            return None
        shift = self.moved[(kind, layer)]
        if kind == "logits":
            return shift
        n = self.graph.heads if kind == "q" else self.graph.kv_heads
        out = torch.zeros((n, *shift.shape), dtype=shift.dtype, device=shift.device)
        out[rows] = shift
        return out


@torch.no_grad()
def path_patch(lm, wiring: Wiring, graph: Graph, enc: EncodedPairs, senders: list[tuple[int, int]],
               receivers: list[tuple[str, int, int]]) -> float:
    """The path-patching effect of ``senders`` on ``receivers`` (module docstring), in logits.

    Args:
        lm, wiring, graph: the model, its wiring and graph.
        enc: the encoded pairs (one pass each).
        senders: heads (layer, head).
        receivers: graph inputs (kind, layer, index): (``"q"``, layer, query head), (``"k"`` or
            ``"v"``, layer, key/value head), or (``"logits"``, layers, 0).

    Returns:
        M(pass 3) - M(clean run), mean over the pairs.

    Raises:
        ValueError: a receiver that is neither a head input nor the logits.
    """
    if any(k not in ("q", "k", "v", "logits") for k, _, _ in receivers):
        raise ValueError("receivers are heads' q, k or v inputs or the logits")
    rows = slice(0, len(enc))
    runs = {}
    for name, ids in (("clean", enc.clean), ("corrupted", enc.corrupted)):
        runs[name] = _ZCapture(graph)
        logits = split_pass(lm, wiring, ids, enc.mask, runs[name])
        if name == "clean":
            base = float(logit_diff(logits, enc, rows).double().mean())
    first = min((layer for layer, _ in senders), default=None)
    # a receiver at or below every sender's layer reads the stream before any sender writes: nothing to feed
    reached = [r for r in receivers if first is not None and (r[0] == "logits" or r[1] > first)]
    second = _Senders(graph, runs["clean"].zs, runs["corrupted"].zs, set(senders))
    if reached:
        split_pass(lm, wiring, enc.clean, enc.mask, second)
    moved = {}
    for kind, layer, _ in reached:
        if kind == "logits":
            shift = second.final - runs["clean"].final
        else:
            shift = second.reads[("stream", layer)] - runs["clean"].reads[("stream", layer)]
        if bool(shift.any()):  # a stream bit for bit the clean run's: the receiver is the model's own
            moved[(kind, layer)] = shift
    fed = [r for r in reached if (r[0], r[1]) in moved]
    if not fed:
        return 0.0
    logits = split_pass(lm, wiring, enc.clean, enc.mask, _Receivers(graph, fed, moved))
    return float(logit_diff(logits, enc, rows).double().mean()) - base
