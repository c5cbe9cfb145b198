"""Q5_1: blocks of 32 = fp16 d, fp16 min + 32 high bits + 4-bit low parts; d = (max - min) / 31."""

from __future__ import annotations

import numpy as np

from llmkit.quant.base import (
    F32, Format, blocks_t, first_max_t, first_min_t, fp16_bytes, half_to_f32, high_bits_t,
    nibbles_t, put_rows, safe_inv)
from llmkit.quant.kcommon import block32_weights, make_qkx


class Q5_1(Format):
    name, type_id, block, type_size = "Q5_1", 7, 32, 24
    jit_kernel = "q5_1"
    jit_saves_ns = 2  # per weight against the numpy path in the pipeline (measured, 1 thread)
    half_fields = ((0, 4),)
    nan_reaches_scale = True
    uses_imatrix = True

    def quantize_blocks(self, x):
        xt = blocks_t(x)  # (32, n_blocks)
        mn, mx = first_min_t(xt), first_max_t(xt)
        d = (mx - mn) / F32(31)
        xt -= mn
        xt *= safe_inv(d)
        xt += F32(0.5)  # >= 0.5: the cast truncates (no clamp in ggml's Q5_1)
        return self._pack(d, mn, xt.astype(np.uint8))

    def quantize_weighted(self, rows, imatrix):
        x, w = block32_weights(rows, imatrix)
        d, the_min, q = make_qkx(x, 31, w, -0.9, 0.05, 36, use_mad=False)
        return self._pack(d, -the_min, np.ascontiguousarray(q.T, dtype=np.uint8))

    @staticmethod
    def _pack(d, m, qt):
        out = np.empty((len(d), 24), np.uint8)
        out[:, :2] = fp16_bytes(d)
        out[:, 2:4] = fp16_bytes(m)
        put_rows(out[:, 4:8], high_bits_t(qt))
        put_rows(out[:, 8:], nibbles_t(qt))
        return out

    def dequantize_blocks(self, b):
        d, m = half_to_f32(b[:, :2]), half_to_f32(b[:, 2:4])
        qh = np.ascontiguousarray(b[:, 4:8]).view("<u4")
        hi = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32) << 4
        qs = b[:, 8:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32) | hi
        return d[:, None] * q.astype(F32) + m[:, None]
