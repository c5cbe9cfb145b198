"""Scoring text with a model as llama-perplexity does: the text tokenized with the model's BOS and cut
into chunks of n_ctx tokens (the first token of each replaced by BOS when the model uses one), only
the second half of each chunk scored; negative log-likelihoods and their statistics."""

from __future__ import annotations

import math

import numpy as np

from llmkit.errors import BadInput


def open_model(model_path: str, n_ctx: int, threads):
    """The model through llama.cpp with per-position logits, and whether it wants a BOS token."""
    from llmkit.llama import runtime

    model = runtime.open_model(model_path, runtime.ModelOptions(n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads))
    return model, runtime.add_bos(model)


def chunk_logits(model, chunk: np.ndarray, bos: bool) -> np.ndarray:
    """float32 logits of the scored positions n_ctx/2 .. n_ctx-2 of one chunk."""
    toks = [int(t) for t in chunk]
    if bos:
        toks[0] = model.token_bos()
    n = len(toks)
    model.reset()
    model.eval(toks)
    return np.asarray(model.scores[n // 2:n - 1], dtype=np.float32)


def tokens_for(model, text: str, n_ctx: int, max_chunks: int = 0) -> np.ndarray:
    """The text tokenized as llama-perplexity does (with the model's BOS), cut to whole chunks."""
    from llmkit.llama import runtime

    toks = np.asarray(model.tokenize(text.encode("utf-8"), add_bos=runtime.add_bos(model), special=False), np.int32)
    n_chunk = len(toks) // n_ctx
    if max_chunks:
        n_chunk = min(n_chunk, max_chunks)
    if n_chunk < 1:
        raise BadInput(f"the text has {len(toks)} tokens, fewer than one chunk of {n_ctx}; give more text or "
                       "shorter chunks.")
    return toks[:n_chunk * n_ctx]


def score_chunks(model, bos, toks: np.ndarray, n_ctx: int, progress=None, on_logits=None) -> tuple[float, float, int]:
    """llama-perplexity's scoring of whole chunks: (mean negative log-likelihood, its uncertainty,
    tokens scored); `on_logits` sees each chunk's scored log-probabilities first."""
    n_chunk = len(toks) // n_ctx
    nll = nll2 = 0.0
    count = 0
    for i in range(n_chunk):
        chunk = toks[i * n_ctx:(i + 1) * n_ctx]
        L = chunk_logits(model, chunk, bos)
        if on_logits:
            on_logits(L)
        v = token_nll(L, chunk[n_ctx // 2 + 1:])
        nll += float(v.sum())
        nll2 += float((v * v).sum())
        count += len(v)
        if progress:
            progress(i + 1, n_chunk)
    mean, unc = mean_uncertainty(nll, nll2, count)
    return mean, unc, count


def token_nll(L: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log p(target) per row, in float32 as llama-perplexity (max + log-sum-exp - logit)."""
    mx = L.max(axis=1)
    lse = np.log(np.exp(L - mx[:, None]).astype(np.float64).sum(axis=1)).astype(np.float32)
    return (mx + lse - L[np.arange(len(L)), targets]).astype(np.float64)


def mean_uncertainty(s: float, s2: float, n: int) -> tuple[float, float]:
    """(mean, its standard error) from a sum and a sum of squares of n values, as llama-perplexity."""
    if n < 1:
        return 0.0, 0.0
    f = s / n
    df = s2 / n - f * f
    return f, (math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)
