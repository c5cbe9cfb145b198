"""Q3_K: super-blocks of 256 = 16 sub-blocks of 16 with 6-bit signed scales (packed in 12 bytes),
3-bit quants (2 low bits in qs, the high bit in hmask) and an fp16 super-scale; 3.4375 bits per weight."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.kquants.kquant import SuperBlockFormat
from llmkit.quant.formats.numerics import F32, abs_max_signed, blocks_t, colsum, fp16_bytes, half_to_f32, nearest_int
from llmkit.quant.formats.packing import pack_2bit, unpack_2bit
from llmkit.quant.formats.search import (
    imatrix_weights_t, levels_to_blocks, make_q3_quants, make_qx_quants, superblock_sigma2)


class Q3_K(SuperBlockFormat):
    name = "Q3_K"
    weighted_kernel = "q3_k_w"
    half_fields = ((108, 110),)

    def quantize_blocks(self, x, qw=None):
        nb = len(x)
        xt = blocks_t(x.reshape(nb * 16, 16))  # (16, sub-blocks)
        if qw is None:
            scales, Lt = make_q3_quants(xt, 4, transposed=True)
            scales = scales.reshape(nb, 16)
            max_scale = abs_max_signed(scales)
            has = max_scale != 0
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                iscale = F32(-32) / max_scale
                ls = (np.clip(nearest_int(iscale[:, None] * scales).astype(np.int8), -32, 31) + 32).astype(np.int32)
                d = np.where(has, F32(1) / iscale, F32(0)).astype(F32)
            ls = np.where(has[:, None], ls, 0)
        else:
            wt = imatrix_weights_t(xt, blocks_t(qw.reshape(nb * 16, 16)), np.repeat(superblock_sigma2(x), 16))
            sw = colsum(wt).reshape(nb, 16)
            scales, Lt = make_qx_quants(xt, 4, 1, wt, transposed=True)
            d, ls = make_qx_quants(scales.reshape(nb, 16), 32, 1, sw)
        d16 = fp16_bytes(d)
        sc = ls.astype(np.int32) - 32  # what the 12 packed bytes decode to
        dq = (half_to_f32(d16)[:, None] * sc.astype(F32)).reshape(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            lt = xt / dq
            np.rint(lt, out=lt)
            np.clip(lt, -4, 3, out=lt)
            lt += F32(4)
        L = levels_to_blocks(Lt, lt, dq).reshape(nb, 256)
        out = np.empty((nb, 110), np.uint8)
        self.pack_levels(out, L)
        out[:, 96:108] = self._pack_scales(ls.astype(np.uint8))
        out[:, 108:110] = d16
        return out

    def pack_levels(self, out, L):
        """Levels 0..7: the low 2 bits in qs, bit 2 of weight 32k + l at bit k of hmask byte l."""
        high = L > 3
        hmask = np.bitwise_or.reduce(high.reshape(len(L), 8, 32).astype(np.uint8)
                                     << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
        out[:, 0:32] = hmask
        out[:, 32:96] = pack_2bit(np.where(high, L - 4, L))

    def unpack_levels(self, b):
        high = ((b[:, None, 0:32] >> np.arange(8)[None, :, None]) & 1).reshape(len(b), 256)
        return unpack_2bit(b[:, 32:96]).astype(np.int32) | (high.astype(np.int32) << 2)

    @staticmethod
    def _pack_scales(ls):
        s = np.zeros((len(ls), 12), np.uint8)
        s[:, 0:8] = ls[:, 0:8] & 0xF
        s[:, 0:8] |= (ls[:, 8:16] & 0xF) << 4
        for j in range(16):
            s[:, 8 + j % 4] |= (ls[:, j] >> 4) << (2 * (j // 4))
        return s

    @staticmethod
    def _unpack_scales(s):
        lo = np.concatenate([s[:, 0:8] & 0xF, s[:, 0:8] >> 4], axis=1).astype(np.int32)
        hi = np.stack([(s[:, 8 + j % 4] >> (2 * (j // 4))) & 3 for j in range(16)], axis=1).astype(np.int32)
        return (lo | (hi << 4)) - 32

    def dequantize_blocks(self, b):
        nb = len(b)
        q = (self.unpack_levels(b) - 4).reshape(nb, 16, 16).astype(F32)
        sc = self._unpack_scales(b[:, 96:108]).astype(F32)
        d = half_to_f32(b[:, 108:110])
        return (d[:, None, None] * sc[:, :, None] * q).reshape(nb, 256)
