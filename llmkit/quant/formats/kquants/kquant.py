"""What the K-quants share: 256-weight super-blocks (`SuperBlockFormat`), and for Q4_K and Q5_K
(`ScaleMinK`) eight sub-blocks of 32 with a 6-bit scale and a 6-bit min each (12 packed bytes),
relative to fp16 super-scales d and dmin: the sub-block search, the 6-bit codes and the final
requantization from the rounded scales. Each format module only adds its level layout."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.base import ColumnWeighted
from llmkit.quant.formats.numerics import F32, blocks_t, colsum, fp16_bytes, half_to_f32, nearest_int
from llmkit.quant.formats.packing import pack_scales_k4, unpack_scales_k4
from llmkit.quant.formats.search import (
    imatrix_weights_t, levels_to_blocks, make_qkx, make_qp_quants, superblock_sigma2)


class SuperBlockFormat(ColumnWeighted):
    """K-quants: 256-weight super-blocks; with an imatrix, every row uses the same column weights."""


def kquant_scales_mins(x, nmax, qw, ref_params, imx_params):
    """Sub-block (scale, min, levels) and the 6-bit scale/min codes with their fp16 super-scales,
    on the transposed layout xt (32, sub-blocks). Returns (xt, Lt, ls, lm, d16, dmin16).

    Without an imatrix: make_qkx2 with weights av_x + |x| per sub-block, codes = round(63 * s / max s).
    With one: make_qkx3 with weights qw * sqrt(sigma2 + x^2), codes from make_qp_quants."""
    nb = len(x)
    xt = blocks_t(x.reshape(nb * 8, 32))  # (32, sub-blocks)
    if qw is None:
        av_x = np.sqrt(colsum(xt * xt) / F32(32))
        wt = np.abs(xt)
        wt += av_x  # av_x + |x|
        scales, mins, Lt = make_qkx(xt, nmax, wt, *ref_params, use_mad=False, transposed=True)
        scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
        max_scale = np.maximum(F32(0), scales.max(axis=1))
        max_min = np.maximum(F32(0), mins.max(axis=1))
        with np.errstate(divide="ignore"):
            inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0)).astype(F32)
            inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0)).astype(F32)
        ls = np.minimum(63, nearest_int(inv_scale[:, None] * scales) & 0xFF)
        lm = np.minimum(63, nearest_int(inv_min[:, None] * mins) & 0xFF)
        d, dmin = max_scale / F32(63), max_min / F32(63)
    else:
        wt = imatrix_weights_t(xt, blocks_t(qw.reshape(nb * 8, 32)), np.repeat(superblock_sigma2(x), 8))
        sw = colsum(wt).reshape(nb, 8)
        scales, mins, Lt = make_qkx(xt, nmax, wt, *imx_params, use_mad=False, transposed=True)
        d, ls = make_qp_quants(scales.reshape(nb, 8), 63, sw)
        dmin, lm = make_qp_quants(mins.reshape(nb, 8), 63, sw)
        ls, lm = np.minimum(63, ls), np.minimum(63, lm)
    return xt, Lt, ls, lm, fp16_bytes(d), fp16_bytes(dmin)


def requantize(xt, Lt, ls, lm, d16, dmin16, nmax):
    """Levels from the final (fp16, 6-bit) scales, on the transposed layout; sub-blocks whose scale
    is 0 keep the search's levels. Returns (n_blocks, 256) uint8."""
    nb = len(ls)
    d = (half_to_f32(d16)[:, None] * ls.astype(F32)).reshape(-1)
    dm = (half_to_f32(dmin16)[:, None] * lm.astype(F32)).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lt = xt + dm
        lt /= d
        np.rint(lt, out=lt)
        np.clip(lt, 0, nmax, out=lt)
    return levels_to_blocks(Lt, lt, d).reshape(nb, 256)


class ScaleMinK(SuperBlockFormat):
    """Q4_K and Q5_K: d, dmin (fp16), 12 bytes of 6-bit scale/min codes, then the levels."""

    nmax = 15
    ref_params = (-1.0, 0.1, 20)  # make_qkx2's (rmin, rdelta, nstep) without an imatrix
    half_fields = ((0, 4),)

    def quantize_blocks(self, x, qw=None):
        nb = len(x)
        xt, Lt, ls, lm, d16, dmin16 = kquant_scales_mins(x, self.nmax, qw, self.ref_params, (-0.9, 0.05, 36))
        L = requantize(xt, Lt, ls, lm, d16, dmin16, self.nmax)
        out = np.empty((nb, self.type_size), np.uint8)
        out[:, 0:2], out[:, 2:4] = d16, dmin16
        out[:, 4:16] = pack_scales_k4(ls, lm)
        self.pack_levels(out, L)
        return out

    def dequantize_blocks(self, b):
        nb = len(b)
        d, dmin = half_to_f32(b[:, 0:2]), half_to_f32(b[:, 2:4])
        sc, mn = unpack_scales_k4(b[:, 4:16])
        q = self.unpack_levels(b).reshape(nb, 8, 32).astype(F32)
        return ((d[:, None] * sc)[:, :, None] * q - (dmin[:, None] * mn)[:, :, None]).reshape(nb, 256)
