"""The steps of one attention weight: for one site, head and query token, every key's score from
the query and key vectors to the softmax, read from the attention call the model itself makes.

    steps = attention_steps(lm, "The cat sat on the mat.", site=3, head=5, query=4)
    steps[["token", "score", "scaled_score", "probability"]]

The steps follow scaled dot-product attention (Vaswani et al. 2017, sec. 3.2.1) with each
architecture's own rule: the score is q . k (after RoPE where the model rotates q and k; the key
from the key/value head the query head reads under GQA), the scaled score is
``softcap(score * scale) + bias`` (the scale 1/sqrt(d_head), GPT-2's options, Gemma's
``query_pre_attn_scalar``, 1 for T5; ALiBi's or T5's position bias, DeBERTa's relative terms; Gemma 2's
softcap), then the mask (causality, padding, a sliding window) and the softmax, with a sink logit as
one more softmax column where the model has one (gpt-oss). The probabilities are checked against the
ones the model's attention returned.

Where the numbers come from (``via``): ``"function"`` (the default) records them inside probe's
attention function (:mod:`probe.capture.interface`), from the :class:`~probe.capture.interface.Call`
that every model whose attention calls transformers' attention interface makes (the hand-written
families and every discovered type), and that probe's reference module makes for the hand families
whose transformers code computes attention inline (DeBERTa, BLOOM, GPT-Neo, MPNet): the query after
rotation, the key and value heads as the model has them, the mask, the scaling and the extra terms,
so the steps are the model's own. ``"reference"`` runs probe's from-scratch module
(:class:`probe.capture.reference.ReferenceAttention`, hand families only), which projects q, k and v
from the weights itself: the independent route the tests compare with.

Models whose attention is their own code outside the interface (capture-only types: RoFormer, XGLM,
BigBird, MPT ...) make no call to read; their steps come from one pass that hooks their query, key and
value projections (found by name: :func:`probe.architectures.own_code.own_projections`) and reads their
maps p (:func:`own_steps`). The score is q . k and the scaled score q . k * scale (1/sqrt(d_head) unless
the config says otherwise: :func:`probe.architectures.own_code.own_scale`); a key whose probability is
exactly 0 is masked. As the model's logits are log p up to a constant per row, ``implied`` = log p -
scaled score, shifted to mean 0 over each row's unmasked keys, is the part of the model's score that
probe cannot see it compute. Where that term is 0 within :func:`implied_tolerance` (per unit of the
head's largest |scaled score|), the model does plain scaled dot-product attention and the steps are
checked like any other's (the softmax of the scaled scores against its probabilities; ``implied``
None); elsewhere (RoFormer's rotation, MPT's ALiBi, DeBERTa v1's relative terms) the implied term is
one more column and the softmax is of scaled score + implied term. A ``note`` says which, and where q,
k and v came from. A site whose projections probe does not find or cannot split into heads (Reformer's
LSH layers: one shared ``query_key``) is refused in one line naming what is missing
(:func:`steps_refusal`).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..architectures import site_outputs
from ..architectures.discovered import refuse_capture_only
from ..architectures.own_code import OwnProjections, own_projections, own_scale
from ..capture import values
from ..capture.failures import forward_failures
from ..capture.hooks import Hooks, calls_function, measuring
from ..capture.interface import ARITHMETIC, site_listeners, with_sinks
from ..capture.maps import attention_hooks, encode, forward
from ..capture.op import scaled_scores, scored_attention
from ..capture.reference.swap import swap_attention
from ..capture.swapped import swap_if_agrees
from ..capture.values import output_gram
from ..core import LoadedModel
from ..errors import CaptureError, InputError, UnsupportedArchitectureError
from ..loading.seq2seq import sides
from ..sites import SITE_PREFIX, Site, head_name
from ..text.inputs import Text
from ..text.tokens import display_tokens

#: The step an exception inside the model's own forward pass is reported in (:mod:`probe.capture.failures`).
STEP = "the attention steps' forward pass"

#: Tolerance of the check that the softmax row equals the model's captured probabilities (fp32).
STEP_ATOL = 1e-5


@dataclass
class StepsInfo:
    """What a steps table is about (``DataFrame.attrs["steps"]``).

    Attributes:
        site: the site's canonical name; name: the head's display name (``L4H5``, ``cross L4H5``).
        head, kv_head: the query head and the key/value head it reads; query: the query's position.
        query_token: the query's display token; scale: the multiplier of q . k; softcap: Gemma 2's
            cap or None; max_diff: max |softmax row - the model's own probabilities|; note: a capture-only
            model's line on where q, k and v came from and what its probabilities showed (None otherwise).
    """

    site: str
    name: str
    head: int
    kv_head: int
    query: int
    query_token: str
    scale: float
    softcap: float | None
    max_diff: float
    note: str | None = None


def _short(lm: LoadedModel, site: Site) -> str:
    """A site's display form: ``L3`` (one-stack models), ``enc L3``, ``dec L3``, ``cross L3``."""
    return (head_name(site, 0) if lm.kind == "encoder-decoder" else head_name(site.layer, 0))[:-2]


