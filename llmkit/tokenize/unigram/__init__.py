"""Unigram: the model and its Viterbi encoder (`unigram`), the trainer (`unigram_train`, EM and
pruning as SentencePiece) over the numpy lattices of `unigram_lattice`.

May import llmkit.errors, numpy and tokenize's shared modules (`pretok`, `pieces`); never the other
algorithms, `training`, `formats` or `corpus`.
"""
