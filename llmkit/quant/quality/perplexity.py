"""Perplexity through llama.cpp, computed like llama-perplexity (see scoring.py)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable

from llmkit.quant.quality.scoring import open_model, score_chunks, tokens_for


@dataclass
class Perplexity:
    model: str
    ppl: float
    nll: float
    tokens_scored: int
    chunks: int
    n_ctx: int
    seconds: float
    ppl_uncertainty: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def perplexity(model_path: str, text: str, n_ctx: int = 512, max_chunks: int = 0, threads: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> Perplexity:
    """llama-perplexity's method: the text is tokenized with the model's BOS and cut into chunks of
    n_ctx tokens (the first token of each replaced by BOS when the model uses one); within a chunk only
    the second half is scored, each token predicted from at least n_ctx/2 tokens of context.
    PPL = exp(mean negative log-likelihood), with its uncertainty as llama-perplexity prints it."""
    t0 = time.perf_counter()
    model, bos = open_model(model_path, n_ctx, threads)
    toks = tokens_for(model, text, n_ctx, max_chunks)
    mean, unc, count = score_chunks(model, bos, toks, n_ctx, progress)
    return Perplexity(model_path, math.exp(mean), mean, count, len(toks) // n_ctx, n_ctx, time.perf_counter() - t0,
                      math.exp(mean) * unc)
