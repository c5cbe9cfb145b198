"""The target model's KV cache during generation: prefix reuse, chunk reuse by shifting, context
shift, and prefill without logits. Functions of a llama-cpp-python `Llama` (sequence 0)."""

from __future__ import annotations


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token sequences.

    >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def eval_no_logits(model, tokens: list[int]) -> None:
    """Evaluate tokens whose logits nobody needs (prefill): llama.cpp projects only each batch's last
    position onto the vocabulary, since a projection for every prompt position would cost more than
    the prefill itself (docs/design/llama-runtime.md)."""
    if tokens:
        model.eval(tokens)


def eval_logits(model, tokens: list[int], n_out: int = 1):
    """Evaluate tokens after what the model holds and return the logits of the last `n_out` of them
    (an n_out x n_vocab float32 array of their own).

    Only those positions ask llama.cpp for logits, so its output buffer is sized by the batch and
    nothing grows with the context (a model opened with every position's logits would hold an
    n_ctx x n_vocab array: 24 GiB for a 49k vocabulary at 128k tokens)."""
    import numpy as np

    n, n_vocab = len(tokens), model.n_vocab()
    if not 0 < n_out <= n:
        raise ValueError(f"cannot return the logits of {n_out} positions of {n} tokens")
    first = n - n_out
    out = np.empty((n_out, n_vocab), dtype=np.float32)
    batch = model._batch
    model._ctx.kv_cache_seq_rm(-1, model.n_tokens, -1)
    for i in range(0, n, model.n_batch):
        part = tokens[i:i + model.n_batch]
        n_past = model.n_tokens
        batch.set_batch(batch=part, n_past=n_past, logits_all=False)  # asks for the part's last position
        lo = max(first - i, 0)
        for j in range(lo, len(part)):
            batch.batch.logits[j] = True
        model._ctx.decode(batch)
        if lo < len(part):  # llama.cpp packs the rows asked for, in batch order
            rows = len(part) - lo
            out[i + lo - first:i + len(part) - first] = np.ctypeslib.as_array(model._ctx.get_logits(),
                                                                              shape=(rows, n_vocab))
        model.input_ids[n_past:n_past + len(part)] = part
        model.n_tokens += len(part)
    return out


def reuse_chunks(model, have: list[int], prompt: list[int], n_past: int, min_chunk: int) -> tuple[int, int]:
    """Keep cached chunks of >= min_chunk tokens that reappear later in the prompt by shifting their
    KV positions (llama-server's --cache-reuse); returns (tokens now cached, tokens shifted).

    Exact only where a token's K/V do not depend on the tokens removed before it (e.g. the first
    layer: K/V there come from the token and its RoPE position alone); deeper layers saw the
    removed tokens, so reuse is an approximation there, as in llama-server.
    """
    head_c, head_p = n_past, n_past
    end = len(prompt) - 1  # the last prompt token is evaluated for its logits anyway
    shifted = 0
    while head_c < len(have) and head_p < end:
        n = 0
        while head_c + n < len(have) and head_p + n < end and have[head_c + n] == prompt[head_p + n]:
            n += 1
        if n >= min_chunk:
            delta = head_p - head_c
            model._ctx.kv_cache_seq_rm(0, head_p, head_c)
            model._ctx.kv_cache_seq_shift(0, head_c, head_c + n, delta)
            model.input_ids[head_p:head_p + n] = prompt[head_p:head_p + n]
            head_c += n
            head_p += n
            shifted += n
        else:
            head_c += 1
    model._ctx.kv_cache_seq_rm(0, head_p, -1)
    model.n_tokens = head_p
    return head_p, shifted


def shift_context(model, ctx: list[int], keep: int) -> None:
    """Drop the oldest half after the first `keep` tokens and shift the rest (as llama-server);
    `ctx`, the token list the caller keeps, loses the same tokens."""
    keep = min(keep, model.n_tokens // 2)
    n_left = model.n_tokens - keep
    n_discard = max(1, n_left // 2)
    model._ctx.kv_cache_seq_rm(0, keep, keep + n_discard)
    model._ctx.kv_cache_seq_shift(0, keep + n_discard, model.n_tokens, -n_discard)
    model.input_ids[keep:model.n_tokens - n_discard] = model.input_ids[keep + n_discard:model.n_tokens]
    model.n_tokens -= n_discard
    del ctx[keep:keep + n_discard]
