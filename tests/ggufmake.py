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


def byte_vocab() -> list[str]:
    """256 byte-level symbols (GPT-2 mapping) followed by <s> and </s>."""
    from llmkit.tokenize.pretok import bytes_to_unicode

    table = bytes_to_unicode()
    return [table[b] for b in range(256)] + ["<s>", "</s>"]


def write_tiny_llama(path, *, seed=0, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128, n_ctx=512,
                     logit_scale=4.0, dtype=np.float32, merges=(("Ġ", "t"), ("h", "e"), ("Ġt", "he")),
                     extra_tokens=("Ġt", "he", "Ġthe"), chat_template=None, tied=False, outliers=False,
                     alignment=None, n_expert=0):
    """A random-weight llama with a byte-level BPE vocabulary that llama.cpp loads and runs.

    `logit_scale` sharpens the output layer so greedy choices are far from ties (batch-vs-single
    evaluation noise then cannot flip them). `tied` leaves out output.weight (the token embedding
    is reused); `outliers` sprinkles large weights and exact zeros (harder cases for quantizers);
    `n_expert` > 0 makes the feed-forward a Mixtral-style mixture of experts (2 used per token).
    """
    import gguf

    tokens = byte_vocab() + list(extra_tokens)
    n_vocab = len(tokens)
    types = [1] * 256 + [3, 3] + [1] * len(extra_tokens)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head

    def rand(*shape, scale=None):
        s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        a = rng.standard_normal(shape) * s
        if outliers:
            a[rng.random(shape) < 0.002] *= 40.0
            a[rng.random(shape) < 0.01] = 0.0
            a[..., :32][rng.random(a[..., :32].shape) < 0.05] = 0.0
            if a.ndim == 2 and a.shape[-1] >= 64:  # whole blocks of +0.0 and of -0.0 (sign of zero scales)
                a[::7, 32:64] = 0.0
                a[3::7, 32:64] = -0.0
            if a.ndim == 2 and a.shape[-1] >= 128:  # blocks whose min or max is a zero of mixed sign
                a[1::5, 64:96] = np.abs(a[1::5, 64:96])  # min is a zero: its sign is the first zero's
                a[1::5, 64:96:7] = 0.0
                a[1::5, 65:96:9] = -0.0
                a[2::5, 96:128] = -np.abs(a[2::5, 96:128])  # max is a zero
                a[2::5, 97:128:6] = -0.0
                a[2::5, 100:128:8] = 0.0
        return a.astype(dtype)

    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:  # general.alignment other than GGUF's default 32
        w.add_custom_alignment(alignment)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(2)
    w.add_file_type(0 if dtype == np.float32 else 1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", rand(n_vocab, n_embd, scale=1.0))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", rand(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        if n_expert:
            w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", rand(n_expert, n_embd))
            w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", rand(n_expert, n_ff, n_embd))
            w.add_tensor(f"blk.{i}.ffn_up_exps.weight", rand(n_expert, n_ff, n_embd))
            w.add_tensor(f"blk.{i}.ffn_down_exps.weight", rand(n_expert, n_embd, n_ff))
        else:
            w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(n_ff, n_embd))
            w.add_tensor(f"blk.{i}.ffn_up.weight", rand(n_ff, n_embd))
            w.add_tensor(f"blk.{i}.ffn_down.weight", rand(n_embd, n_ff))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    if not tied:
        w.add_tensor("output.weight", rand(n_vocab, n_embd, scale=logit_scale / np.sqrt(n_embd)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
