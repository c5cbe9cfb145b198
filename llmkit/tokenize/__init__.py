"""Subword tokenizers: byte-level BPE, WordPiece and Unigram — train, apply, load, save.

`tokenizer` is the facade (a model plus added tokens); `pretok` the pre-tokenizers; `pieces` what
the algorithms share (a growing vocabulary, one pair merge, cached word-by-word encoding); one
module per algorithm, trainer beside encoder (`bpe`, `wordpiece`; Unigram's encoder `unigram`,
its trainer `unigram_train` over the numpy lattices of `unigram_lattice`); `train` is the training
entry point; `hf` reads and `hf_write` writes tokenizer.json; `gguf_vocab` builds llama.cpp's
tokenizers from a GGUF vocabulary; `stats` measures a tokenizer on a corpus.

May import llmkit.errors, llmkit.io, llmkit.walk and llmkit.gguf; never llama, kv, rag, quant or the CLI (click).
"""

from __future__ import annotations

from llmkit.errors import BadFileFormat


def load(path: str):
    """Load a tokenizer from an llmkit/HF tokenizer.json or a GGUF model's vocabulary."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except IsADirectoryError:
        raise BadFileFormat(f"'{path}' is a directory. Pass a tokenizer.json or a .gguf file.") from None
    except OSError as e:
        raise BadFileFormat(f"cannot read tokenizer '{path}': {e.strerror}. Check the path.") from None
    if head == b"GGUF":
        from llmkit.tokenize.gguf_vocab import load_gguf_tokenizer

        return load_gguf_tokenizer(path)
    from llmkit.tokenize.hf import load_hf_json

    return load_hf_json(path)