def find_site(lm: LoadedModel, site) -> Site:
    """A site of ``lm`` from its index in ``lm.sites``, a :class:`Site`, its canonical name
    (``"decoder.3.cross"``) or its display form (``"L3"``, ``"enc L3"``, ``"dec L3"``, ``"cross L3"``).

    Raises:
        InputError: no such site.
    """
    sites = lm.sites
    if isinstance(site, (int, np.integer)) and not isinstance(site, bool):
        if 0 <= int(site) < len(sites):
            return sites[int(site)]
    elif isinstance(site, Site):
        for s in sites:
            if (s.stack, s.layer, s.kind) == (site.stack, site.layer, site.kind):
                return s
    elif isinstance(site, str):
        for s in sites:
            prefix = SITE_PREFIX.get((s.stack, s.kind), "") if lm.kind == "encoder-decoder" else ""
            if site.strip() in (s.name, f"{prefix} L{s.layer}".strip()):
                return s
    short = _short(lm, sites[0])
    extra = ("" if lm.kind == "encoder-decoder"
             else "; the 'enc', 'dec' and 'cross' forms name the sites of encoder-decoder models")
    raise InputError(f"no site {site!r}: {lm.name} has {len(sites)} sites, 0-{len(sites) - 1} (an index, a name "
                     f"such as {sites[0].name!r}, or {short!r}){extra}")


def value_norms(lm: LoadedModel, site: Site, head: int, v: torch.Tensor) -> torch.Tensor:
    """||f_h(x_j)|| = ||v_j W_O^h|| per key [Tk], v [Tk, d_head] the head's values (with their bias),
    through the value-weighted attention's own Gram matrix of the output projection
    (:func:`probe.capture.values.output_gram`, :func:`probe.capture.values.value_norms`; Kobayashi et al. 2020,
    sec. 3; b_O is not split between heads). A physically pruned layer's projection holds
    only its present heads' blocks; ``head`` counts those."""
    out = dict(site_outputs(lm.model))[site]
    d_head = v.shape[-1]
    gram = output_gram(lm.spec, out, d_head)[head:head + 1]  # [1, d_head, d_head]
    return values.value_norms(v[None, None], gram)[0, 0].to(v.dtype)


def steps_refusal(lm: LoadedModel, site) -> str | None:
    """The line :func:`heads_steps` refuses a site's steps with, known before any pass: on a capture-only
    model, a site whose query, key and value projections probe does not find or cannot split into heads
    (:func:`probe.architectures.own_code.own_projections`: Reformer's LSH layers); None where it runs."""
    if not lm.spec.capture_only:
        return None
    try:
        own_projections(lm.model, lm.spec, find_site(lm, site))
    except UnsupportedArchitectureError as e:
        return str(e)
    return None


