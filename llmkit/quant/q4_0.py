"""Q4_0: blocks of 32 = fp16 d + 16 bytes of 4-bit q; d = m / -8 where m is the signed value of
largest magnitude, q = min(15, trunc(x/d + 8.5)), weights j and j+16 share a byte."""

from __future__ import annotations

import numpy as np

from llmkit.quant.base import (
    F32, Format, abs_max_signed_t, blocks_t, fp16_bytes, half_to_f32, nibbles_t, put_rows, safe_inv)
from llmkit.quant.kcommon import block32_weights, make_qx_quants


class Q4_0(Format):
    name, type_id, block, type_size = "Q4_0", 2, 32, 18
    jit_kernel = "q4_0"
    jit_saves_ns = 2  # per weight against the numpy path in the pipeline (measured, 1 thread)
    half_fields = ((0, 2),)
    nan_reaches_scale = True
    uses_imatrix = True

    def quantize_blocks(self, x):
        xt = blocks_t(x)  # (32, n_blocks)
        d = abs_max_signed_t(xt) / F32(-8)
        xt *= safe_inv(d)
        xt += F32(8.5)  # >= 0.5, so the cast truncates like C's (int8_t)
        np.minimum(xt, F32(15), out=xt)
        return self._pack(d, xt.astype(np.uint8))

    def quantize_weighted(self, rows, imatrix):
        x, w = block32_weights(rows, imatrix)
        d, q = make_qx_quants(x, 8, 1, w)
        return self._pack(d, np.ascontiguousarray(q.T, dtype=np.uint8))

    @staticmethod
    def _pack(d, qt):
        out = np.empty((len(d), 18), np.uint8)
        out[:, :2] = fp16_bytes(d)
        put_rows(out[:, 2:], nibbles_t(qt))
        return out

    def dequantize_blocks(self, b):
        d = half_to_f32(b[:, :2])
        qs = b[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32) - 8
        return d[:, None] * q.astype(F32)
