"""Byte-level BPE: the model and its Python trainer (`bpe`), encoding through the compiled kernels
(`bpe_native` over `_bpe_kernels`) and training through the compiled merge loop (`bpe_train_native`;
its kernel, `training._bpe_train_kernels`, sits with the other training kernels whose helpers it shares).

May import llmkit.errors and tokenize's shared modules (`pretok`, `pieces`, `native`); never
`training`, `formats` or `corpus`, which import it. `_bpe_kernels` imports only numba: its
pre-tokenizer scan and pointer types are what the training kernels build on.
"""
