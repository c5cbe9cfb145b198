"""Q4_1: blocks of 32 = fp16 d, fp16 min m + 4-bit q; d = (max - min) / 15, q = min(15, trunc((x - m)/d + 0.5))."""

from __future__ import annotations

import numpy as np

from llmkit.quant.base import (
    F32, Format, blocks_t, first_max_t, first_min_t, fp16_bytes, half_to_f32, nibbles_t, put_rows,
    safe_inv)
from llmkit.quant.kcommon import block32_weights, make_qkx


class Q4_1(Format):
    name, type_id, block, type_size = "Q4_1", 3, 32, 20
    jit_kernel = "q4_1"
    jit_saves_ns = 2  # per weight against the numpy path in the pipeline (measured, 1 thread)
    half_fields = ((0, 4),)
    nan_reaches_scale = True
    uses_imatrix = True

    def quantize_blocks(self, x):
        xt = blocks_t(x)  # (32, n_blocks)
        mn, mx = first_min_t(xt), first_max_t(xt)
        d = (mx - mn) / F32(15)
        xt -= mn
        xt *= safe_inv(d)
        xt += F32(0.5)  # >= 0.5: the cast truncates
        np.minimum(xt, F32(15), out=xt)
        return self._pack(d, mn, xt.astype(np.uint8))

    def quantize_weighted(self, rows, imatrix):
        x, w = block32_weights(rows, imatrix)
        d, the_min, q = make_qkx(x, 15, w, -0.9, 0.05, 36, use_mad=False)
        return self._pack(d, -the_min, np.ascontiguousarray(q.T, dtype=np.uint8))

    @staticmethod
    def _pack(d, m, qt):
        out = np.empty((len(d), 20), np.uint8)
        out[:, :2] = fp16_bytes(d)
        out[:, 2:4] = fp16_bytes(m)
        put_rows(out[:, 4:], nibbles_t(qt))
        return out

    def dequantize_blocks(self, b):
        d, m = half_to_f32(b[:, :2]), half_to_f32(b[:, 2:4])
        qs = b[:, 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(F32)
        return d[:, None] * q + m[:, None]
