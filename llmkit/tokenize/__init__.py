"""Subword tokenizers: byte-level BPE, WordPiece and Unigram — train, apply, load, save.

Shared pieces sit here: `tokenizer` is the facade (a model plus added tokens), `pretok` the
pre-tokenizers, `pieces` what the algorithms share (a growing vocabulary, one pair merge, cached
word-by-word encoding) and `native` loads the compiled kernels (numba cfuncs linked once). One
sub-package per algorithm, trainer beside encoder and kernels beside both: `bpe/`, `wordpiece/`,
`unigram/`. Then the packages that use them: `training/` (the training entry point, word counting
under a memory bound, the training kernels), `formats/` (tokenizer.json read and written, GGUF
vocabularies) and `corpus/` (streams, token counts of files, budgets, corpus statistics).

Arrows point down: `training` and `formats` import the algorithms, the algorithms import only the
shared modules (WordPiece's compiled trainer reuses `bpe.bpe_train_native`'s word arrays), and the
shared modules reach up only lazily (`native` imports the kernel modules to compile them,
`Tokenizer.save` imports `formats.hf_write`). Each sub-package's docstring says what it may import.

May import llmkit.errors, llmkit.config, llmkit.io, llmkit.walk, llmkit.plot and llmkit.gguf; never llama, kv, rag, quant
or the CLI (click).
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
    # a file named .gguf goes to the GGUF reader whatever it holds, so its error says "not a GGUF file"
    if head == b"GGUF" or path.lower().endswith(".gguf"):
        from llmkit.tokenize.formats.gguf_vocab import load_gguf_tokenizer

        return load_gguf_tokenizer(path)
    from llmkit.tokenize.formats.hf import load_hf_json

    return load_hf_json(path)
