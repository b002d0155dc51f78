"""Build the tests' byte-level BPE tokenizer (tests/data/bpe/) from tests/data/bpe-corpus.txt.

The fast tests' tiny decoders need a byte-level BPE tokenizer like the real decoders' (GPT-2 and
SmolLM2 style: byte pieces such as ``Ġ`` for a space and ``Ċ`` for a line end, character offsets that
include the leading space, no BOS added, ``<|im_start|>``/``<|im_end|>`` as BOS/EOS); loading SmolLM2's
own would de-quantize the embedded model first. This one is trained with the ``tokenizers`` library on
a few KB of text, so its vocabulary is small (a fast embedding table) and its files are tiny.

Run from the repository root after editing the corpus (the folder is committed; tests never rebuild
it): ``python tests/data/make_bpe.py``.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = Path(__file__).resolve().parent
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2: unknown, BOS, EOS (and padding)
VOCAB = 1000


def build() -> Tokenizer:
    """Train the tokenizer on the corpus (deterministic: the trainer breaks ties by the pair itself)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(HERE / "bpe-corpus.txt")], trainer)
    return tok


def main() -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=build(), unk_token=SPECIAL[0], bos_token=SPECIAL[1],
                                   eos_token=SPECIAL[2], pad_token=SPECIAL[2])
    fast.save_pretrained(HERE / "bpe")


if __name__ == "__main__":
    main()
