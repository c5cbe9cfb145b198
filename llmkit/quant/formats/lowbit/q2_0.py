"""Q2_0: 2 bits per weight in groups of 64: blocks = fp16 d + 16 bytes of levels; d = max|x|, a
weight's level is roundf(x / d) + 1 in {0, 1, 2} (3 is never reached) and decodes to (level - 1) * d;
weight j sits at bits 2(j%4) of byte j/4. No imatrix path (ggml ignores one for this type).

    >>> b = Q2_0().quantize_blocks(np.linspace(-2, 2, 64, dtype=np.float32)[None])
    >>> sorted(set(Q2_0().dequantize_blocks(b)[0].tolist()))
    [-2.0, 0.0, 2.0]
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.base import Format
from llmkit.quant.formats.numerics import F32, abs_max_t, blocks_t, fp16_bytes, half_to_f32, safe_inv
from llmkit.quant.formats.lowbit.ternary import trits


class Q2_0(Format):
    name = "Q2_0"
    half_fields = ((0, 2),)

    def quantize_blocks(self, x):
        d = abs_max_t(blocks_t(x))
        nan = np.isnan(d)
        if nan.any():  # C: amax from 0, `if (a > amax) amax = a`: a NaN weight never becomes the max
            d[nan] = np.fmax.reduce(np.abs(x[nan]), axis=1, initial=F32(0))
        with np.errstate(over="ignore", invalid="ignore"):
            v = x * safe_inv(d)[:, None]
        q = trits(v)  # roundf(v) + 1 for |v| <= 1; the same as lroundf's trits of TQ2_0 ...
        q[~np.isfinite(v)] = 0  # ... except a non-finite v: (int)roundf gives INT_MIN, clamped to 0
        out = np.empty((len(x), 18), np.uint8)
        out[:, :2] = fp16_bytes(d)
        self.pack_levels(out, q)
        return out

    def dequantize_blocks(self, b):
        d = half_to_f32(b[:, :2])
        with np.errstate(invalid="ignore"):  # 0 * an infinite scale: NaN, as in C
            return (self.unpack_levels(b).astype(np.int16) - 1).astype(F32) * d[:, None]

    def unpack_levels(self, b):
        return (b[:, 2:, None] >> np.array([0, 2, 4, 6], np.uint8)).reshape(len(b), 64) & 3

    def pack_levels(self, out, L):
        q = np.asarray(L, np.uint8).reshape(len(out), 16, 4)
        out[:, 2:] = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
