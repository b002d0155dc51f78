"""Attention sites: the unit every capture callback and every accumulator is keyed by.

A site is one place in a model that produces attention probabilities: one layer of one stack, of
one kind. Its tensor always has one canonical shape and name (as TransformerLens' ``hook_pattern``)::

    probs  # [batch, heads, query, key]: attention probabilities, each real query row sums to 1

Today's models have self-attention sites only (``encoder.<layer>.self`` for encoders,
``decoder.<layer>.self`` for decoder-only models); encoder-decoder models add
``decoder.<layer>.cross`` (queries from the target, keys from the source).

:func:`visible_keys` is the one place that says which keys a query row may see under a site's own
mask (causal, sliding window): the statistics (``norm_entropy``'s k_i) and the
from-scratch attention's causal mask both take it from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

STACKS = ("encoder", "decoder")
KINDS = ("self", "cross")

#: The short site prefix of an encoder-decoder model's heads in display names, by (stack, kind); a dual
#: encoder's joined heads table (:mod:`probe.entries.towers`) names its towers in ``stack`` (``text``, ``vision``).
SITE_PREFIX = {("encoder", "self"): "enc", ("decoder", "self"): "dec", ("decoder", "cross"): "cross",
               ("text", "self"): "text", ("vision", "self"): "vision"}


@dataclass(frozen=True)
class Site:
    """One attention site.

    Attributes:
        stack: ``"encoder"`` or ``"decoder"``.
        layer: layer index within its stack (0-based).
        kind: ``"self"`` or ``"cross"``.
        causal: queries see only keys at or before their own position.
        window: sliding-window size (a query sees at most this many keys, itself included), or
            None for no window. A causal window's keys end at the query; a bidirectional one (ModernBERT's
            local layers, T5Gemma's encoder) is a band around it.
        ahead: of a bidirectional window's keys, how many lie after the query (0 for a causal site): query i
            sees keys i - (window - 1 - ahead) .. i + ahead (ModernBERT, ``local_attention`` L: a window of
            L + 1 keys, L / 2 ahead).
    """

    stack: str
    layer: int
    kind: str = "self"
    causal: bool = False
    window: int | None = None
    ahead: int = 0

    def __post_init__(self) -> None:
        if self.stack not in STACKS or self.kind not in KINDS:
            raise ValueError(f"bad site {self.stack!r}/{self.kind!r}; stacks {STACKS}, kinds {KINDS}")

    @property
    def band(self) -> tuple[int, int] | None:
        """(keys before the query, keys after it) that its window lets it see, or None for no window."""
        if self.window is None:
            return None
        return self.window - 1 - self.ahead, self.ahead

    def record(self) -> dict:
        """The site's mask as JSON: ``{"site", "causal", "window", "before", "after"}`` (window None: every
        key the mask's causality allows)."""
        before, after = self.band or (None, None)
        return {"site": self.name, "causal": self.causal, "window": self.window, "before": before, "after": after}

    @property
    def name(self) -> str:
        """Canonical name, ``"<stack>.<layer>.<kind>"`` (e.g. ``"decoder.3.self"``)."""
        return f"{self.stack}.{self.layer}.{self.kind}"

    def __str__(self) -> str:
        return self.name


def causal_keep(n_query: int, n_key: int, *, window: int | None = None, device=None) -> torch.Tensor:
    """Boolean [query, key] mask of a causal site: query i keeps key j <= its position (and within
    the window). The queries are the last ``n_query`` of ``n_key`` positions (true with a key/value
    cache), so query i sits at position ``n_key - n_query + i``.

    Args:
        window: sliding-window size W: a query keeps the W keys ending at itself (Mistral; the rule
            ``key > query - W`` of transformers' masks). None: no window.
    """
    q_pos = torch.arange(n_key - n_query, n_key, device=device)[:, None]  # (Tq, 1)
    k_pos = torch.arange(n_key, device=device)[None, :]  # (1, Tk)
    keep = k_pos <= q_pos  # (Tq, Tk)
    if window is not None:
        keep = keep & (k_pos > q_pos - window)
    return keep


