"""Q5_K: like Q4_K with 5-bit quants; 5.5 bits per weight. The low 4 bits as Q4_K's, the fifth bit
of weight l of group g's first (second) 32 at bit 2g (2g + 1) of qh byte l."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.kquants.kquant import ScaleMinK


class Q5_K(ScaleMinK):
    name, nmax, ref_params = "Q5_K", 31, (-0.5, 0.1, 15)
    weighted_kernel = "q5_k_w"

    def pack_levels(self, out, L):
        nb = len(L)
        q = L.reshape(nb, 4, 2, 32)
        hi = (q >> 4) & 1
        shifts = (2 * np.arange(4, dtype=np.uint8))[None, :, None]
        qh = ((hi[:, :, 0] << shifts) | (hi[:, :, 1] << (shifts + 1))).astype(np.uint8)
        out[:, 16:48] = np.bitwise_or.reduce(qh, axis=1)  # (nb, 32)
        out[:, 48:] = ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(nb, 128)

    def unpack_levels(self, b):
        nb = len(b)
        qh, qs = b[:, 16:48], b[:, 48:].reshape(nb, 4, 32)
        k = np.arange(4)[None, :, None]
        lo = (qs & 0xF) | (((qh[:, None, :] >> (2 * k)) & 1) << 4)
        hi = (qs >> 4) | (((qh[:, None, :] >> (2 * k + 1)) & 1) << 4)
        return np.stack([lo, hi], axis=2).reshape(nb, 256)
