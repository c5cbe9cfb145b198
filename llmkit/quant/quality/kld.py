"""KL divergence between a quantized model and its base, as llama-perplexity computes it.

The base model's log-probabilities are saved once in llama-perplexity's `--kl-divergence-base` file
format, so files interchange with llama.cpp's tool both ways:

    "_logits_"  uint32 n_ctx  int32 n_vocab  int32 n_chunk  int32 tokens[n_chunk * n_ctx]
    then per chunk, per scored position (n_ctx/2 ... n_ctx-2, predicting the next token),
    nv = 2*((n_vocab+1)/2) + 4 uint16: float32 scale, float32 min_log_prob, n_vocab uint16 levels
    (padded to even), level = round((logit - min') / scale), min' = max(min logit, max logit - 16),
    scale = (max logit - min') / 65535, log p = scale * level + min_log_prob.

Chunks, BOS and the evaluation layout as llama-perplexity (scoring.py). Statistics as its
kl_divergence(), with its float operations (float32 per-position values, their sums in double,
percentiles interpolated in float): PPL(Q), PPL(base) and their correlation, ln(PPL(Q)/PPL(base))
with the covariance term in its uncertainty, mean KLD (summed over the base's tokens with
log p_base > -16) with percentiles (linear interpolation), the share of positions whose top token is
the same, and Δp = p(Q) - p(base) of the true token (mean, RMS, percentiles).
"""

from __future__ import annotations

import math
import struct
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import numpy as np

from llmkit.errors import BadFileFormat, BadInput
from llmkit.quant.quality.scoring import EvalOptions, Scorer, expf, mean_uncertainty, score_chunks, tokens_for

F32 = np.float32

MAGIC = b"_logits_"
PERCENTILES = (0.999, 0.99, 0.95, 0.90, 0.5, 0.10, 0.05, 0.01, 0.001)
DP_PERCENTILES = (0.999, 0.99, 0.95, 0.90, 0.75, 0.5, 0.25, 0.10, 0.05, 0.01, 0.001)


