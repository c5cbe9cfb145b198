"""Q2_K: super-blocks of 256 = 16 sub-blocks of 16 with 4-bit scale and 4-bit min codes,
2-bit quants, fp16 super-scales d and dmin; 2.625 bits per weight."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.kquants.kquant import SuperBlockFormat
from llmkit.quant.formats.numerics import F32, blocks_t, colsum, fp16_bytes, half_to_f32, nearest_int, seq_sum
from llmkit.quant.formats.packing import pack_2bit, unpack_2bit
from llmkit.quant.formats.search import imatrix_weights_t, levels_to_blocks, make_qkx, make_qp_quants


class Q2_K(SuperBlockFormat):
    name = "Q2_K"
    weighted_kernel = "q2_k_w"
    half_fields = ((80, 84),)

    def quantize_blocks(self, x, qw=None):
        nb = len(x)
        xt = blocks_t(x.reshape(nb * 16, 16))  # (16, sub-blocks)
        if qw is None:
            scales, mins, Lt = make_qkx(xt, 3, np.abs(xt), -0.5, 0.1, 15, use_mad=True, transposed=True)
            scales, mins = scales.reshape(nb, 16), mins.reshape(nb, 16)
            max_scale = np.maximum(F32(0), scales.max(axis=1))
            max_min = np.maximum(F32(0), mins.max(axis=1))
            with np.errstate(divide="ignore", invalid="ignore"):
                ls = np.where((max_scale > 0)[:, None], nearest_int((F32(15) / max_scale)[:, None] * scales), 0)
                lm = np.where((max_min > 0)[:, None], nearest_int((F32(15) / max_min)[:, None] * mins), 0)
            d16 = fp16_bytes(np.where(max_scale > 0, max_scale / F32(15), F32(0)))
            dmin16 = fp16_bytes(np.where(max_min > 0, max_min / F32(15), F32(0)))
            codes = (ls.astype(np.uint8) | (lm.astype(np.uint8) << 4)).astype(np.uint8)
        else:
            sigma2 = np.repeat(seq_sum(x * x) / F32(256), 16)  # per sub-block column (factor 1 in Q2_K)
            wt = imatrix_weights_t(xt, blocks_t(qw.reshape(nb * 16, 16)), sigma2)
            sw = colsum(wt).reshape(nb, 16)
            scales, mins, Lt = make_qkx(xt, 3, wt, -0.9, 0.05, 36, use_mad=False, transposed=True)
            dm, ls = make_qp_quants(scales.reshape(nb, 16), 15, sw)
            mm, lm = make_qp_quants(mins.reshape(nb, 16), 15, sw)
            d16, dmin16 = fp16_bytes(dm), fp16_bytes(mm)
            codes = (ls.astype(np.uint8) | (lm.astype(np.uint8) << 4)).astype(np.uint8)
        d = (half_to_f32(d16)[:, None] * (codes & 0xF).astype(F32)).reshape(-1)
        m = (half_to_f32(dmin16)[:, None] * (codes >> 4).astype(F32)).reshape(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            lt = xt + m
            lt /= d
            np.rint(lt, out=lt)
            np.clip(lt, 0, 3, out=lt)
        L = levels_to_blocks(Lt, lt, d).reshape(nb, 256)
        out = np.empty((nb, 84), np.uint8)
        out[:, 0:16] = codes
        self.pack_levels(out, L)
        out[:, 80:82], out[:, 82:84] = d16, dmin16
        return out

    def pack_levels(self, out, L):
        out[:, 16:80] = pack_2bit(L)

    def unpack_levels(self, b):
        return unpack_2bit(b[:, 16:80])

    def dequantize_blocks(self, b):
        nb = len(b)
        codes = b[:, 0:16]
        q = self.unpack_levels(b).reshape(nb, 16, 16).astype(F32)
        d, dmin = half_to_f32(b[:, 80:82]), half_to_f32(b[:, 82:84])
        dl = d[:, None] * (codes & 0xF).astype(F32)
        ml = dmin[:, None] * (codes >> 4).astype(F32)
        return (dl[:, :, None] * q - ml[:, :, None]).reshape(nb, 256)