def head_steps(lm: LoadedModel, text, site=0, head: int = 0, max_length: int | None = None, *,
               via: str = "function") -> dict:
    """One head's steps for every query of one text, as numpy arrays (what the step view draws).

    Returns:
        A dict: ``site`` (:class:`Site`), ``head``, ``kv_head``, ``scale``, ``softcap``; ``q`` [Tq, d_qk],
        ``k`` [Tk, d_qk], ``v`` [Tk, d_v]; ``score``, ``bias``, ``scaled``, ``keep``, ``probs`` (the softmax
        recomputed from these steps) and ``model_probs`` (what the model's attention returned) [Tq, Tk];
        ``value_norm`` [Tk] (NaN where probe found no output projection); ``output`` [Tq, d_v] (the head's
        output before the output projection); ``sink`` [Tq] (the sink logit of each query row, one more
        softmax column: rows of ``probs`` then sum to less than 1) or None; ``q_tokens``, ``k_tokens``
        (display tokens). Real tokens only (one text: no padding). A capture-only model's also have
        ``implied`` [Tq, Tk] (its own term implied by its probabilities, or None where its scaled scores
        alone give them: :func:`own_steps`), ``implied_max`` (that term's largest |value|) and ``note``.

    Raises:
        InputError: no such site or head; not one text.
        UnsupportedArchitectureError: a capture-only site probe cannot read (:func:`heads_steps`).
    """
    return heads_steps(lm, text, [(site, head)], max_length, via=via)[0]


def heads_steps(lm: LoadedModel, text, picks, max_length: int | None = None, *, model_probs: bool = True,
                via: str = "function") -> list[dict]:
    """:func:`head_steps` of several heads of one text.

    Args:
        lm: a loaded model; text: one text (as :func:`attention_steps` takes it).
        picks: ``(site, head)`` pairs (a site as :func:`find_site` takes it).
        max_length: token limit (default: the model's limit).
        model_probs: also the model's own probabilities (``model_probs``; False leaves them out and the
            key absent).
        via: ``"function"``: one forward pass of the model with probe's attention function recording
            every pick from its calls (:func:`call_steps`), the probabilities the call returned as
            ``model_probs``; a hand family that probe's reference module does not reproduce as it runs
            (BLOOM with ``slow_but_exact``) falls back to ``"reference"``. ``"reference"``: probe's
            from-scratch module (hand families only), one pass per head of the site with the most picks,
            and one pass of the model for ``model_probs`` (module docstring). A capture-only model's steps
            come from its projections and maps (module docstring) whatever ``via`` says, except that
            ``"reference"`` is refused there.

    Returns:
        :func:`head_steps`' dicts, one per pick, in order.

    Raises:
        InputError: no such site or head; not one text; an unknown ``via``.
        UnsupportedArchitectureError: a capture-only model's site whose projections probe does not find or
            cannot split into heads (:func:`steps_refusal`); ``via="reference"`` on a type without a
            hand-written spec (a capture-only one included).
    """
    if not isinstance(text, (str, Text)):
        raise InputError("attention steps need one text (a string or probe.Text)")
    if via not in ("function", "reference"):
        raise InputError(f"via must be 'function' or 'reference', not {via!r}")
    if via == "reference":
        refuse_capture_only(lm.spec, "attention steps by probe's from-scratch module (via='reference')")
    wanted = [(find_site(lm, site), int(head)) for site, head in picks]
    batch = encode(lm, [text], max_length)
    if lm.spec.capture_only:
        with torch.no_grad():
            recorded = _own_code_steps(lm, batch, wanted)
        return [_steps_dict(lm, batch, where, head, recorded[(where, head)],
                            recorded[(where, head)]["model_probs"] if model_probs else None)
                for where, head in wanted]
    with torch.no_grad():
        found = _function_steps(lm, batch, wanted) if via == "function" else None
        if found is None:
            recorded, captured = _reference_steps(lm, batch, wanted, model_probs)
        else:
            recorded = found
            captured = {pick: st.pop("model_probs") for pick, st in found.items()}
    return [_steps_dict(lm, batch, where, head, recorded[(where, head)],
                        captured.get((where, head)) if model_probs else None) for where, head in wanted]


