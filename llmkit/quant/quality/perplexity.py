"""Perplexity through llama.cpp, computed as llama-perplexity computes it (see scoring.py)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

from llmkit.quant.quality.scoring import EvalOptions, Scorer, score_chunks, tokens_for


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
    n_seq: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


def perplexity(model_path: str, text: str, n_ctx: int = 512, max_chunks: int = 0, threads: int | None = None,
               progress: Callable[[int, int], None] | None = None, options: EvalOptions | None = None) -> Perplexity:
    """llama-perplexity's figure: PPL = exp(mean negative log-likelihood of the second half of every
    chunk), and its uncertainty PPL * sqrt(var / (count - 1)), "Final estimate: PPL = X +/- Y"."""
    t0 = time.perf_counter()
    opts = replace(options or EvalOptions(), **({"threads": threads} if threads else {}))
    with Scorer(model_path, n_ctx, opts) as s:
        toks = tokens_for(s, text, max_chunks)
        mean, unc, count = score_chunks(s, toks, progress)
        n_seq = s.n_seq
    ppl = math.exp(mean)
    return Perplexity(model_path, ppl, mean, count, len(toks) // n_ctx, n_ctx, time.perf_counter() - t0, ppl * unc,
                      n_seq)
