"""F32, F16 and BF16: plain conversions (BF16 rounds to nearest even; NaN keeps a quiet bit)."""

from __future__ import annotations

import numpy as np

from llmkit.errors import BadInput
from llmkit.quant.base import F32, Format


class F32Format(Format):
    name, type_id, block, type_size = "F32", 0, 1, 4
    nan_reaches_scale = True  # every value is its own output

    def check(self, out, name):
        if not np.isfinite(np.ascontiguousarray(out).reshape(-1).view("<f4")).all():
            raise BadInput(f"tensor '{name}' holds NaN/Inf values; llama.cpp refuses them too.")

    def quantize_blocks(self, x):
        return x.astype("<f4").view(np.uint8).reshape(-1, 4)

    def dequantize_blocks(self, b):
        return np.ascontiguousarray(b).view("<f4").reshape(-1).astype(F32)


class F16Format(Format):
    name, type_id, block, type_size = "F16", 1, 1, 2
    nan_reaches_scale = True  # every value is its own output
    half_fields = ((0, 2),)

    def quantize_blocks(self, x):
        return x.astype("<f2").view(np.uint8).reshape(-1, 2)

    def dequantize_blocks(self, b):
        return np.ascontiguousarray(b).view("<f2").reshape(-1).astype(F32)


class BF16Format(Format):
    name, type_id, block, type_size = "BF16", 30, 1, 2
    nan_reaches_scale = True  # every value is its own output

    def check(self, out, name):
        h = np.ascontiguousarray(out).reshape(-1).view("<u2")
        if ((h & 0x7FFF) >= 0x7F80).any():
            raise BadInput(f"tensor '{name}': a BF16 value is infinite or NaN; llama.cpp refuses this too.")

    def quantize_blocks(self, x):
        u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).reshape(-1)
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        rounded = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        h = np.where(nan, ((u >> 16) | 64).astype(np.uint16), rounded)
        return h.astype("<u2").view(np.uint8).reshape(-1, 2)

    def dequantize_blocks(self, b):
        h = np.ascontiguousarray(b).view("<u2").reshape(-1).astype(np.uint32) << 16
        return h.view(F32)
