"""IQ2_XS: super-blocks of 256 weights (2.3125 bits per weight): an fp16 super-scale d, 32 u16 (per
group of 8: a 9-bit index into the 512-point grid and a 7-bit sign mask, the 8th sign making the
count of minus signs even), then 8 bytes of 4-bit scales, one per sub-block of 16. Needs an imatrix."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants import iq2grid
from llmkit.quant.formats.iquants.iq2 import IQ2Format, sub_scales
from llmkit.quant.formats.iquants.lattice import nibbles, sign_values
from llmkit.quant.formats.numerics import F32, half_to_f32


class IQ2_XS(IQ2Format):
    name = "IQ2_XS"

    def dequantize_blocks(self, b):
        nb = len(b)
        d = half_to_f32(b[:, 0:2])
        qs = np.ascontiguousarray(b[:, 2:66]).view("<u2").reshape(nb, 32)
        db = sub_scales(d, nibbles(b[:, 66:74]))  # (nb, 16)
        grid = iq2grid.values(512)[qs & 511].reshape(nb, 16, 16).astype(F32)
        sgn = sign_values(iq2grid.signs_table()[qs >> 9]).reshape(nb, 16, 16)
        return ((db[:, :, None] * grid) * sgn).reshape(nb, 256)
