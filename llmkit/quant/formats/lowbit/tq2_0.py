"""TQ2_0: ternary weights at 2.0625 bits: blocks of 256 = 64 bytes of four 2-bit trits, then the fp16
scale d = max|x|; a weight is (trit - 1) * d. Byte 32c+m holds weights 128c+m+32n at bits 2n."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.base import Format
from llmkit.quant.formats.numerics import F32, half_to_f32
from llmkit.quant.formats.lowbit.ternary import scale_and_trits


class TQ2_0(Format):
    name = "TQ2_0"
    half_fields = ((64, 66),)

    def quantize_blocks(self, x):
        nb = len(x)
        d16, t = scale_and_trits(x)
        t = t.reshape(nb, 2, 4, 32).astype(np.uint8)  # (block, chunk c, n, m)
        out = np.empty((nb, 66), np.uint8)
        out[:, :64] = (t[:, :, 0] | (t[:, :, 1] << 2) | (t[:, :, 2] << 4) | (t[:, :, 3] << 6)).reshape(nb, 64)
        out[:, 64:] = d16
        return out

    def dequantize_blocks(self, b):
        nb = len(b)
        d = half_to_f32(b[:, 64:66])
        q = b[:, :64].reshape(nb, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
        with np.errstate(invalid="ignore"):  # 0 * an infinite scale: NaN, as in C
            return ((q & 3).astype(np.int16) - 1).astype(F32).reshape(nb, 256) * d[:, None]
