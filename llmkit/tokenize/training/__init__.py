"""Training a tokenizer from text: the entry point (`train`: count words, run one algorithm's
trainer, wrap the model), counting pre-tokenized words with the compiled kernels (`counting`), the
memory bound on the count table (`wordbound`), and the compiled training kernels: `_train_kernels`
(word counting and WordPiece's merge loop) and `_bpe_train_kernels` (BPE's merge loop), which share
the heap and token-table helpers.

May import the algorithms (`bpe`, `wordpiece`, `unigram`), tokenize's shared modules and
llmkit.errors; the kernels import `bpe._bpe_kernels` (the pre-tokenizer scan). Nothing in
llmkit.tokenize imports `training` except the kernel loader `native`, lazily, to compile.
"""
