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


LLAMA3_8B = dict(n_layer=32, n_embd=4096, n_ff=14336, n_head=32, n_head_kv=8, n_vocab=128256)


def write_llama_shaped(path, *, n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, n_ctx=8192, seed=0):
    """A random-weight F16 llama of any size (LLAMA3_8B: Llama-3-8B's shapes, 15 GiB), streamed tensor by
    tensor in 64 MiB pieces, so memory stays far below the file's size. Weights are slices of one pool
    of Gaussian halves at random offsets, scaled per tensor (fast to write; random enough for timing
    and memory); the byte-level vocabulary is padded to n_vocab with plain tokens, so llama.cpp loads
    and runs the model."""
    import struct

    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(1 << 25).astype(np.float16)
    tokens = byte_vocab() + ["Ġt", "he", "Ġthe"]
    tokens += [f"x{i}" for i in range(n_vocab - len(tokens))]
    types = [1] * 256 + [3, 3] + [1] * (len(tokens) - 258)
    head_dim = n_embd // n_head

    def s(v):
        b = v.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def kv(key, kind, value):
        code = {"u32": 4, "f32": 6, "bool": 7, "str": 8}
        if kind == "str[]":
            return s(key) + struct.pack("<IIQ", 9, 8, len(value)) + b"".join(s(v) for v in value)
        if kind == "i32[]":
            return s(key) + struct.pack("<IIQ", 9, 5, len(value)) + np.asarray(value, "<i4").tobytes()
        if kind == "str":
            return s(key) + struct.pack("<I", 8) + s(value)
        fmt = {"u32": "I", "f32": "f", "bool": "?"}[kind]
        return s(key) + struct.pack("<I" + fmt, code[kind], value)

    kvs = [kv("general.architecture", "str", "llama"), kv("general.name", "str", "llama-shaped random"),
           kv("llama.context_length", "u32", n_ctx), kv("llama.embedding_length", "u32", n_embd),
           kv("llama.block_count", "u32", n_layer), kv("llama.feed_forward_length", "u32", n_ff),
           kv("llama.attention.head_count", "u32", n_head), kv("llama.attention.head_count_kv", "u32", n_head_kv),
           kv("llama.rope.dimension_count", "u32", head_dim), kv("llama.attention.layer_norm_rms_epsilon", "f32", 1e-5),
           kv("general.file_type", "u32", 1), kv("tokenizer.ggml.model", "str", "gpt2"),
           kv("tokenizer.ggml.pre", "str", "gpt-2"), kv("tokenizer.ggml.tokens", "str[]", tokens),
           kv("tokenizer.ggml.token_type", "i32[]", types),
           kv("tokenizer.ggml.merges", "str[]", ["Ġ t", "h e", "Ġt he"]),
           kv("tokenizer.ggml.bos_token_id", "u32", 256), kv("tokenizer.ggml.eos_token_id", "u32", 257),
           kv("tokenizer.ggml.add_bos_token", "bool", False)]
    specs = [("token_embd.weight", (n_vocab, n_embd), 1.0)]  # numpy shape (rows, ne0), scale
    for i in range(n_layer):
        specs += [(f"blk.{i}.attn_norm.weight", (n_embd,), None), (f"blk.{i}.attn_q.weight", (n_embd, n_embd), n_embd),
                  (f"blk.{i}.attn_k.weight", (n_head_kv * head_dim, n_embd), n_embd),
                  (f"blk.{i}.attn_v.weight", (n_head_kv * head_dim, n_embd), n_embd),
                  (f"blk.{i}.attn_output.weight", (n_embd, n_embd), n_embd), (f"blk.{i}.ffn_norm.weight", (n_embd,), None),
                  (f"blk.{i}.ffn_gate.weight", (n_ff, n_embd), n_embd), (f"blk.{i}.ffn_up.weight", (n_ff, n_embd), n_embd),
                  (f"blk.{i}.ffn_down.weight", (n_embd, n_ff), n_ff)]
    specs += [("output_norm.weight", (n_embd,), None), ("output.weight", (n_vocab, n_embd), n_embd / 16.0)]
    infos, offset = [], 0
    for name, shape, _ in specs:
        ggml_type, size = (0, 4 * shape[0]) if len(shape) == 1 else (1, 2 * shape[0] * shape[1])
        infos.append(s(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape[::-1])
                     + struct.pack("<iQ", ggml_type, offset))
        offset += size + (-size % 32)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(specs), len(kvs)) + b"".join(kvs) + b"".join(infos)
    with open(path, "wb") as f:
        f.write(head + b"\0" * (-len(head) % 32))
        for name, shape, fan_in in specs:
            if fan_in is None:
                f.write(np.ones(shape[0], "<f4").tobytes())
                continue
            scale, n, done = np.float16(1.0 / np.sqrt(fan_in)), shape[0] * shape[1], 0
            while done < n:
                k = min(n - done, len(pool) // 2)
                start = int(rng.integers(0, len(pool) - k))
                f.write((pool[start:start + k] * scale).tobytes())
                done += k
            f.write(b"\0" * (-(2 * n) % 32))
    return path
