"""Q4_K: super-blocks of 256 = 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min
(packed in 12 bytes), 4-bit quants, fp16 super-scales d and dmin; 4.5 bits per weight."""

from __future__ import annotations

import numpy as np

from llmkit.quant.base import F32, SuperBlockFormat, blocks_t, colsum, fp16_bytes, half_to_f32, nearest_int, seq_sum
from llmkit.quant.kcommon import make_qkx, make_qp_quants, pack_scales_k4, superblock_sigma2, unpack_scales_k4


def kquant_scales_mins(x, nmax, qw, ref_params, imx_params):
    """Sub-block (scale, min, L) and the 6-bit scale/min codes with their fp16 super-scales.

    Without an imatrix: make_qkx2 with weights av_x + |x| per sub-block, codes = round(63 * s / max s).
    With one: make_qkx3 with weights qw * sqrt(sigma2 + x^2), codes from make_qp_quants."""
    nb = len(x)
    sub = x.reshape(nb * 8, 32)
    if qw is None:
        xt = blocks_t(sub)  # (32, sub-blocks)
        av_x = np.sqrt(colsum(xt * xt) / F32(32))
        wt = np.abs(xt)
        wt += av_x  # av_x + |x|
        scales, mins, L = make_qkx(xt, nmax, wt, *ref_params, use_mad=False, transposed=True)
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
        sigma2 = superblock_sigma2(x)
        xs = sub.reshape(nb, 8, 32)
        w = (qw.reshape(nb, 8, 32) * np.sqrt(sigma2[:, None, None] + xs * xs)).reshape(nb * 8, 32)
        sw = seq_sum(w).reshape(nb, 8)
        scales, mins, L = make_qkx(sub, nmax, w, *imx_params, use_mad=False)
        d, ls = make_qp_quants(scales.reshape(nb, 8), 63, sw)
        dmin, lm = make_qp_quants(mins.reshape(nb, 8), 63, sw)
        ls, lm = np.minimum(63, ls), np.minimum(63, lm)
    return sub, L.reshape(nb, 8, 32), ls, lm, fp16_bytes(d), fp16_bytes(dmin)


def requantize(sub, L, ls, lm, d16, dmin16, nmax):
    """Levels from the final (fp16, 6-bit) scales; sub-blocks whose scale is 0 keep the search's levels."""
    nb = len(L)
    d = half_to_f32(d16)[:, None] * ls.astype(F32)
    dm = half_to_f32(dmin16)[:, None] * lm.astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        l = np.clip(nearest_int((sub.reshape(nb, 8, 32) + dm[:, :, None]) / d[:, :, None]), 0, nmax)
    return np.where((d != 0)[:, :, None], l, L).reshape(nb, 256).astype(np.uint8)


class Q4_K(SuperBlockFormat):
    name, type_id, type_size = "Q4_K", 12, 144
    half_fields = ((0, 4),)

    def quantize_blocks(self, x, qw=None):
        nb = len(x)
        sub, L, ls, lm, d16, dmin16 = kquant_scales_mins(x, 15, qw, (-1.0, 0.1, 20), (-0.9, 0.05, 36))
        q = requantize(sub, L, ls, lm, d16, dmin16, 15).reshape(nb, 4, 2, 32)
        out = np.empty((nb, 144), np.uint8)
        out[:, 0:2], out[:, 2:4] = d16, dmin16
        out[:, 4:16] = pack_scales_k4(ls, lm)
        out[:, 16:] = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(nb, 128)
        return out

    def dequantize_blocks(self, b):
        nb = len(b)
        d, dmin = half_to_f32(b[:, 0:2]), half_to_f32(b[:, 2:4])
        sc, mn = unpack_scales_k4(b[:, 4:16])
        qs = b[:, 16:].reshape(nb, 4, 32)
        q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32).astype(F32)
        return ((d[:, None] * sc)[:, :, None] * q - (dmin[:, None] * mn)[:, :, None]).reshape(nb, 256)
