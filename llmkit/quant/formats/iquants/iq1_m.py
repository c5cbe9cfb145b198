"""IQ1_M: super-blocks of 256 weights (1.75 bits per weight): 32 bytes of low grid-index bits, per
sub-block of 16 a byte of two 4-bit fields (3 high index bits and the sign of the shift of each
group of 8), and 8 bytes of 3-bit sub-block scales s whose four top nibbles hold the fp16
super-scale d: weights are d * (2s + 1) * (grid value +- 1/8)."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants import iq2grid
from llmkit.quant.formats.iquants.iq1 import TernaryGridFormat
from llmkit.quant.formats.numerics import F32


class IQ1_M(TernaryGridFormat):
    name = "IQ1_M"
    half_fields = ()  # the super-scale is spread over 4 nibbles; checked in `check`

    def super_scale_bits(self, b: np.ndarray) -> np.ndarray:
        """The fp16 bit pattern of each block's super-scale, gathered from the scales' top nibbles."""
        sc = np.ascontiguousarray(b[:, 48:56]).view("<u2").reshape(len(b), 4)
        return (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)

    def check(self, out, name):
        from llmkit.errors import BadInput

        if ((self.super_scale_bits(out.reshape(-1, self.type_size)) & 0x7C00) == 0x7C00).any():
            raise BadInput(f"tensor '{name}': quantizing to {self.name} gives a block scale beyond fp16's range "
                           f"(|x| > 65504); llama.cpp refuses this too. Use F32/BF16 for this model or rescale it.")

    def dequantize_blocks(self, b):
        nb = len(b)
        d = self.super_scale_bits(b).astype(np.uint16).view(np.float16).astype(F32)
        sc = np.ascontiguousarray(b[:, 48:56]).view("<u2").reshape(nb, 4).astype(np.int64)
        s = ((sc[:, :, None] >> (3 * np.arange(4))) & 7).reshape(nb, 16)
        dl = d[:, None] * (2 * s + 1).astype(F32)  # (nb, 16)
        qh = b[:, 32:48].astype(np.int64)
        nib = np.stack([qh & 0xF, qh >> 4], axis=2)  # (nb, 16, 2): per group of 8
        delta = np.where(nib & 8, F32(-0.125), F32(0.125))
        idx = b[:, 0:32].reshape(nb, 16, 2).astype(np.int64) | ((nib & 7) << 8)
        grid = iq2grid.values(2048)[idx].astype(F32)  # (nb, 16, 2, 8)
        return (dl[:, :, None, None] * (grid + delta[..., None])).reshape(nb, 256)
