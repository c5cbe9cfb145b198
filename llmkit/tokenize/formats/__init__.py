"""Tokenizer files: reading (`hf`) and writing (`hf_write`) HF tokenizer.json, and llama.cpp's
tokenizers built from a GGUF model's vocabulary (`gguf_vocab`).

May import the algorithms' models (`bpe`, `wordpiece`, `unigram`), tokenize's shared modules,
llmkit.errors, llmkit.io and llmkit.gguf; never `training` or `corpus`. `tokenizer.Tokenizer.save`
and `llmkit.tokenize.load` reach it lazily.
"""
