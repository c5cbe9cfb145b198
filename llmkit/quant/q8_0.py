"""Q8_0: blocks of 32 weights = fp16 scale d + 32 int8; d = max|x| / 127, q = roundf(x / d)."""

from __future__ import annotations

import numpy as np

from llmkit.quant.base import F32, Format, row_abs_max, fp16_bytes, half_to_f32, safe_inv


_JUST_BELOW_HALF = np.nextafter(F32(0.5), F32(0))


class Q8_0(Format):
    name, type_id, block, type_size = "Q8_0", 8, 32, 34
    half_fields = ((0, 2),)

    def quantize_blocks(self, x):
        amax = row_abs_max(x)
        d = amax / F32(127)
        v = x * safe_inv(d)[:, None]
        # roundf (half away from zero): add the largest float32 below 0.5 with v's sign, truncate
        v += np.copysign(_JUST_BELOW_HALF, v)
        q = v.astype(np.int8)
        out = np.empty((len(x), 34), np.uint8)
        out[:, :2] = fp16_bytes(d)
        out[:, 2:] = q.view(np.uint8)
        return out

    def dequantize_blocks(self, b):
        d = half_to_f32(b[:, :2])
        return d[:, None] * b[:, 2:].view(np.int8).astype(F32)
