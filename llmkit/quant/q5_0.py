"""Q5_0: blocks of 32 = fp16 d + 32 high bits (uint32) + 4-bit low parts; d = m / -16,
q = min(31, trunc(x/d + 16.5))."""

from __future__ import annotations

import numpy as np

from llmkit.quant.base import (
    F32, Format, abs_max_signed_t, blocks_t, fp16_bytes, half_to_f32, high_bits_t, nibbles_t,
    put_rows, safe_inv)
from llmkit.quant.kcommon import block32_weights, make_qx_quants


class Q5_0(Format):
    name, type_id, block, type_size = "Q5_0", 6, 32, 22
    jit_kernel = "q5_0"
    jit_saves_ns = 2  # per weight against the numpy path in the pipeline (measured, 1 thread)
    half_fields = ((0, 2),)
    nan_reaches_scale = True
    uses_imatrix = True

    def quantize_blocks(self, x):
        xt = blocks_t(x)  # (32, n_blocks)
        d = abs_max_signed_t(xt) / F32(-16)
        xt *= safe_inv(d)
        xt += F32(16.5)  # >= 0.5, so the cast truncates like C's (int8_t)
        np.minimum(xt, F32(31), out=xt)
        return self._pack(d, xt.astype(np.uint8))

    def quantize_weighted(self, rows, imatrix):
        x, w = block32_weights(rows, imatrix)
        d, q = make_qx_quants(x, 16, 1, w)
        return self._pack(d, np.ascontiguousarray(q.T, dtype=np.uint8))

    @staticmethod
    def _pack(d, qt):
        out = np.empty((len(d), 22), np.uint8)
        out[:, :2] = fp16_bytes(d)
        put_rows(out[:, 2:6], high_bits_t(qt))
        put_rows(out[:, 6:], nibbles_t(qt))
        return out

    def dequantize_blocks(self, b):
        d = half_to_f32(b[:, :2])
        qh = np.ascontiguousarray(b[:, 2:6]).view("<u4")
        hi = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32) << 4
        qs = b[:, 6:]
        q = (np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32) | hi) - 16
        return d[:, None] * q.astype(F32)
