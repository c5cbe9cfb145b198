"""WordPiece: the model and its Python trainer (`wordpiece`) and training through the compiled merge
loop (`wordpiece_native`, over `training._train_kernels.wp_run`, called through `native`).

May import llmkit.errors, tokenize's shared modules (`pretok`, `pieces`, `native`) and
`bpe.bpe_train_native` (the flat word arrays both merge loops read); never `training`, `formats`
or `corpus`, which import it.
"""
