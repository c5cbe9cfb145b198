"""IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-linear table of 16 int8 levels (denser near
zero, like a weight distribution). IQ4_NL: blocks of 32 with one fp16 scale (4.5 bits/weight).
IQ4_XS: super-blocks of 256 = 8 sub-blocks of 32, each with a 6-bit scale relative to an fp16
super-scale (4.25 bits/weight).

The scale search (ggml's quantize_row_iq4_nl_impl): start at -max/-127, least-squares refit, then
15 scales around 127/max; each value takes the nearest table level (ties to the upper level only
when strictly closer), the error is weighted by x^2 or by the imatrix qw * sqrt(sigma2 + x^2).
Blocks are columns of the transposed (32, blocks) layout, as in kcommon.
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.base import (
    F32, Format, SuperBlockFormat, abs_max_signed, abs_max_signed_t, blocks_t, colsum, fp16_bytes, half_to_f32,
    nibbles_t, put_rows, safe_inv)
from llmkit.quant.kcommon import GROUP_MAX_EPS, imatrix_weights_t

VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=F32)


# the levels are integers, so for |a| within the table the pair of levels around a depends only on
# floor(a): per floor value, the level at or below it and the one above (a table lookup is ~10x
# faster than np.searchsorted here)
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


def _levels_bytes(xt: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """Table indices of x * inv per column, packed two per byte in the block layout: (B, 16)."""
    out = np.empty((xt.shape[1], 16), np.uint8)
    put_rows(out, nibbles_t(best_index(xt * inv)))
    return out


class IQ4_NL(Format):
    name, type_id, block, type_size = "IQ4_NL", 20, 32, 18
    half_fields = ((0, 2),)
    uses_imatrix = True

    def quantize_blocks(self, x, qw=None):
        xt = blocks_t(x)
        if qw is None:
            wt = xt * xt
        else:  # sigma2 = sum(x^2) * 2/32 per block
            wt = imatrix_weights_t(xt, blocks_t(qw), colsum(xt * xt) * F32(2 / 32))
        d = block_scales(xt, wt)
        out = np.empty((len(d), 18), np.uint8)
        out[:, :2] = fp16_bytes(d)
        out[:, 2:] = _levels_bytes(xt, safe_inv(d))  # from the float scale, as ggml does
        return out

    def quantize_weighted(self, rows, imatrix):
        n_rows, n = rows.shape
        qw = np.broadcast_to(imatrix.reshape(1, n), (n_rows, n)).reshape(-1, 32)
        return self.quantize_blocks(rows.reshape(-1, 32), np.ascontiguousarray(qw))

    def dequantize_blocks(self, b):
        d = half_to_f32(b[:, :2])
        qs = b[:, 2:]
        idx = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
        return d[:, None] * VALUES[idx]


class IQ4_XS(SuperBlockFormat):
    name, type_id, type_size = "IQ4_XS", 23, 136
    half_fields = ((0, 2),)

    def quantize_blocks(self, x, qw=None):
        nb = len(x)
        xt = blocks_t(x.reshape(nb * 8, 32))  # (32, sub-blocks)
        if qw is None:
            wt = xt * xt
        else:  # sigma2 = sum(x^2) * 2/256 per super-block
            sigma2 = np.repeat(colsum(blocks_t(x) ** 2) * F32(2 / 256), 8)
            wt = imatrix_weights_t(xt, blocks_t(qw.reshape(nb * 8, 32)), sigma2)
        scales = block_scales(xt, wt)
        with np.errstate(divide="ignore", invalid="ignore"):
            d = -abs_max_signed(scales.reshape(nb, 8)) / F32(32)
            ls = np.clip(np.rint(safe_inv(d)[:, None] * scales.reshape(nb, 8)), -32, 31)
            dl = (d[:, None] * ls).reshape(-1)  # the float super-scale, not its fp16 rounding
        codes = (ls + 32).astype(np.uint8)  # (nb, 8) 6-bit
        out = np.empty((nb, 136), np.uint8)
        out[:, 0:2] = fp16_bytes(d)
        h = (codes >> 4).astype(np.uint16) << (2 * np.arange(8, dtype=np.uint16))
        out[:, 2:4] = np.bitwise_or.reduce(h, axis=1).astype("<u2").view(np.uint8).reshape(nb, 2)
        lo = codes & 0xF
        out[:, 4:8] = lo[:, 0::2] | (lo[:, 1::2] << 4)
        out[:, 8:] = _levels_bytes(xt, safe_inv(dl)).reshape(nb, 128)
        return out

    def dequantize_blocks(self, b):
        nb = len(b)
        d = half_to_f32(b[:, 0:2])
        sh = np.ascontiguousarray(b[:, 2:4]).view("<u2").reshape(nb)
        sl = b[:, 4:8]
        lo = np.stack([sl & 0xF, sl >> 4], axis=2).reshape(nb, 8).astype(np.int32)
        hi = ((sh[:, None] >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.int32)
        dl = d[:, None] * ((lo | (hi << 4)) - 32).astype(F32)  # (nb, 8)
        qs = b[:, 8:].reshape(nb, 8, 16)
        idx = np.concatenate([qs & 0x0F, qs >> 4], axis=2)  # (nb, 8, 32)
        return (dl[:, :, None] * VALUES[idx]).reshape(nb, 256)
