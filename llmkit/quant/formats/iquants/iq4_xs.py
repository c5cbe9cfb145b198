"""IQ4_XS: super-blocks of 256 = 8 sub-blocks of 32, each with a 6-bit scale relative to an fp16
super-scale, and 4-bit indices into iq4.py's non-linear table (4.25 bits per weight)."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants.iq4 import block_scales, levels_bytes, table_values
from llmkit.quant.formats.kquants.kquant import SuperBlockFormat
from llmkit.quant.formats.numerics import F32, abs_max_signed, blocks_t, colsum, fp16_bytes, half_to_f32, safe_inv
from llmkit.quant.formats.search import imatrix_weights_t


class IQ4_XS(SuperBlockFormat):
    name = "IQ4_XS"
    half_fields = ((0, 2),)

    def quantize_blocks(self, x, qw=None):
        nb = len(x)
        xt = blocks_t(x.reshape(nb * 8, 32))  # (32, sub-blocks)
        if qw is None:
            wt = xt * xt
        else:  # sigma2 = sum(x^2) * 2/256 per super-block
            sigma2 = np.repeat(colsum(blocks_t(x) ** 2) * F32(2 / 256), 8)
            wt = imatrix_weights_t(xt, blocks_t(qw.reshape(nb * 8, 32)), sigma2)
        scales = block_scales(xt, wt)
        with np.errstate(divide="ignore", invalid="ignore"):
            d = -abs_max_signed(scales.reshape(nb, 8)) / F32(32)
            ls = np.clip(np.rint(safe_inv(d)[:, None] * scales.reshape(nb, 8)), -32, 31)
            dl = (d[:, None] * ls).reshape(-1)  # the float super-scale, not its fp16 rounding
        codes = (ls + 32).astype(np.uint8)  # (nb, 8) 6-bit
        out = np.empty((nb, 136), np.uint8)
        out[:, 0:2] = fp16_bytes(d)
        h = (codes >> 4).astype(np.uint16) << (2 * np.arange(8, dtype=np.uint16))
        out[:, 2:4] = np.bitwise_or.reduce(h, axis=1).astype("<u2").view(np.uint8).reshape(nb, 2)
        lo = codes & 0xF
        out[:, 4:8] = lo[:, 0::2] | (lo[:, 1::2] << 4)
        out[:, 8:] = levels_bytes(xt, safe_inv(dl)).reshape(nb, 128)
        return out

    def dequantize_blocks(self, b):
        nb = len(b)
        d = half_to_f32(b[:, 0:2])
        sh = np.ascontiguousarray(b[:, 2:4]).view("<u2").reshape(nb)
        sl = b[:, 4:8]
        lo = np.stack([sl & 0xF, sl >> 4], axis=2).reshape(nb, 8).astype(np.int32)
        hi = ((sh[:, None] >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.int32)
        dl = d[:, None] * ((lo | (hi << 4)) - 32).astype(F32)  # (nb, 8)
        levels = table_values(b[:, 8:].reshape(nb * 8, 16)).reshape(nb, 8, 32)
        return (dl[:, :, None] * levels).reshape(nb, 256)
