"""IQ4_NL: blocks of 32 with one fp16 scale and 4-bit indices into the non-linear table of iq4.py
(4.5 bits per weight); the scale is iq4.py's search, weighted by x^2 or by the imatrix."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.base import ColumnWeighted
from llmkit.quant.formats.iquants.iq4 import block_scales, levels_bytes, table_values
from llmkit.quant.formats.numerics import F32, blocks_t, colsum, fp16_bytes, half_to_f32, safe_inv
from llmkit.quant.formats.search import imatrix_weights_t


class IQ4_NL(ColumnWeighted):
    name = "IQ4_NL"
    half_fields = ((0, 2),)

    def quantize_blocks(self, x, qw=None):
        xt = blocks_t(x)
        if qw is None:
            wt = xt * xt
        else:  # sigma2 = sum(x^2) * 2/32 per block
            wt = imatrix_weights_t(xt, blocks_t(qw), colsum(xt * xt) * F32(2 / 32))
        d = block_scales(xt, wt)
        out = np.empty((len(d), 18), np.uint8)
        out[:, :2] = fp16_bytes(d)
        out[:, 2:] = levels_bytes(xt, safe_inv(d))  # from the float scale, as ggml does
        return out

    def dequantize_blocks(self, b):
        d = half_to_f32(b[:, :2])
        return d[:, None] * table_values(b[:, 2:])
