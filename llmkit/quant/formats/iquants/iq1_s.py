"""IQ1_S: super-blocks of 256 weights (1.5625 bits per weight): an fp16 super-scale d, 32 bytes of
low grid-index bits, then per sub-block of 32 a u16: 4 x 3 high index bits, a 3-bit scale s
(bits 12-14) and the shift's sign (bit 15): weights are d * (2s + 1) * (grid value +- 1/8)."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants import iq2grid
from llmkit.quant.formats.iquants.iq1 import TernaryGridFormat
from llmkit.quant.formats.numerics import F32, half_to_f32


class IQ1_S(TernaryGridFormat):
    name = "IQ1_S"

    def dequantize_blocks(self, b):
        nb = len(b)
        d = half_to_f32(b[:, 0:2])
        qh = np.ascontiguousarray(b[:, 34:50]).view("<u2").reshape(nb, 8).astype(np.int64)
        dl = d[:, None] * (2 * ((qh >> 12) & 7) + 1).astype(F32)  # (nb, 8)
        delta = np.where(qh & 0x8000, F32(-0.125), F32(0.125))
        hi = (qh[:, :, None] >> (3 * np.arange(4))) & 7  # (nb, 8, 4)
        idx = b[:, 2:34].reshape(nb, 8, 4).astype(np.int64) | (hi << 8)
        grid = iq2grid.values(2048)[idx].astype(F32)  # (nb, 8, 4, 8)
        return (dl[:, :, None, None] * (grid + delta[:, :, None, None])).reshape(nb, 256)
