"""float32 helpers with ggml's exact semantics, shared by every format: fp16 conversion, C-order
sums, first-found extremes, the transposed block layout. Every format's numpy path is built from these
(and `search.py`), so the bytes equal ggml-quants.c's."""

from __future__ import annotations

import numpy as np

F32 = np.float32


def fp16(x) -> np.ndarray:
    """float32 -> IEEE half (round to nearest even, like GGML_FP32_TO_FP16)."""
    return np.asarray(x, dtype=F32).astype(np.float16)


def fp16_bytes(x) -> np.ndarray:
    """(n,) float32 -> (n, 2) uint8, little-endian half floats."""
    return fp16(x).reshape(-1).view(np.uint8).reshape(-1, 2)


def half_to_f32(b: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 -> (n,) float32."""
    return np.ascontiguousarray(b).view(np.float16).reshape(-1).astype(F32)


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: float32 + 1.5*2^23 trick = round half to even."""
    return np.rint(v).astype(np.int32)


def colsum(a: np.ndarray) -> np.ndarray:
    """In-order float32 sum over axis 0 of an (n, B) array: ((a0 + a1) + a2) + ...

    numpy reduces a non-innermost axis row by row into the output (pairwise summation is only used
    along the innermost axis), which is exactly this order; tests/test_quant.py checks it on data
    where the two orders give different sums, so a numpy that changes it fails loudly."""
    return np.add.reduce(a, axis=0)


def seq_sum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis in order, in float32, like a C `for` loop `s += a[i]` (numpy's
    sum is pairwise and rounds differently): n - 1 vector additions over the transposed array."""
    return colsum(np.ascontiguousarray(np.moveaxis(np.asarray(a, dtype=F32), -1, 0)))


def safe_inv(d: np.ndarray) -> np.ndarray:
    """1/d in float32, 0 where d == 0 (ggml: `d ? 1.0f/d : 0.0f`)."""
    out = np.zeros_like(d, dtype=F32)
    np.divide(F32(1), d, out=out, where=d != 0)
    return out


def blocks_t(x: np.ndarray) -> np.ndarray:
    """(n_blocks, block) -> its transposed float32 copy (block, n_blocks): "weight j of every block" is
    then one contiguous row, so per-block reductions and per-block scales become fast row operations."""
    x = np.asarray(x, dtype=F32)
    if len(x) <= 512:
        return np.ascontiguousarray(x.T)
    t = np.empty((x.shape[1], len(x)), F32)
    for i in range(0, len(x), 256):  # in 256-block slabs, which stay in cache: faster than one strided copy
        t[:, i:i + 256] = x[i:i + 256].T
    return t


def first_min_t(xt: np.ndarray) -> np.ndarray:
    """Per column of (n, B) the minimum as C's `if (v < min) min = v` finds it: the reduction gives the
    value; only where it is zero can the loop's answer differ (the sign of the first zero)."""
    return _first_extreme_t(xt, xt.min(axis=0), np.argmin)


def first_max_t(xt: np.ndarray) -> np.ndarray:
    """Per column the maximum as C's `if (v > max) max = v` finds it (see first_min_t)."""
    return _first_extreme_t(xt, xt.max(axis=0), np.argmax)


def _first_extreme_t(xt, v, arg):
    z = np.flatnonzero(v == 0)
    if len(z):
        sub = xt[:, z]
        v[z] = sub[arg(sub, axis=0), np.arange(len(z))]
    return v


def abs_max_signed_t(xt: np.ndarray) -> np.ndarray:
    """Per column of (n, B) ggml's `max`: the first value with the largest magnitude, or +0.0 when every
    value is zero (the C loop starts from max = 0 and only moves on a strictly larger |v|). From the
    column min and max; only columns where min == -max need the position of the first extreme."""
    mn, mx = xt.min(axis=0), xt.max(axis=0)
    out = np.where(mx >= -mn, mx, mn)
    tie = np.flatnonzero((mx == -mn) & (mx > 0))
    if len(tie):
        sub = xt[:, tie]
        out[tie] = sub[np.abs(sub).argmax(axis=0), np.arange(len(tie))]
    out[(mx == 0) & (mn == 0)] = F32(0.0)  # also turns -0.0 into +0.0
    return out


def abs_max_signed(x: np.ndarray) -> np.ndarray:
    """abs_max_signed_t per row of (n_rows, n)."""
    return abs_max_signed_t(blocks_t(x))


def abs_max_t(xt: np.ndarray) -> np.ndarray:
    """Per column the largest |v| (+0.0 for all-zero columns, as C's `amax = MAX(amax, fabsf(v))` from 0)."""
    out = np.maximum(xt.max(axis=0), -xt.min(axis=0))
    out[out == 0] = F32(0.0)
    return out


def put_rows(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src where src is a transposed (strided) view: copied 1024 rows at a time, which stays
    in cache and beats one strided copy into the block layout."""
    for i in range(0, len(dst), 1024):
        dst[i:i + 1024] = src[i:i + 1024]
