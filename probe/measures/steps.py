"""The steps of one attention weight: for one site, head and query token, every key's score from
the query and key vectors to the softmax, from the from-scratch attention
(:class:`probe.capture.reference.ReferenceAttention`) run on the model's own projections.

    steps = attention_steps(lm, "The cat sat on the mat.", site=3, head=5, query=4)
    steps[["token", "score", "scaled_score", "probability"]]

The steps follow scaled dot-product attention (Vaswani et al. 2017, sec. 3.2.1) with each
architecture's own rule: the score is q . k (after RoPE where the model rotates q and k; the key
from the key/value head the query head reads under GQA), the scaled score is
``softcap(score * scale) + bias`` (the scale 1/sqrt(d_head), GPT-2's options, Gemma's
``query_pre_attn_scalar``, 1 for T5; ALiBi's or T5's position bias; Gemma 2's softcap), then the
mask and the softmax. The probabilities are checked against the ones the model itself returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..architectures import site_outputs
from ..capture import values
from ..capture.hooks import measuring
from ..capture.maps import attention_hooks, encode, forward
from ..capture.reference.swap import swap_attention
from ..capture.values import output_gram
from ..core import LoadedModel
from ..errors import InputError
from ..loading.seq2seq import sides
from ..sites import SITE_PREFIX, Site, head_name
from ..text.inputs import Text
from ..text.tokens import display_tokens

#: Tolerance of the check that the softmax row equals the model's captured probabilities (fp32).
STEP_ATOL = 1e-5


@dataclass
class StepsInfo:
    """What a steps table is about (``DataFrame.attrs["steps"]``).

    Attributes:
        site: the site's canonical name; name: the head's display name (``L4H5``, ``cross L4H5``).
        head, kv_head: the query head and the key/value head it reads; query: the query's position.
        query_token: the query's display token; scale: the multiplier of q . k; softcap: Gemma 2's
            cap or None; max_diff: max |softmax row - the model's own probabilities|.
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


def head_steps(lm: LoadedModel, text, site=0, head: int = 0, max_length: int | None = None) -> dict:
    """One head's steps for every query of one text, as numpy arrays (what the step view draws).

    Returns:
        A dict: ``site`` (:class:`Site`), ``head``, ``kv_head``, ``scale``, ``softcap``; ``q`` [Tq, d_head],
        ``k``, ``v`` [Tk, d_head]; ``score``, ``bias``, ``scaled``, ``keep``, ``probs`` (the from-scratch
        softmax) and ``model_probs`` (what the model returned) [Tq, Tk]; ``value_norm`` [Tk];
        ``q_tokens``, ``k_tokens`` (display tokens). Real tokens only (one text: no padding).

    Raises:
        InputError: no such site or head; not one text.
    """
    return heads_steps(lm, text, [(site, head)], max_length)[0]


def heads_steps(lm: LoadedModel, text, picks, max_length: int | None = None, *, model_probs: bool = True) -> list[dict]:
    """:func:`head_steps` of several heads of one text, in as few forward passes as the picks allow:
    one from-scratch pass per head of the site with the most picks (each site records one head a
    pass), and one pass of the model itself for ``model_probs`` (every picked site at once).

    Args:
        lm: a loaded model; text: one text (as :func:`attention_steps` takes it).
        picks: ``(site, head)`` pairs (a site as :func:`find_site` takes it).
        max_length: token limit (default: the model's limit).
        model_probs: also the model's own probabilities (``model_probs``; False leaves that pass out and
            the key absent).

    Returns:
        :func:`head_steps`' dicts, one per pick, in order.

    Raises:
        InputError: no such site or head; not one text.
    """
    if not isinstance(text, (str, Text)):
        raise InputError("attention steps need one text (a string or probe.Text)")
    wanted = [(find_site(lm, site), int(head)) for site, head in picks]
    batch = encode(lm, [text], max_length)
    rounds: list[dict[Site, int]] = []  # pass k: site -> the k-th head picked there
    for where, head in wanted:
        free = next((r for r in rounds if where not in r), None)
        if free is None:
            rounds.append(free := {})
        free[where] = head
    recorded: dict[tuple[Site, int], dict] = {}
    with torch.no_grad():
        for chosen in rounds:
            # the from-scratch steps first (it knows the site's heads); measuring() checks the ids as
            # every forward pass of probe does (a model with one segment type gets its segment ids dropped)
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
        return [_steps_dict(lm, batch, where, head, recorded[(where, head)], captured.get((where, head)))
                for where, head in wanted]


def _steps_dict(lm: LoadedModel, batch, where: Site, head: int, st: dict, model_probs) -> dict:
    """One pick's arrays, cut to the text's real tokens, with its value norms (see :func:`head_steps`)."""
    q_side, k_side = sides(where, batch)
    nq, nk = int(q_side.lengths[0]), int(k_side.lengths[0])
    norms = value_norms(lm, where, head, st["v"].to(next(lm.model.parameters()).dtype))
    f = lambda t, *shape: t[tuple(slice(0, n) for n in shape)].float().cpu().numpy()  # noqa: E731
    out = dict(site=where, head=head, kv_head=int(st["kv_head"]), scale=st["scale"], softcap=st["softcap"],
               q=f(st["q"], nq), k=f(st["k"], nk), v=f(st["v"], nk), score=f(st["score"], nq, nk),
               bias=f(st["bias"], nq, nk), scaled=f(st["scaled"], nq, nk), keep=st["keep"][:nq, :nk].cpu().numpy(),
               probs=f(st["probs"], nq, nk), value_norm=f(norms, nk),
               q_tokens=_tokens(lm, q_side), k_tokens=_tokens(lm, k_side))
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
        units), ``contribution`` (probability * value_norm = ||alpha_ij f_h(x_j)||). ``attrs["steps"]``
        is a :class:`StepsInfo`.

    Raises:
        InputError: no such site, head or query; not one text.
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
                                  float(np.abs(df["probability"] - df["model_probability"]).max()))
    return df
