"""Build tiny GGUF vocabulary files for tests (written with the `gguf` package; llama.cpp loads them)."""

from __future__ import annotations

import numpy as np


def write_vocab_gguf(path, model: str, tokens, *, merges=None, scores=None, types=None, pre="default",
                     add_space_prefix=None):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(model)
    if model == "gpt2":
        w.add_tokenizer_pre(pre)
    w.add_token_list(list(tokens))
    if types is None:
        types = [1] * len(tokens)
    w.add_token_types(list(types))
    if merges is not None:
        w.add_token_merges([f"{a} {b}" for a, b in merges])
    if scores is not None:
        w.add_token_scores([float(s) for s in np.asarray(scores, dtype=np.float32)])
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