def _function_steps(lm: LoadedModel, batch, wanted: list[tuple[Site, int]]) -> dict | None:
    """Every pick's steps from one forward pass through probe's attention function (:func:`call_steps`,
    with ``model_probs``), or None where the model does not run the function (a hand family outside
    the interface whose reference module does not reproduce it: the caller uses the reference route)."""
    heads_at: dict[Site, list[int]] = {}
    for where, head in wanted:
        heads_at.setdefault(where, [])
        if head not in heads_at[where]:
            heads_at[where].append(head)
    got: dict[tuple[Site, int], dict] = {}
    bad: list[str] = []

    def on_call(site: Site, call) -> None:
        if site not in heads_at or call.rows is not None or any((site, h) in got for h in heads_at[site]):
            return  # not picked, a block of rows (not under steps), or a second call of the site
        n = call.query.shape[1]
        for head in heads_at[site]:
            if not 0 <= head < n:
                bad.append(f"no head {head}: {_short(lm, site)} has heads 0-{n - 1}")
                return
            got[(site, head)] = call_steps(call, head)

    with measuring(lm.model) as m, ExitStack() as stack, forward_failures(STEP, lm.model):
        if not calls_function(lm) and not swap_if_agrees(lm, stack):
            return None
        site_listeners(m.hooks, lm.model, lm.spec, on_call)
        forward(lm, batch)
    if bad:
        raise InputError(bad[0])
    missing = [where.name for where, head in wanted if (where, head) not in got]
    if missing:
        raise CaptureError(f"site {missing[0]} of {lm.name} made no call of probe's attention function in a forward "
                           "pass: probe has no steps to show there")
    return got


def _reference_steps(lm: LoadedModel, batch, wanted: list[tuple[Site, int]], model_probs: bool) -> tuple[dict, dict]:
    """Every pick's steps from probe's from-scratch module (one pass per head of the site with the most
    picks: each site records one head a pass) and, with ``model_probs``, one pass of the model for its
    own probabilities (every picked site at once)."""
    rounds: list[dict[Site, int]] = []  # pass k: site -> the k-th head picked there
    for where, head in wanted:
        free = next((r for r in rounds if where not in r), None)
        if free is None:
            rounds.append(free := {})
        free[where] = head
    recorded: dict[tuple[Site, int], dict] = {}
    for chosen in rounds:
        # measuring() checks the ids as every forward pass of probe does (a model with one segment type gets
        # its segment ids dropped)
        with measuring(lm.model, eager=False) as m, swap_attention(lm, hooks=m.hooks) as swapped:
            modules = {where: swapped.modules[lm.sites.index(where)] for where in chosen}
            for where, head in chosen.items():
                if not 0 <= head < modules[where].n_head:
                    raise InputError(f"no head {head}: {_short(lm, where)} has heads 0-{modules[where].n_head - 1}")
                modules[where].step_request = head
            forward(lm, batch)
        recorded.update({(where, head): modules[where].steps for where, head in chosen.items()})
    captured: dict[tuple[Site, int], torch.Tensor] = {}
    if model_probs:
        heads_at = {where: sorted({h for w, h in wanted if w == where}) for where, _ in wanted}
        with attention_hooks(lm, lambda s, p: captured.update({(s, h): p[0, h] for h in heads_at[s]})
                             if s in heads_at else None):
            forward(lm, batch)  # the model's own probabilities
    return recorded, captured


def implied_tolerance(dtype: torch.dtype) -> float:
    """The largest |implied term| (logit units, per unit of the head's largest |scaled score|, at least 1)
    that still counts as none (:func:`own_steps`): 1e-4 for float32 maps, 8 machine epsilons of a
    coarser dtype's (float16: 7.8e-3, bfloat16: 6.3e-2), the rounding of log p and of the model's own q . k."""
    return max(1e-4, 8 * torch.finfo(dtype).eps)


