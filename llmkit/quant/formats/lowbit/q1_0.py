"""Q1_0: one sign bit per weight at 1.125 bits: blocks of 128 = fp16 d + 16 bytes of bits; d is the
mean |x| of the block (summed in order), bit j%8 of byte j/8 is set where x_j >= 0, and a weight
decodes to +d or -d. No imatrix path (ggml quantizes every row the same way with or without one).

    >>> b = Q1_0().quantize_blocks(np.r_[np.full(64, 2.0), np.full(64, -1.0)].astype(np.float32)[None])
    >>> Q1_0().dequantize_blocks(b)[0, [0, 127]].tolist()
    [1.5, -1.5]
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.base import Format
from llmkit.quant.formats.numerics import F32, fp16_bytes, half_to_f32, seq_sum


class Q1_0(Format):
    name = "Q1_0"
    half_fields = ((0, 2),)
    nan_reaches_scale = True  # a NaN/Inf weight makes the block's mean |x| NaN/Inf

    def quantize_blocks(self, x):
        nb = len(x)
        with np.errstate(over="ignore", invalid="ignore"):
            d = seq_sum(np.abs(x)) / F32(128)
        out = np.empty((nb, 18), np.uint8)
        out[:, :2] = fp16_bytes(d)
        out[:, 2:] = np.packbits(x >= F32(0), axis=1, bitorder="little")
        return out

    def dequantize_blocks(self, b):
        d = half_to_f32(b[:, :2])
        bits = np.unpackbits(b[:, 2:], axis=1, bitorder="little").astype(bool)
        return np.where(bits, d[:, None], -d[:, None])

    def unpack_levels(self, b):
        return np.unpackbits(b[:, 2:], axis=1, bitorder="little")

    def pack_levels(self, out, L):
        out[:, 2:] = np.packbits(np.asarray(L, np.uint8) & 1, axis=1, bitorder="little")
