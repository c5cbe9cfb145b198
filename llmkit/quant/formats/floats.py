"""F32, F16 and BF16: plain conversions (BF16 rounds to nearest even; NaN keeps a quiet bit)."""

from __future__ import annotations

import numpy as np

from llmkit.errors import BadInput
from llmkit.quant.formats.base import Format
from llmkit.quant.formats.numerics import F32


class _IEEE(Format):
    """A plain IEEE float type: every value is its own output, converted by numpy (round to nearest even)."""

    dtype = "<f4"
    nan_reaches_scale = True

    def quantize_blocks(self, x):
        return x.astype(self.dtype).view(np.uint8).reshape(-1, self.type_size)

    def dequantize_blocks(self, b):
        return np.ascontiguousarray(b).view(self.dtype).reshape(-1).astype(F32)


class F32Format(_IEEE):
    name, dtype = "F32", "<f4"

    def check(self, out, name):
        if not np.isfinite(np.ascontiguousarray(out).reshape(-1).view("<f4")).all():
            raise BadInput(f"tensor '{name}' holds NaN/Inf values; llama.cpp refuses them too.")


class F16Format(_IEEE):
    name, dtype = "F16", "<f2"
    half_fields = ((0, 2),)


class BF16Format(Format):
    name = "BF16"
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
