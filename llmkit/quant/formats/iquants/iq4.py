"""What IQ4_NL and IQ4_XS share: 4-bit indices into a fixed non-linear table of 16 int8 levels (denser near
zero, like a weight distribution). IQ4_NL: blocks of 32 with one fp16 scale (4.5 bits/weight).
IQ4_XS: super-blocks of 256 = 8 sub-blocks of 32, each with a 6-bit scale relative to an fp16
super-scale (4.25 bits/weight).

The scale search (ggml's quantize_row_iq4_nl_impl): start at -max/-127, least-squares refit, then
15 scales around 127/max; each value takes the nearest table level (ties to the upper level only
when strictly closer), the error is weighted by x^2 or by the imatrix qw * sqrt(sigma2 + x^2).
Blocks are columns of the transposed (32, blocks) layout, as in search.py.
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.numerics import F32, abs_max_signed_t, colsum, put_rows
from llmkit.quant.formats.packing import nibbles_t, unpack_nibbles
from llmkit.quant.formats.search import GROUP_MAX_EPS

VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=F32)


# the levels are integers, so for |a| within the table the pair of levels around a depends only on
# floor(a): per floor value, the level at or below it and the one above (a table lookup instead of a
# np.searchsorted per call)
_FLOORS = np.arange(-127, 113, dtype=F32)
_MU = np.clip(np.searchsorted(VALUES, _FLOORS, side="right"), 1, 15)
_LO, _HI, _LO_IDX = VALUES[_MU - 1], VALUES[_MU], (_MU - 1).astype(np.uint8)


def _around(a: np.ndarray):
    """Row into the tables for every value (clamped to the table's ends; fmax/fmin also send NaN,
    which only masked all-zero blocks produce, to a valid row)."""
    f = np.floor(a)
    np.fmax(f, F32(-127), out=f)
    np.fmin(f, F32(112), out=f)
    f += F32(127)
    return f.astype(np.intp)


def best_index(a: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8 for every value: the nearest table level, the upper one unless the
    lower is strictly closer (below the first level: 0; above the last: 15)."""
    r = _around(a)
    lower = (a - _LO.take(r)) < (_HI.take(r) - a)
    return _LO_IDX.take(r) + (~lower).view(np.uint8)


def best_level(a: np.ndarray) -> np.ndarray:
    """VALUES[best_index(a)] without the index: hi + (lo - hi) * [lower] (exact: small integers)."""
    r = _around(a)
    lo, hi = _LO.take(r), _HI.take(r)
    lower = ((a - lo) < (hi - a)).astype(F32)
    lo -= hi
    lo *= lower
    lo += hi
    return lo


def _sums(xt, wt, iscale):
    """sum w*q*x and sum w*q*q per column for the levels q of x * iscale (C's order: (w*q)*x)."""
    q = best_level(xt * iscale)
    wq = wt * q
    return colsum(wq * xt), colsum(wq * q)


def block_scales(xt: np.ndarray, wt: np.ndarray, ntry: int = 7) -> np.ndarray:
    """(32, B) -> the scale of each column (0 where the block is all zeros)."""
    mx = abs_max_signed_t(xt)
    zero = np.abs(mx) < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = -mx / VALUES[0]
        sumqx, sumq2 = _sums(xt, wt, F32(1) / d)
        d = np.where(sumq2 > 0, sumqx / sumq2, F32(0))
        best = d * sumqx
        for itry in range(-ntry, ntry + 1):
            sumqx, sumq2 = _sums(xt, wt, F32(itry + int(VALUES[0])) / mx)
            better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            if better.any():
                d = np.where(better, sumqx / sumq2, d)
                best = np.where(better, d * sumqx, best)
    d[zero] = 0
    return d


def levels_bytes(xt: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """Table indices of x * inv per column, packed two per byte in the block layout: (B, 16)."""
    out = np.empty((xt.shape[1], 16), np.uint8)
    put_rows(out, nibbles_t(best_index(xt * inv)))
    return out


def table_values(qs: np.ndarray) -> np.ndarray:
    """Packed 4-bit indices (B, 16) -> their table levels (B, 32) float32."""
    return VALUES[unpack_nibbles(qs)]