def band_keep(site: Site, n_query: int, n_key: int, *, device=None) -> torch.Tensor | None:
    """Boolean [query, key] mask of a bidirectional window (queries and keys one sequence): query i keeps
    keys i - before .. i + after (:attr:`Site.band`; transformers' rule ``|i - j| <= w`` for ModernBERT's
    ``w = local_attention / 2``); None for a site without one (a causal site: :func:`causal_keep`)."""
    if site.causal or site.window is None:
        return None
    before, after = site.band
    offset = torch.arange(n_key, device=device)[None, :] - torch.arange(n_query, device=device)[:, None]
    return (offset >= -before) & (offset <= after)


def first_visible(site: Site, T: int) -> torch.Tensor:
    """[T] the first key position each query position may see under the site's window (0 without one)."""
    pos = torch.arange(T)
    if site.window is None:
        return torch.zeros(T, dtype=torch.long)
    return (pos - site.band[0]).clamp(min=0)


def visible_keys(site: Site, lengths: torch.Tensor, T: int) -> torch.Tensor:
    """[batch, T] number of keys k_i each query row may see under the site's own mask.

    ``lengths`` [batch] are the real tokens of each right-padded row: an encoder row sees every
    real token (k_i = length), a causal row sees positions 0..i (k_i = i + 1), and a sliding window
    of W keys caps that at W (k_i = min(i + 1, W)). A bidirectional window of ``before`` keys before
    the query and ``after`` after it (:attr:`Site.band`) sees the real keys of that band:
    k_i = min(length - 1, i + after) - max(0, i - before) + 1. Padded rows get the same formula
    (at least 0); callers mask them out.
    """
    pos = torch.arange(T, device=lengths.device)
    if not site.causal and site.window is not None:
        before, after = site.band
        last = torch.minimum(pos[None, :] + after, lengths[:, None] - 1)
        return (last - (pos - before).clamp(min=0)[None, :] + 1).clamp(min=0)
    if not site.causal:
        return lengths[:, None].expand(-1, T)
    k = pos + 1
    if site.window is not None:
        k = k.clamp(max=site.window)
    return k[None, :].expand(lengths.shape[0], T)


def site_prefix(stack: str | None, kind: str | None = "self") -> str:
    """The display prefix of an encoder-decoder model's site kind (``enc``, ``dec``, ``cross``); ``""``
    when ``stack`` is None or empty (a one-stack model, whose heads need no prefix).

    Raises:
        ValueError: an unknown (stack, kind).
    """
    if stack is None or stack == "" or (isinstance(stack, float) and stack != stack):  # None, "", NaN
        return ""
    try:
        return SITE_PREFIX[(str(stack), str(kind or "self"))]
    except KeyError:
        raise ValueError(f"bad site {stack!r}/{kind!r}; stacks {STACKS}, kinds {KINDS}") from None


def head_name(where, head: int) -> str:
    """The one display name of a head: ``"L4H5"`` (layer 4, head 5, both 0-based), and for an
    encoder-decoder model's heads the site kind first: ``"enc L4H5"``, ``"dec L4H5"``, ``"cross L4H5"``.

    Every message, page and view names heads this way; tables (CSV) keep separate ``layer`` and
    ``head`` (and ``stack`` / ``kind``) columns instead.

    Args:
        where: the layer (an int: a one-stack model's layer), a :class:`Site` (named with its
            prefix: only an encoder-decoder model has several site kinds; for a one-stack model's
            site pass ``site.layer``), or a mapping / row with ``layer`` and, for an
            encoder-decoder model, ``stack`` and ``kind`` (a row of a heads table).
        head: the head index within its layer.

    Raises:
        ValueError: an unknown stack / kind.
    """
    if isinstance(where, Site):
        return f"{site_prefix(where.stack, where.kind)} L{where.layer}H{int(head)}"
    if hasattr(where, "get") or hasattr(where, "_fields"):  # a dict, pandas row or namedtuple
        get = where.get if hasattr(where, "get") else lambda k, d=None: getattr(where, k, d)
        prefix = site_prefix(get("stack", None), get("kind", None))
        name = f"L{int(get('layer'))}H{int(head)}"
        return f"{prefix} {name}" if prefix else name
    return f"L{int(where)}H{int(head)}"
