"""IQ3_S: super-blocks of 256 weights (3.4375 bits per weight): an fp16 super-scale d, per group of
4 weights a 9-bit index into the 512-point grid (64 low bytes, 8 bytes of 9th bits), 32 bytes of
sign bits (one per weight) and a 4-bit scale s per sub-block of 32: weights are
d * (1 + 2s) * grid value * sign."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants import iq3grid
from llmkit.quant.formats.iquants.iq3 import GridFormat
from llmkit.quant.formats.iquants.lattice import nibbles, sign_values
from llmkit.quant.formats.numerics import F32, half_to_f32


class IQ3_S(GridFormat):
    name = "IQ3_S"

    def dequantize_blocks(self, b):
        nb = len(b)
        d = half_to_f32(b[:, 0:2])
        s = nibbles(b[:, 106:110]).astype(np.int32)
        db = d[:, None] * (1 + 2 * s).astype(F32)  # (nb, 8)
        hi = np.unpackbits(b[:, 66:74, None], axis=2, bitorder="little").reshape(nb, 64).astype(np.int64)
        idx = b[:, 2:66].astype(np.int64) | (hi << 8)
        grid = iq3grid.values(512)[idx].reshape(nb, 8, 32).astype(F32)
        sgn = sign_values(b[:, 74:106]).reshape(nb, 8, 32)
        return ((db[:, :, None] * grid) * sgn).reshape(nb, 256)