def own_steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, probs: torch.Tensor, scale: float) -> dict:
    """One head's steps of a capture-only model (its own attention code, module docstring) from the q, k
    and v its projections gave and the probabilities its code returned.

    The content score is q . k, scaled by ``scale``. The model's own logits are log p up to a constant
    per query row, so ``implied`` = log p - scaled, shifted to mean 0 over each row's unmasked keys, is the
    part of its score that the content score does not explain. Where its largest |value| over keys with
    a normal (not subnormal) probability is within :func:`implied_tolerance` of the maps' dtype times
    max(1, the largest |scaled score|), the model does plain scaled dot-product attention here:
    ``implied`` is None and ``probs`` is the softmax of the scaled scores (checked against
    ``model_probs``); else ``probs`` is the softmax of scaled + implied.

    Args:
        q [Tq, d], k [Tk, d], v [Tk, d_v]: one head's (batch row 0); probs [Tq, Tk]: what the model returned.
        scale: the multiplier of q . k (:func:`probe.architectures.own_code.own_scale`).

    Returns:
        :func:`call_steps`' keys (``bias`` zeros, ``sink`` None, ``softcap`` None; ``output`` = the model's
        probabilities times v [Tq, d_v]) and ``implied`` [Tq, Tk] or None, ``implied_max`` (its largest
        |value| over unmasked keys, before the tolerance decides). A key whose probability is exactly 0 is
        masked (``keep`` False, ``implied`` 0 there).
    """
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    score = q.to(work) @ k.to(work).transpose(-2, -1)
    scaled = score * scale
    p = probs.to(work)
    keep = probs > 0
    raw = torch.where(keep, torch.where(keep, p, 1).log() - scaled, torch.zeros_like(scaled))
    n = keep.sum(-1, keepdim=True).clamp(min=1)
    implied = torch.where(keep, raw - raw.sum(-1, keepdim=True) / n, torch.zeros_like(raw))
    normal = probs >= torch.finfo(probs.dtype).tiny
    off = float(implied[normal].abs().max()) if bool(normal.any()) else 0.0
    size = max(1.0, float(scaled[keep].abs().max())) if bool(keep.any()) else 1.0
    plain = off <= implied_tolerance(probs.dtype) * size
    logits = (scaled if plain else scaled + implied).masked_fill(~keep, float("-inf"))
    soft = torch.where(keep.any(-1, keepdim=True), torch.softmax(logits, -1), torch.zeros_like(logits))
    return dict(q=q, k=k, v=v, kv_head=0, score=score, bias=torch.zeros_like(score), scaled=scaled, keep=keep,
                probs=soft, model_probs=probs, output=probs.to(v.dtype) @ v, sink=None, scale=float(scale),
                softcap=None, implied=None if plain else implied, implied_max=off)


def _own_code_steps(lm: LoadedModel, batch, wanted: list[tuple[Site, int]]) -> dict:
    """Every pick's steps of a capture-only model from one forward pass: its maps (:func:`attention_hooks`) and
    the outputs of its query, key and value projections (:func:`probe.architectures.own_code.own_projections`,
    hooked), then :func:`own_steps`, with ``note`` (what probe saw and did not).

    Raises:
        UnsupportedArchitectureError: no projections probe knows, or widths that do not split into heads.
        InputError: no such head. CaptureError: a projection that did not run before its site's maps.
    """
    found: dict[Site, OwnProjections] = {}
    for where, head in wanted:
        if where not in found:
            found[where] = own_projections(lm.model, lm.spec, where)
        n = found[where].n_heads
        if not 0 <= head < n:
            raise InputError(f"no head {head}: {_short(lm, where)} has heads 0-{n - 1}")
    outputs: dict[Site, dict[str, torch.Tensor]] = {where: {} for where in found}
    taken: dict[Site, tuple] = {}

    def record(where: Site, role: str):
        def hook(module, args, output):
            out = output[0] if isinstance(output, (tuple, list)) else output
            if out.dim() == 3 and out.shape[0] != 1 and out.shape[1] == 1:  # time first (FSMT): [T, 1, width]
                out = out.transpose(0, 1)
            outputs[where][role] = out.detach()  # one text: batch 1
        return hook

    def on_probs(site: Site, probs: torch.Tensor) -> None:
        if site not in found or site in taken:
            return
        own = found[site]
        gone = [own.names[r] for r in own.modules if r not in outputs[site]]
        if gone:
            raise CaptureError(f"site {site.name} of {lm.name}: its projection {gone[0]} did not run before its "
                               "attention maps: probe has no steps to show there")
        taken[site] = (own.heads(outputs[site]), probs[:1])

    with attention_hooks(lm, on_probs), Hooks() as hooks:
        for where, own in found.items():
            for role, module in own.modules.items():
                hooks.forward(module, record(where, role))
        forward(lm, batch)
    got = {}
    for where, head in wanted:
        (q, k, v), probs = taken[where]
        own, (T, Tk) = found[where], probs.shape[-2:]
        if q.shape[2] < T or k.shape[2] < Tk:
            raise CaptureError(f"site {where.name} of {lm.name}: its projections gave {q.shape[2]} queries and "
                               f"{k.shape[2]} keys for maps of {T} x {Tk}: probe cannot pair them")
        g = head * own.n_kv_heads // own.n_heads
        scale = own_scale(lm.model.config, lm.spec.family, own.d_head)
        st = own_steps(q[0, head, :T], k[0, g, :Tk], v[0, g, :Tk], probs[0, head], scale)
        st["kv_head"] = g
        st["note"] = _own_note(lm, own, st)
        got[(where, head)] = st
    return got