def row_width(n_vocab: int) -> int:
    """uint16 values per scored position in the file (2 floats + the vocabulary, padded to even)."""
    return 2 * ((n_vocab + 1) // 2) + 4


def pack(logits: np.ndarray) -> np.ndarray:
    """Rows of float32 logits -> the file's uint16 rows (scale, min log-prob, levels)."""
    L = np.asarray(logits, np.float32)
    m, v = L.shape
    mx = L.max(axis=1)
    mn = np.maximum(L.min(axis=1), mx - np.float32(16))
    sum_exp = expf(L - mx[:, None]).astype(np.float64).sum(axis=1)
    lse = np.log(sum_exp).astype(np.float32)
    min_lp = (mn - mx - lse).astype(np.float32)
    scale = ((mx - mn) / np.float32(65535)).astype(np.float32)
    out = np.zeros((m, row_width(v)), np.uint16)
    head = np.stack([scale, min_lp], axis=1).astype(np.float32)
    out[:, :4] = head.view(np.uint16)
    with np.errstate(divide="ignore"):
        inv = np.where(scale > 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    lv = np.rint(inv[:, None] * (L - mn[:, None])).astype(np.int64)  # round half to even, as nearest_int
    lv = np.where(L > mn[:, None], lv, 0)
    out[:, 4:4 + v] = np.clip(lv, 0, 65535).astype(np.uint16)
    return out


def unpack(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """The file's uint16 rows -> float32 log-probabilities."""
    head = np.ascontiguousarray(rows[:, :4]).view(np.float32)
    scale, min_lp = head[:, 0], head[:, 1]
    return (scale[:, None] * rows[:, 4:4 + n_vocab].astype(np.float32) + min_lp[:, None]).astype(np.float32)


@dataclass
class BaseFile:
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray
    data_offset: int

    @property
    def scored(self) -> int:
        return self.n_ctx - 1 - self.n_ctx // 2


def read_header(path: str) -> BaseFile:
    """Header and tokens of a base log-probabilities file, checked against its size."""
    import os

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(20)
            if len(head) < 20 or head[:8] != MAGIC:
                raise BadFileFormat(f"'{path}' is not a base log-probabilities file (no '_logits_' header). "
                                    "Save the base model's log-probabilities first (save_base).")
            n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", head[8:20])
            if n_ctx < 4 or n_vocab < 2 or n_chunk < 1 or n_ctx > 1 << 22 or n_vocab > 1 << 24:
                raise BadFileFormat(f"'{path}' has an impossible header (n_ctx {n_ctx}, n_vocab {n_vocab}, "
                                    f"n_chunk {n_chunk}).")
            want = 20 + 4 * n_ctx * n_chunk + 2 * row_width(n_vocab) * (n_ctx - 1 - n_ctx // 2) * n_chunk
            if size != want:
                raise BadFileFormat(f"'{path}' is {size} bytes, but its header (n_ctx {n_ctx}, n_vocab {n_vocab}, "
                                    f"{n_chunk} chunks) needs {want}: truncated or not such a file.")
            tokens = np.frombuffer(f.read(4 * n_ctx * n_chunk), np.int32).copy()
    except OSError as e:
        raise BadInput(f"cannot read '{path}': {e.strerror}.") from None
    return BaseFile(n_ctx, n_vocab, n_chunk, tokens, 20 + 4 * n_ctx * n_chunk)


def save_base(model_path: str, text: str, out_path: str, n_ctx: int = 512, max_chunks: int = 0, threads=None,
              progress: Callable[[int, int], None] | None = None, options: EvalOptions | None = None) -> dict:
    """Score the text with the base model and write its log-probabilities (llama-perplexity's format).
    Returns the base's perplexity figures (the float ones the tool prints in this mode)."""
    from llmkit.io import atomic_file

    t0 = time.perf_counter()
    with Scorer(model_path, n_ctx, _with_threads(options, threads)) as s:
        toks = tokens_for(s, text, max_chunks)
        n_chunk = len(toks) // n_ctx
        with atomic_file(out_path) as f:
            f.write(MAGIC + struct.pack("<Iii", n_ctx, s.n_vocab, n_chunk))
            f.write(toks.astype("<i4").tobytes())

            def write(L):
                for a in range(0, len(L), 32):
                    f.write(pack(L[a:a + 32]).astype("<u2").tobytes())

            mean, unc, count = score_chunks(s, toks, progress, on_logits=write)
    return {"model": model_path, "ppl": math.exp(mean), "ppl_uncertainty": math.exp(mean) * unc, "chunks": n_chunk,
            "n_ctx": n_ctx, "tokens_scored": count, "seconds": time.perf_counter() - t0}


def _with_threads(options: EvalOptions | None, threads) -> EvalOptions:
    """The options, with `threads` (the older positional parameter) when it is given."""
    return replace(options or EvalOptions(), **({"threads": threads} if threads else {}))


def _percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """Linear interpolation between neighbours, in float as kl_divergence()'s percentile lambda."""
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    p = F32(fraction) * F32(len(sorted_values) - 1)
    i = int(p)
    p = F32(p - F32(i))
    lo, hi = sorted_values[i], sorted_values[min(i + 1, len(sorted_values) - 1)]
    return float(F32(F32(F32(1) - p) * lo) + F32(p * hi))


def _median(sorted_values: np.ndarray) -> float:
    """The middle value, or the float mean of the two middle ones."""
    n = len(sorted_values)
    if n % 2:
        return float(sorted_values[n // 2])
    return float(F32(0.5) * F32(sorted_values[n // 2] + sorted_values[n // 2 - 1]))


@dataclass
class KLD:
    model: str
    base_file: str
    count: int
    ppl: float
    ppl_uncertainty: float
    ppl_base: float
    ppl_base_uncertainty: float
    correlation: float
    ln_ppl_ratio: float
    ln_ppl_ratio_uncertainty: float
    kld_mean: float
    kld_uncertainty: float
    kld_max: float
    kld_min: float
    kld_percentiles: dict
    same_top: float
    same_top_uncertainty: float
    dp_mean: float
    dp_uncertainty: float
    dp_rms: float
    dp_rms_uncertainty: float
    dp_max: float
    dp_min: float
    dp_percentiles: dict
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kld"] = {"mean": self.kld_mean, "uncertainty": self.kld_uncertainty, "max": self.kld_max,
                    "min": self.kld_min, **{f"p{_pct_name(k)}": v for k, v in self.kld_percentiles.items()}}
        d["same_top_p"] = {"value": self.same_top, "uncertainty": self.same_top_uncertainty}
        d["ppl"] = {"value": self.ppl, "uncertainty": self.ppl_uncertainty}
        d["ppl_base"] = {"value": self.ppl_base, "uncertainty": self.ppl_base_uncertainty}
        d["delta_p"] = {"mean": self.dp_mean, "uncertainty": self.dp_uncertainty, "rms": self.dp_rms,
                        "rms_uncertainty": self.dp_rms_uncertainty, "max": self.dp_max, "min": self.dp_min,
                        **{f"p{_pct_name(k)}": v for k, v in self.dp_percentiles.items()}}
        return d


def _pct_name(fraction: float) -> str:
    """0.999 -> '99.9', 0.5 -> '50', 0.01 -> '1'."""
    return f"{100 * fraction:g}"


def kl_divergence(model_path: str, base_path: str, threads=None,
                  progress: Callable[[int, int], None] | None = None, options: EvalOptions | None = None) -> KLD:
    """Score the base file's tokens with `model_path` and compare with the saved base (module doc).
    The chunks are evaluated as llama-perplexity --kl-divergence run with -c equal to the file's n_ctx."""
    t0 = time.perf_counter()
    hdr = read_header(base_path)
    nv, m = row_width(hdr.n_vocab), hdr.scored
    s = dict(nll=0.0, nll2=0.0, base=0.0, base2=0.0, cross=0.0, kld=0.0, kld2=0.0, dp=0.0, dp2=0.0, dp4=0.0)
    same, count = 0, 0
    klds, dps = [], []
    with Scorer(model_path, hdr.n_ctx, _with_threads(options, threads)) as sc, open(base_path, "rb") as f:
        if sc.n_vocab != hdr.n_vocab:
            raise BadInput(f"'{base_path}' was written with a {hdr.n_vocab}-token vocabulary, '{model_path}' has "
                           f"{sc.n_vocab}: give the base of this model (same tokenizer).")
        if hdr.tokens.max(initial=0) >= hdr.n_vocab or hdr.tokens.min(initial=0) < 0:
            raise BadFileFormat(f"'{base_path}' holds token ids outside its vocabulary; the file is damaged.")
        f.seek(hdr.data_offset)
        for i, L in sc.chunks(hdr.tokens):
            rows = np.frombuffer(f.read(2 * nv * m), "<u2").reshape(m, nv)
            targets = hdr.tokens[i * hdr.n_ctx + hdr.n_ctx // 2 + 1:(i + 1) * hdr.n_ctx]
            # blocks of 32 positions: a 150k-token vocabulary makes each (positions x vocab) temporary large
            parts = [_compare(L[a:a + 32], rows[a:a + 32], targets[a:a + 32], hdr.n_vocab) for a in range(0, m, 32)]
            nll, nll_b, kl, dp, top = (np.concatenate([p[k] for p in parts]) for k in range(5))
            # the tool's sums: float values (and float products of them) added up in double
            f64 = np.float64
            s["nll"] += float(nll.astype(f64).sum())
            s["nll2"] += float((nll * nll).astype(f64).sum())
            s["base"] += float(nll_b.astype(f64).sum())
            s["base2"] += float((nll_b * nll_b).astype(f64).sum())
            s["cross"] += float((nll * nll_b).astype(f64).sum())
            s["kld"] += float(kl.sum())
            s["kld2"] += float((kl * kl).sum())
            dp2 = (dp * dp).astype(f64)
            s["dp"] += float(dp.astype(f64).sum())
            s["dp2"] += float(dp2.sum())
            s["dp4"] += float((dp2 * dp2).sum())
            same += int(top.sum())
            count += m
            klds.append(kl.astype(F32))
            dps.append(dp)
            if progress:
                progress(i + 1, hdr.n_chunk)
    return summarize(model_path, base_path, s, same, count, np.concatenate(klds), np.concatenate(dps),
                     time.perf_counter() - t0)


def _compare(L: np.ndarray, rows: np.ndarray, targets: np.ndarray, n_vocab: int):
    """Per position, as llama-perplexity's log_softmax against a base row (its float operations):
    float32 nll, nll_base and Δp, float64 KLD (float terms summed in double), same top token."""
    idx = np.arange(len(L))
    mx = L.max(axis=1)
    imax = L.argmax(axis=1)
    lse = np.log(expf(L - mx[:, None]).astype(np.float64).sum(axis=1)).astype(F32)
    head = np.ascontiguousarray(rows[:, :4]).view(F32)
    scale, min_lp = head[:, 0], head[:, 1]
    lp_base = unpack(rows, n_vocab)
    nll = (mx + lse) - L[idx, targets]
    nll_b = -(scale * rows[idx, 4 + targets].astype(F32) + min_lp)
    norm = mx + lse
    keep = lp_base > F32(-16)
    terms = np.where(keep, expf(lp_base) * ((lp_base - L) + norm[:, None]), F32(0))
    kl = terms.astype(np.float64).sum(axis=1)
    top = imax == lp_base.argmax(axis=1)
    dp = expf(-nll) - expf(-nll_b)
    return nll, nll_b, kl, dp, top


def summarize(model_path, base_path, s, same, count, klds, dps, seconds) -> KLD:
    """The statistics llama-perplexity prints, from the running sums and the per-position values."""
    if count < 2:
        raise BadInput("too few scored tokens for statistics; give more text (at least one chunk).")
    lp, lp_u = mean_uncertainty(s["nll"], s["nll2"], count)
    lb, lb_u = mean_uncertainty(s["base"], s["base2"], count)
    cov = ((s["cross"] / count - (s["nll"] / count) * (s["base"] / count)) / (count - 1)) if count >= 10 else 0.0
    cor = cov / (lp_u * lb_u) if lp_u and lb_u else 0.0
    ratio_u = math.sqrt(max(lp_u * lp_u + lb_u * lb_u - 2.0 * cov, 0.0))
    kl, kl_u = mean_uncertainty(s["kld"], s["kld2"], count)
    dpm, dpm_u = mean_uncertainty(s["dp"], s["dp2"], count)
    mse, mse_u = mean_uncertainty(s["dp2"], s["dp4"], count)
    rms = math.sqrt(mse)
    p_top = same / count
    ks, ds = np.sort(klds), np.sort(dps)
    kp = {f: (_median(ks) if f == 0.5 else _percentile(ks, f)) for f in PERCENTILES}
    dpp = {f: (_median(ds) if f == 0.5 else _percentile(ds, f)) for f in DP_PERCENTILES}
    return KLD(model_path, base_path, count, math.exp(lp), math.exp(lp) * lp_u, math.exp(lb), math.exp(lb) * lb_u,
               cor, lp - lb, ratio_u, kl, kl_u, float(ks[-1]), float(ks[0]), kp, p_top,
               math.sqrt(p_top * (1 - p_top) / (count - 1)), dpm, dpm_u, rms, (0.5 / rms * mse_u) if rms else 0.0,
               float(ds[-1]), float(ds[0]), dpp, seconds)
