"""The inputs of :func:`probe.verify`: a battery of cases (failures hand-written attention is known for), each a list of
forward passes with the rows and keys that are real tokens. See :mod:`probe.verification` for what
is compared and the tolerances.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import LoadedModel
from ..errors import ProbeError

#: Longest sequence of the ``max-length`` case, in tokens.
MAX_CASE_TOKENS = 1024
#: Padding added to the prompt in the ``padding-invariance`` case (tokens).
PADDINGS = (1, 3, 8)

SENTENCE = "The quick brown fox jumps over the lazy dog because it wanted to see the river."
BATCH = [
    "The cat sat on the mat.",
    "A much longer sentence, which has quite a few more tokens than the first one does, follows here.",
    "Short one here.",
]
PAIR = ("Where did the cat sit this morning?", "The cat sat on the mat near the door.")
CACHE_TEXTS = [
    "Once upon a time there was a little robot who loved to read books about the sea.",
    "In the middle of the night the old clock in the hall struck twelve times and stopped.",
]
LONG_TEXT = (
    "Attention lets every token look at every other token of the sequence and take a weighted average "
    "of their values, the weights coming from a softmax over scaled dot products of queries and keys. "
    "Some heads look at the previous token, some at the first token, some at punctuation, and some "
    "spread their attention broadly over the whole sentence. "
)


@dataclass
class Pass:
    """One forward pass: model inputs, and which query rows / keys are real tokens.

    Attributes:
        inputs: keyword arguments of the model's forward.
        query_keep: [batch, T] real tokens of the (decoder's) queries of this pass.
        key_keep: [batch, past + T] its real keys (the cached ones included).
        source_keep: encoder-decoder models: [batch, S] real source tokens (the encoder's queries
            and keys, and the keys of cross-attention); None otherwise.
    """

    inputs: dict
    query_keep: torch.Tensor
    key_keep: torch.Tensor
    source_keep: torch.Tensor | None = None

    def rows(self, stack: str) -> torch.Tensor:
        """[batch, positions] real tokens of a stack's queries and hidden states."""
        return self.source_keep if self.source_keep is not None and stack == "encoder" else self.query_keep

    def keys(self, site) -> torch.Tensor:
        """[batch, keys] real keys of a site."""
        if self.source_keep is not None and (site.kind == "cross" or site.stack == "encoder"):
            return self.source_keep
        return self.key_keep


@dataclass
class Case:
    name: str
    description: str
    passes: list[Pass]
    use_cache: bool = False
    roles: list[str] | None = None  # padding-invariance case: "alone" (pass 0), "noise", "padded"

    @property
    def invariance(self) -> bool:
        return self.roles is not None


def _tokenize(lm: LoadedModel, texts, side: str = "right", **kw) -> dict:
    tok = lm.tokenizer
    old = tok.padding_side
    tok.padding_side = side
    try:
        enc = tok(texts, return_tensors="pt", padding=True, **kw)
    finally:
        tok.padding_side = old
    # ids past the model's tables (vocabulary, segments, positions) are checked at the forward call,
    # by probe.capture.lookups through probe.capture.hooks.measuring, the one check of every forward path
    return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def _positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids [batch, T] counting real tokens only (left padding: the first real token is 0)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _single_pass(inputs: dict, causal: bool = False) -> Pass:
    keep = inputs["attention_mask"].bool()
    if causal and not bool(keep.all()):
        inputs = {**inputs, "position_ids": _positions_from_mask(inputs["attention_mask"])}
    return Pass(inputs, keep, keep)


def _padded(inputs: dict, pad: int, pad_id: int, left: bool, causal: bool) -> Pass:
    """One prompt (batch 1) padded by ``pad`` tokens on the left or right."""
    def extend(t, value):
        fill = torch.full((t.shape[0], pad), value, dtype=t.dtype)
        return torch.cat([fill, t] if left else [t, fill], 1)
    out = {"input_ids": extend(inputs["input_ids"], pad_id), "attention_mask": extend(inputs["attention_mask"], 0)}
    if "token_type_ids" in inputs:
        out["token_type_ids"] = extend(inputs["token_type_ids"], 0)
    return _single_pass(out, causal)


def _invariance_case(lm: LoadedModel) -> Case:
    """The prompt alone; then noise passes (twice in a batch; for decoders also right-padded by
    PADDINGS, which changes the shapes as the padded runs do but, by causality, not the real
    tokens' values: what differs there is float rounding that depends on the length); then the
    padded passes under test (left padding with position ids from the mask for decoders, right
    padding for encoders)."""
    prompt = _tokenize(lm, [CACHE_TEXTS[0]])
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    decoder = lm.kind == "decoder"
    passes, roles = [_single_pass(prompt, decoder)], ["alone"]
    passes.append(_single_pass({k: torch.cat([v, v]) for k, v in prompt.items()}, decoder))
    roles.append("noise")
    if decoder:
        passes += [_padded(prompt, p, pad_id, left=False, causal=True) for p in PADDINGS]
        roles += ["noise"] * len(PADDINGS)
    passes += [_padded(prompt, p, pad_id, left=decoder, causal=decoder) for p in PADDINGS]
    roles += ["padded"] * len(PADDINGS)
    side = "left, position ids from the mask" if decoder else "right"
    return Case("padding-invariance", f"one prompt alone and padded by {', '.join(map(str, PADDINGS))} tokens "
                 f"({side})", passes, roles=roles)


TARGET = "Le renard brun saute par-dessus le chien paresseux."
TARGETS = ["Le chat est assis.", "Une phrase beaucoup plus longue, avec bien plus de mots que la premiere, suit.",
           "Courte."]
CACHE_TARGETS = ["Il etait une fois un petit robot qui aimait lire des livres sur la mer.",
                 "Au milieu de la nuit, la vieille horloge du couloir sonna douze coups et s'arreta."]


def _seq2seq_pass(lm: LoadedModel, sources: list[str], targets: list[str], **kw) -> Pass:
    """Sources to the encoder, targets (after the decoder's start token) to the decoder; right padding."""
    src = _tokenize(lm, sources, **kw)
    tgt = _tokenize(lm, targets)
    start = lm.model.config.decoder_start_token_id
    ids = torch.cat([torch.full((len(targets), 1), start, dtype=torch.long), tgt["input_ids"]], 1)
    mask = torch.cat([torch.ones(len(targets), 1, dtype=torch.long), tgt["attention_mask"]], 1)
    inputs = {"input_ids": src["input_ids"], "attention_mask": src["attention_mask"], "decoder_input_ids": ids,
              "decoder_attention_mask": mask}
    return Pass(inputs, mask.bool(), mask.bool(), src["attention_mask"].bool())


def _seq2seq_battery(lm: LoadedModel) -> list[Case]:
    """Encoder-decoder models: one pair, a right-padded batch (both sides), the decoder step by step
    with the key/value cache (self-attention cache growing, cross-attention cache filled once and
    reused), and a long source."""
    cases = [Case("sentence", "one source sentence and its target", [_seq2seq_pass(lm, [SENTENCE], [TARGET])]),
             Case("right-padded", "3 pairs of unequal length, both sides right-padded",
                  [_seq2seq_pass(lm, BATCH, TARGETS)])]
    full = _seq2seq_pass(lm, CACHE_TEXTS, CACHE_TARGETS)
    ids = full.inputs["decoder_input_ids"][:, :9]
    if ids.shape[1] < 9 or not bool(full.query_keep[:, :9].all()):
        raise ProbeError("the kv-cache case needs two targets of at least 8 tokens")
    passes = []
    for end in (6, 7, 8, 9):  # a 6-token decoder prefix, then 3 one-token steps
        begin = 0 if end == 6 else end - 1
        mask = torch.ones(ids.shape[0], end, dtype=torch.long)
        inputs = {"input_ids": full.inputs["input_ids"], "attention_mask": full.inputs["attention_mask"],
                  "decoder_input_ids": ids[:, begin:end], "decoder_attention_mask": mask}
        passes.append(Pass(inputs, torch.ones(ids.shape[0], end - begin, dtype=torch.bool), mask.bool(),
                           full.source_keep))
    cases.append(Case("kv-cache", "6-token decoder prefix, then 3 single-token steps with the self- and "
                      "cross-attention caches", passes, use_cache=True))
    n = min(lm.max_length, MAX_CASE_TOKENS)
    text = LONG_TEXT * (4 * n // 40 + 1)
    cases.append(Case("max-length", f"a source of {n} tokens (min(model limit, {MAX_CASE_TOKENS}))",
                      [_seq2seq_pass(lm, [text], [TARGET], truncation=True, max_length=n)]))
    return cases


def battery(lm: LoadedModel) -> list[Case]:
    """The cases :func:`probe.verify` runs on this model, in order."""
    if lm.kind == "encoder-decoder":
        return _seq2seq_battery(lm)
    cases = [
        Case("sentence", "one sentence", [_single_pass(_tokenize(lm, [SENTENCE]))]),
        Case("right-padded", "3 sentences of unequal length, right padding",
              [_single_pass(_tokenize(lm, BATCH))]),
    ]
    if lm.kind == "decoder":
        cases.append(Case("left-padded", "3 sentences of unequal length, left padding, position ids from the mask",
                           [_single_pass(_tokenize(lm, BATCH, side="left"), causal=True)]))
    cases.append(_invariance_case(lm))
    if lm.kind == "decoder":
        enc = _tokenize(lm, CACHE_TEXTS, truncation=True, max_length=9)
        ids = enc["input_ids"]
        if ids.shape[1] < 9 or not bool(enc["attention_mask"].all()):
            raise ProbeError("the kv-cache case needs two texts of at least 9 tokens")
        passes = []
        for end in (6, 7, 8, 9):  # a 6-token prefix, then 3 one-token steps
            start = 0 if end == 6 else end - 1
            mask = torch.ones(ids.shape[0], end, dtype=torch.long)  # covers cached + new tokens
            passes.append(Pass({"input_ids": ids[:, start:end], "attention_mask": mask},
                                torch.ones(ids.shape[0], end - start, dtype=torch.bool), mask.bool()))
        cases.append(Case("kv-cache", "6-token prefix, then 3 single-token steps with the key/value cache",
                           passes, use_cache=True))
    else:
        cases.append(Case("sentence-pair", "two segments with token type ids",
                           [_single_pass(_tokenize(lm, [PAIR[0]], text_pair=[PAIR[1]]))]))
    n = min(lm.max_length, MAX_CASE_TOKENS)
    text = LONG_TEXT * (4 * n // 40 + 1)
    cases.append(Case("max-length", f"one sequence of {n} tokens (min(model limit, {MAX_CASE_TOKENS}))",
                       [_single_pass(_tokenize(lm, [text], truncation=True, max_length=n))]))
    return cases


def case_names(lm: LoadedModel) -> list[str]:
    """The names of the battery's cases for this model, in order."""
    return [c.name for c in battery(lm)]




def select_cases(available: list[Case], cases: list[str] | str | None) -> list[Case]:
    """The cases of ``available`` named in ``cases`` (all of them for None), in battery order.

    Raises:
        ProbeError: an empty selection, or a name that is not one of ``available``'s.
    """
    if cases is None:
        return available
    cases = [cases] if isinstance(cases, str) else list(cases)
    if not cases:
        raise ProbeError("no verification case selected (cases=[]): nothing would be compared")
    unknown = set(cases) - {c.name for c in available}
    if unknown:
        raise ProbeError(f"unknown case(s) {', '.join(sorted(unknown))}; "
                         f"choose from {', '.join(c.name for c in available)}")
    return [c for c in available if c.name in cases]