def _own_note(lm: LoadedModel, own: OwnProjections, st: dict) -> str:
    """The record's note on a capture-only model's steps: where q, k, v came from and what the check found."""
    names = ", ".join(own.names.values())
    start = (f"{lm.spec.family} computes attention in its own code: probe read q, k and v from its projection"
             f"{'s' if len(own.names) > 1 else ''} {names} and computed q . k times {st['scale']:.6g} itself; ")
    if st["implied"] is None:
        diff = float((st["probs"] - st["model_probs"].float()).abs().max())
        return (start + "the softmax of these scaled scores is the probabilities the model returned (max difference "
                f"{diff:.1e}): it does plain scaled dot-product attention here.")
    return (start + "its probabilities are not the softmax of these scaled scores: its score holds a term of its "
            f"own (largest |term| {st['implied_max']:.3g}; rotary positions, relative-position terms, ALiBi, block "
            "or hashing schemes ...) that probe cannot see it compute. The implied term column is that term read "
            "back from the probabilities: log p - scaled score, shifted to mean 0 over each row's unmasked keys.")


def _one_head(x: torch.Tensor | None, head: int, T: int, Tk: int) -> torch.Tensor | None:
    """Batch row 0 and ``head`` of a tensor broadcastable to [batch, heads, query, key], as [1, 1, T, Tk]."""
    if x is None:
        return None
    while x.dim() < 4:
        x = x.unsqueeze(0)
    x = x[:1]
    if x.shape[1] > 1:
        x = x[:, head:head + 1]
    return x.expand(1, 1, T, Tk)


