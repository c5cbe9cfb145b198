"""What quantization cost: per-tensor error between two models, and perplexity through llama.cpp."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from llmkit.errors import BadInput


@dataclass
class TensorDiff:
    name: str
    shape: list[int]
    type_a: str
    type_b: str
    rmse: float
    max_abs_err: float
    cosine: float

    def to_dict(self) -> dict:
        return asdict(self)


def error_stats(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """(RMSE, max |a - b|, cosine similarity) of two weight arrays (in float64)."""
    a, b = a.astype(np.float64).reshape(-1), b.astype(np.float64).reshape(-1)
    d = a - b
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cos = float(a @ b / (na * nb)) if na and nb else (1.0 if na == nb else 0.0)
    return float(np.sqrt(np.mean(d * d))), float(np.abs(d).max()) if len(d) else 0.0, cos


def compare(path_a: str, path_b: str) -> list[TensorDiff]:
    """Dequantize both models tensor by tensor and measure the difference (same names and shapes)."""
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.quantize import load_f32

    ga, gb = read_gguf(path_a), read_gguf(path_b)
    if ga.get("general.architecture") != gb.get("general.architecture"):
        raise BadInput(f"the models have different architectures ({ga.get('general.architecture')} vs "
                       f"{gb.get('general.architecture')}); compare two versions of one model.")
    tb = {t.name: t for t in gb.tensors}
    missing = [t.name for t in ga.tensors if t.name not in tb]
    if missing:
        raise BadInput(f"tensor '{missing[0]}' of '{path_a}' is not in '{path_b}'; compare two versions of one model.")
    out = []
    with open(path_a, "rb") as fa, open(path_b, "rb") as fb:
        for t in ga.tensors:
            u = tb[t.name]
            if tuple(t.shape) != tuple(u.shape):
                raise BadInput(f"tensor '{t.name}' has shape {t.shape} in one model and {u.shape} in the other.")
            x, y = load_f32(fa, t, ga.data_offset), load_f32(fb, u, gb.data_offset)
            out.append(TensorDiff(t.name, list(t.shape), t.type_name, u.type_name, *error_stats(x, y)))
    return out


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
    import math
    import time

    from llmkit.quant.kld import _open, score_chunks, tokens_for

    t0 = time.perf_counter()
    model, bos = _open(model_path, n_ctx, threads)
    toks = tokens_for(model, text, n_ctx, max_chunks)
    mean, unc, count = score_chunks(model, bos, toks, n_ctx, progress)
    return Perplexity(model_path, math.exp(mean), mean, count, len(toks) // n_ctx, n_ctx, time.perf_counter() - t0,
                      math.exp(mean) * unc)
