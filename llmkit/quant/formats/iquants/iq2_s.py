"""IQ2_S: super-blocks of 256 weights (2.5625 bits per weight): an fp16 super-scale d, 32 low index
bytes and 32 sign bytes (per group of 8), 8 bytes holding the 2 high bits of each 10-bit index into
the 1024-point grid, then 8 bytes of 4-bit scales, one per sub-block of 16. ggml can quantize it
without an imatrix (weights sigma2/4 + x^2), llama.cpp's file types only with one."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants import iq2grid
from llmkit.quant.formats.iquants.iq2 import IQ2Format, sub_scales
from llmkit.quant.formats.iquants.lattice import nibbles, sign_values
from llmkit.quant.formats.numerics import F32, half_to_f32


class IQ2_S(IQ2Format):
    name = "IQ2_S"
    needs_imatrix = False

    def dequantize_blocks(self, b):
        nb = len(b)
        d = half_to_f32(b[:, 0:2])
        hi = (b[:, 66:74, None] >> (2 * np.arange(4, dtype=np.uint8))) & 3  # (nb, 8, 4)
        idx = b[:, 2:34].astype(np.int64) | (hi.reshape(nb, 32).astype(np.int64) << 8)
        db = sub_scales(d, nibbles(b[:, 74:82]))  # (nb, 16)
        grid = iq2grid.values(1024)[idx].reshape(nb, 16, 16).astype(F32)
        sgn = sign_values(b[:, 34:66]).reshape(nb, 16, 16)
        return ((db[:, :, None] * grid) * sgn).reshape(nb, 256)
