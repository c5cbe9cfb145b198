"""IQ2_XXS: super-blocks of 256 weights (2.0625 bits per weight): an fp16 super-scale d, then per
sub-block of 32 two u32: four bytes indexing the 256-point grid (one point per group of 8) and a
u32 of four 7-bit sign masks (the 8th sign makes the count of minus signs even) with a 4-bit scale
in its top bits. Needs an imatrix."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants import iq2grid
from llmkit.quant.formats.iquants.iq2 import IQ2Format, sub_scales
from llmkit.quant.formats.iquants.lattice import sign_values
from llmkit.quant.formats.numerics import F32, half_to_f32


class IQ2_XXS(IQ2Format):
    name = "IQ2_XXS"

    def dequantize_blocks(self, b):
        nb = len(b)
        d = half_to_f32(b[:, 0:2])
        q = np.ascontiguousarray(b[:, 2:66]).reshape(nb, 8, 8)
        aux = np.ascontiguousarray(q[:, :, 4:]).view("<u4").reshape(nb, 8)
        db = sub_scales(d, aux >> 28)  # (nb, 8)
        grid = iq2grid.values(256)[q[:, :, :4]].reshape(nb, 8, 32).astype(F32)
        masks = ((aux[:, :, None] >> (7 * np.arange(4, dtype=np.uint32))) & 127).astype(np.uint8)
        sgn = sign_values(iq2grid.signs_table()[masks])  # (nb, 8, 32)
        return ((db[:, :, None] * grid) * sgn).reshape(nb, 256)
