"""IQ3_XXS: super-blocks of 256 weights (3.0625 bits per weight): an fp16 super-scale d, 64 bytes of
grid indices (a point of the 256-point grid per group of 4 weights), then per sub-block of 32 a
u32 holding four 7-bit sign masks (the 8th sign of each group of 8 makes the count of minus signs
even) and a 4-bit scale s: weights are d * (0.5 + s) * 0.5 * grid value * sign."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants import iq2grid, iq3grid
from llmkit.quant.formats.iquants.iq3 import GridFormat
from llmkit.quant.formats.iquants.lattice import sign_values
from llmkit.quant.formats.numerics import F32, half_to_f32


class IQ3_XXS(GridFormat):
    name = "IQ3_XXS"

    def dequantize_blocks(self, b):
        nb = len(b)
        d = half_to_f32(b[:, 0:2])
        aux = np.ascontiguousarray(b[:, 66:98]).view("<u4").reshape(nb, 8)
        db = d[:, None] * (F32(0.5) + (aux >> 28).astype(F32)) * F32(0.5)  # (nb, 8)
        grid = iq3grid.values(256)[b[:, 2:66]].reshape(nb, 8, 32).astype(F32)
        masks = ((aux[:, :, None] >> (7 * np.arange(4, dtype=np.uint32))) & 127).astype(np.uint8)
        sgn = sign_values(iq2grid.signs_table()[masks])  # (nb, 8, 32)
        return ((db[:, :, None] * grid) * sgn).reshape(nb, 256)
