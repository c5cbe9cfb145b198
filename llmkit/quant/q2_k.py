"""Q2_K: super-blocks of 256 = 16 sub-blocks of 16 with 4-bit scale and 4-bit min codes,
2-bit quants, fp16 super-scales d and dmin; 2.625 bits per weight."""

from __future__ import annotations

import numpy as np

from llmkit.quant.base import F32, SuperBlockFormat, fp16_bytes, half_to_f32, nearest_int, seq_sum
from llmkit.quant.kcommon import make_qkx, make_qp_quants
from llmkit.quant.q3_k import pack_2bit, unpack_2bit


class Q2_K(SuperBlockFormat):
    name, type_id, type_size = "Q2_K", 10, 84
    half_fields = ((80, 84),)

    def quantize_blocks(self, x, qw=None):
        nb = len(x)
        sub = x.reshape(nb * 16, 16)
        if qw is None:
            scales, mins, L = make_qkx(sub, 3, np.abs(sub), -0.5, 0.1, 15, use_mad=True)
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
            sigma2 = seq_sum(x * x) / F32(256)
            xs = sub.reshape(nb, 16, 16)
            w = (qw.reshape(nb, 16, 16) * np.sqrt(sigma2[:, None, None] + xs * xs)).reshape(nb * 16, 16)
            sw = seq_sum(w).reshape(nb, 16)
            scales, mins, L = make_qkx(sub, 3, w, -0.9, 0.05, 36, use_mad=False)
            dm, ls = make_qp_quants(scales.reshape(nb, 16), 15, sw)
            mm, lm = make_qp_quants(mins.reshape(nb, 16), 15, sw)
            d16, dmin16 = fp16_bytes(dm), fp16_bytes(mm)
            codes = (ls.astype(np.uint8) | (lm.astype(np.uint8) << 4)).astype(np.uint8)
        d = half_to_f32(d16)[:, None] * (codes & 0xF).astype(F32)
        m = half_to_f32(dmin16)[:, None] * (codes >> 4).astype(F32)
        with np.errstate(divide="ignore", invalid="ignore"):
            l = np.clip(nearest_int((sub.reshape(nb, 16, 16) + m[:, :, None]) / d[:, :, None]), 0, 3)
        L = np.where((d != 0)[:, :, None], l, L.reshape(nb, 16, 16)).reshape(nb, 256)
        out = np.empty((nb, 84), np.uint8)
        out[:, 0:16] = codes
        out[:, 16:80] = pack_2bit(L)
        out[:, 80:82], out[:, 82:84] = d16, dmin16
        return out

    def dequantize_blocks(self, b):
        nb = len(b)
        codes = b[:, 0:16]
        q = unpack_2bit(b[:, 16:80]).reshape(nb, 16, 16).astype(F32)
        d, dmin = half_to_f32(b[:, 80:82]), half_to_f32(b[:, 82:84])
        dl = d[:, None] * (codes & 0xF).astype(F32)
        ml = dmin[:, None] * (codes >> 4).astype(F32)
        return (dl[:, :, None] * q - ml[:, :, None]).reshape(nb, 256)