def call_steps(call, head: int) -> dict:
    """The steps of one query head of one call of probe's attention function (batch row 0, every query),
    computed by the same functions the call ran (:func:`probe.capture.op.scored_attention`, the sink
    softmax :func:`probe.capture.interface.with_sinks`), with the call's scaling, soft-capping, position
    bias (and a float mask's bias), rounding options and sink logits.

    Args:
        call: a :class:`probe.capture.interface.Call` (whole maps: ``rows`` None).
        head: the query head; it reads key/value head ``head * kv_heads // heads`` (transformers' ``repeat_kv``
            order).

    Returns:
        ``q`` [T, d_qk], ``k`` [Tk, d_qk], ``v`` [Tk, d_v] (of key/value head ``kv_head``), ``score`` (q . k,
        unscaled) [T, Tk], ``bias`` [T, Tk] (zeros where none; Falcon's inner ALiBi as inner * scale + bias),
        ``scaled`` (softcap(score * scale) + bias, before masking) [T, Tk], ``keep`` [T, Tk] bool, ``probs``
        [T, Tk] (this recomputation), ``model_probs`` [T, Tk] (what the call returned), ``output`` [T, d_v]
        (the head's output the call returned, before the output projection), ``sink`` [T] (the sink logit
        of each query row) or None, ``scale``, ``softcap``.
    """
    H, KV = call.query.shape[1], call.key.shape[1]
    g = head * KV // H
    q, k, v = call.query[:1, head:head + 1], call.key[:1, g:g + 1], call.value[:1, g:g + 1]
    T, Tk = q.shape[2], k.shape[2]
    kw = call.kwargs
    scale = q.shape[-1] ** -0.5 if kw.get("scaling") is None else kw["scaling"]
    softcap = kw.get("softcap")
    bias = kw.get("position_bias")
    if call.mask_bias is not None:
        bias = call.mask_bias if bias is None else bias + call.mask_bias
    b = _one_head(bias, head, T, Tk)
    keep = _one_head(call.keep, head, T, Tk)
    options = {name: kw[name] for name in ARITHMETIC if name in kw}
    inner = _one_head(options.pop("inner_bias", None), head, T, Tk)
    sinks = kw.get("s_aux", kw.get("sinks"))
    sink = None
    if sinks is None:
        wide = q.dtype in (torch.float32, torch.float64)
        rounding = {"softmax_dtype": q.dtype if wide else torch.float32, "upcast": not wide, **options}
        _, probs, scores = scored_attention(q, k, v, keep, scale=scale, softcap=softcap, bias=b,
                                            inner_bias=inner, scored=True, **rounding)
        scaled, upcast = scores.values, rounding["upcast"]
    else:  # a sink logit per head ([heads]) or per head and query row ([batch, heads, query, 1])
        s = sinks[:1, head:head + 1] if sinks.dim() == 4 else sinks.reshape(-1)[head:head + 1]
        probs = with_sinks(q, k, keep, scale, s, softcap, b).to(v.dtype)
        scaled, upcast = scaled_scores(q.float(), k.float(), scale, softcap=softcap, bias=b), True
        sink = s.float().reshape(-1).expand(T) if s.dim() != 4 else s[0, 0, :, 0].float()
    work = torch.float32 if upcast else q.dtype
    if inner is not None:
        b = inner * scale + (0 if b is None else b)
    return dict(
        q=q[0, 0].detach(), k=k[0, 0].detach(), v=v[0, 0].detach(), kv_head=g,
        score=(q.to(work) @ k.to(work).transpose(-2, -1))[0, 0].detach(),
        bias=torch.zeros(T, Tk, device=q.device) if b is None else b[0, 0].detach(),
        scaled=scaled[0, 0].detach(), probs=probs[0, 0].detach(),
        keep=torch.ones(T, Tk, dtype=torch.bool, device=q.device) if keep is None else keep[0, 0].detach(),
        model_probs=call.probs[0, head].detach(), output=call.output[0, :, head].detach(),
        sink=None if sink is None else sink.detach(), scale=float(scale), softcap=softcap)


def _steps_dict(lm: LoadedModel, batch, where: Site, head: int, st: dict, model_probs) -> dict:
    """One pick's arrays, cut to the text's real tokens, with its value norms (see :func:`head_steps`)."""
    q_side, k_side = sides(where, batch)
    nq, nk = int(q_side.lengths[0]), int(k_side.lengths[0])
    f = lambda t, *shape: t[tuple(slice(0, n) for n in shape)].float().cpu().numpy()  # noqa: E731
    try:
        norms = f(value_norms(lm, where, head, st["v"].to(next(lm.model.parameters()).dtype)), nk)
    except UnsupportedArchitectureError:  # no output projection found (gated or differential attention)
        norms = np.full(nk, np.nan, dtype=np.float32)
    output = st.get("output")
    if output is None:  # the reference route: the head's output from its probabilities and values
        output = st["probs"].to(st["v"].dtype) @ st["v"]
    out = dict(site=where, head=head, kv_head=int(st["kv_head"]), scale=st["scale"], softcap=st["softcap"],
               q=f(st["q"], nq), k=f(st["k"], nk), v=f(st["v"], nk), score=f(st["score"], nq, nk),
               bias=f(st["bias"], nq, nk), scaled=f(st["scaled"], nq, nk), keep=st["keep"][:nq, :nk].cpu().numpy(),
               probs=f(st["probs"], nq, nk), value_norm=norms, output=f(output, nq),
               sink=None if st.get("sink") is None else f(st["sink"], nq),
               q_tokens=_tokens(lm, q_side), k_tokens=_tokens(lm, k_side))
    if "note" in st:  # a capture-only model's: its note, and the implied term where it has one
        out["implied"] = None if st["implied"] is None else f(st["implied"], nq, nk)
        out["implied_max"], out["note"] = st["implied_max"], st["note"]
    if model_probs is not None:
        out["model_probs"] = f(model_probs, nq, nk)
    return out


