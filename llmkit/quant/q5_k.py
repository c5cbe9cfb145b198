"""Q5_K: like Q4_K with 5-bit quants (high bits in qh); 5.5 bits per weight."""

from __future__ import annotations

import numpy as np

from llmkit.quant.base import F32, SuperBlockFormat, half_to_f32
from llmkit.quant.kcommon import pack_scales_k4, unpack_scales_k4
from llmkit.quant.q4_k import kquant_scales_mins, requantize


class Q5_K(SuperBlockFormat):
    name, type_id, type_size = "Q5_K", 13, 176
    jit_kernel = "q5_k"
    jit_saves_ns = 40  # per weight against the numpy path in the pipeline (measured, 1 thread)
    half_fields = ((0, 4),)

    def quantize_blocks(self, x, qw=None):
        nb = len(x)
        xt, Lt, ls, lm, d16, dmin16 = kquant_scales_mins(x, 31, qw, (-0.5, 0.1, 15), (-0.9, 0.05, 36))
        q = requantize(xt, Lt, ls, lm, d16, dmin16, 31).reshape(nb, 4, 2, 32)
        hi = (q >> 4) & 1
        shifts = (2 * np.arange(4, dtype=np.uint8))[None, :, None]
        qh = ((hi[:, :, 0] << shifts) | (hi[:, :, 1] << (shifts + 1))).astype(np.uint8)
        qh = np.bitwise_or.reduce(qh, axis=1)  # (nb, 32)
        out = np.empty((nb, 176), np.uint8)
        out[:, 0:2], out[:, 2:4] = d16, dmin16
        out[:, 4:16] = pack_scales_k4(ls, lm)
        out[:, 16:48] = qh
        out[:, 48:] = ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(nb, 128)
        return out

    def dequantize_blocks(self, b):
        nb = len(b)
        d, dmin = half_to_f32(b[:, 0:2]), half_to_f32(b[:, 2:4])
        sc, mn = unpack_scales_k4(b[:, 4:16])
        qh = b[:, 16:48]
        qs = b[:, 48:].reshape(nb, 4, 32)
        k = np.arange(4)[None, :, None]
        lo = (qs & 0xF) | ((((qh[:, None, :] >> (2 * k)) & 1)) << 4)
        hi = (qs >> 4) | ((((qh[:, None, :] >> (2 * k + 1)) & 1)) << 4)
        q = np.stack([lo, hi], axis=2).reshape(nb, 8, 32).astype(F32)
        return ((d[:, None] * sc)[:, :, None] * q - (dmin[:, None] * mn)[:, :, None]).reshape(nb, 256)
