"""Q4_K: super-blocks of 256 = 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min
(packed in 12 bytes), 4-bit quants, fp16 super-scales d and dmin; 4.5 bits per weight.
Levels: 4 groups of 64 weights, weight l of a group's first 32 in the low nibble of byte l,
of its second 32 in the high nibble. The scale search is kquant.py's."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.kquants.kquant import ScaleMinK


class Q4_K(ScaleMinK):
    name, nmax, ref_params = "Q4_K", 15, (-1.0, 0.1, 20)
    weighted_kernel = "q4_k_w"

    def pack_levels(self, out, L):
        q = L.reshape(len(L), 4, 2, 32)
        out[:, 16:] = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(len(L), 128)

    def unpack_levels(self, b):
        qs = b[:, 16:].reshape(len(b), 4, 32)
        return np.stack([qs & 0xF, qs >> 4], axis=2).reshape(len(b), 256)