def attention_steps(lm: LoadedModel, text, *, site=0, head: int = 0, query: int = 0,
                    vectors: bool = False, max_length: int | None = None) -> pd.DataFrame:
    """Every key's steps to one attention weight, for one site, head and query token.

    Args:
        lm: a loaded model; text: one text (a string, or :class:`probe.text.inputs.Text` with ``target``
            for an encoder-decoder model).
        site: the site (:func:`find_site`); head: the query head; query: the query token's position
            (on the query side: the target's for decoder and cross sites of an encoder-decoder model).
        vectors: add the columns ``q`` (the query vector, the same in every row), ``k``, ``product``
            (q * k elementwise; sums to ``score``) and ``v``, each an array [d_head].
        max_length: token limit (default: the model's limit).

    Returns:
        A DataFrame, one row per key: ``key`` (position), ``token``, ``score`` (q . k), ``scale``,
        ``bias`` (0 where none), ``scaled_score`` (softcap(score * scale) + bias, before the mask),
        ``masked`` (bool), ``probability`` (the softmax of the unmasked scaled scores),
        ``model_probability`` (what the model returned), ``value_norm`` (||f_h(x_j)||, hidden-state
        units), ``contribution`` (probability * value_norm = ||alpha_ij f_h(x_j)||); a capture-only model
        whose probabilities its scaled scores do not give has ``implied_term`` after ``scaled_score`` (the
        model's own term implied by its probabilities, :func:`own_steps`; ``probability`` is then the softmax
        of scaled_score + implied_term). ``attrs["steps"]`` is a :class:`StepsInfo`.

    Raises:
        InputError: no such site, head or query; not one text.
        UnsupportedArchitectureError: a capture-only site probe cannot read (:func:`heads_steps`).
    """
    st = head_steps(lm, text, site, head, max_length)
    nq = len(st["q_tokens"])
    if not 0 <= query < nq:
        raise InputError(f"no query {query}: the text has {nq} query tokens at {st['site'].name}")
    return steps_table(lm, st, query, vectors)


def _tokens(lm, b) -> list[str]:
    m = int(b.lengths[0])
    text = b.texts[0].text if b.texts[0].pair is None else b.texts[0].text + " " + b.texts[0].pair
    offsets = [tuple(o) for o in b.offsets[0, :m].tolist()]
    return display_tokens(lm.tokenizer, text, b.input_ids[0, :m].tolist(), offsets, b.special[0, :m].tolist())


def steps_table(lm: LoadedModel, st: dict, query: int, vectors: bool = False) -> pd.DataFrame:
    """The table of :func:`attention_steps` for one query of :func:`head_steps`' dict."""
    nk = len(st["k_tokens"])
    df = pd.DataFrame({
        "key": np.arange(nk), "token": st["k_tokens"], "score": st["score"][query], "scale": st["scale"],
        "bias": st["bias"][query], "scaled_score": st["scaled"][query], "masked": ~st["keep"][query],
        "probability": st["probs"][query], "model_probability": st["model_probs"][query],
        "value_norm": st["value_norm"],
    })
    if st.get("implied") is not None:  # a capture-only model's own term, after the scaled score
        df.insert(df.columns.get_loc("scaled_score") + 1, "implied_term", st["implied"][query])
    df["contribution"] = df["probability"] * df["value_norm"]
    if vectors:
        qv = st["q"][query]
        df["q"] = [qv] * nk
        df["k"] = list(st["k"])
        df["product"] = list(st["k"] * qv)
        df["v"] = list(st["v"])
    where = st["site"]
    df.attrs["steps"] = StepsInfo(where.name, head_name(where if lm.kind == "encoder-decoder" else where.layer,
                                                        st["head"]),
                                  st["head"], st["kv_head"], query, st["q_tokens"][query], st["scale"], st["softcap"],
                                  float(np.abs(df["probability"] - df["model_probability"]).max()),
                                  st.get("note"))
    return df
