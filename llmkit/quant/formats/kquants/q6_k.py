"""Q6_K: super-blocks of 256 = 16 sub-blocks of 16 with int8 scales, 6-bit quants (4 low bits
in ql, 2 high bits in qh) and an fp16 super-scale d; 6.5625 bits per weight."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.kquants.kquant import SuperBlockFormat
from llmkit.quant.formats.numerics import F32, blocks_t, fp16_bytes, half_to_f32, nearest_int
from llmkit.quant.formats.search import GROUP_MAX_EPS, levels_to_blocks, make_qx_quants


class Q6_K(SuperBlockFormat):
    name = "Q6_K"
    weighted_kernel = "q6_k_w"
    half_fields = ((208, 210),)

    def quantize_blocks(self, x, qw=None):
        nb = len(x)
        xt = blocks_t(x.reshape(nb * 16, 16))  # (16, sub-blocks): the searches and requantization run here
        scales, Lt = make_qx_quants(xt, 32, 1, None if qw is None else blocks_t(qw.reshape(nb * 16, 16)),
                                    transposed=True)
        scales = scales.reshape(nb, 16)
        idx = np.abs(scales).argmax(axis=1)  # first of the largest |scale|, like the C loop's '>'
        max_scale = scales[np.arange(nb), idx]
        empty = np.abs(max_scale) < GROUP_MAX_EPS
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            iscale = F32(-128) / max_scale
            d16 = fp16_bytes(F32(1) / iscale)
            sc = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)
            dq = (half_to_f32(d16)[:, None] * sc.astype(F32)).reshape(-1)  # per sub-block
            lt = np.rint(xt / dq)
            np.clip(lt, -32, 31, out=lt)
            lt += F32(32)
        L = levels_to_blocks(Lt, lt, dq).reshape(nb, 256)
        out = np.zeros((nb, 210), np.uint8)
        self.pack_levels(out, L)
        out[:, 192:208] = sc.view(np.uint8)
        out[:, 208:210] = d16
        out[empty] = 0
        return out

    def dequantize_blocks(self, b):
        nb = len(b)
        sc = b[:, 192:208].view(np.int8).astype(F32)
        d = half_to_f32(b[:, 208:210])
        q = (self.unpack_levels(b) - 32).reshape(nb, 16, 16).astype(F32)
        return (d[:, None, None] * sc[:, :, None] * q).reshape(nb, 256)

    def pack_levels(self, out, L):
        """Levels 0..63 in halves of 128 weights, quarter k = weights k*32..k*32+31: the low 4 bits of
        quarters 0 and 2 (1 and 3) share the first (second) 32 bytes of ql, the high 2 bits go to qh."""
        nb = len(L)
        q = L.reshape(nb, 2, 4, 32)
        ql = np.concatenate([(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4),
                             (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)], axis=2)  # (nb, 2, 64)
        qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
        out[:, 0:128] = ql.reshape(nb, 128)
        out[:, 128:192] = qh.reshape(nb, 64)

    def unpack_levels(self, b):
        nb = len(b)
        ql = b[:, 0:128].reshape(nb, 2, 64)
        qh = b[:, 128:192].reshape(nb, 2, 32)
        q = np.empty((nb, 2, 4, 32), np.int32)
        q[:, :, 0] = (ql[:, :, :32] & 0xF) | (((qh >> 0) & 3) << 4)
        q[:, :, 1] = (ql[:, :, 32:] & 0xF) | (((qh >> 2) & 3) << 4)
        q[:, :, 2] = (ql[:, :, :32] >> 4) | (((qh >> 4) & 3) << 4)
        q[:, :, 3] = (ql[:, :, 32:] >> 4) | (((qh >> 6) & 3) << 4)
        return q.reshape(nb, 256)
