"""Q8_0: blocks of 32 weights = fp16 scale d + 32 int8; d = max|x| / 127, q = roundf(x / d)."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.base import Format
from llmkit.quant.formats.numerics import F32, abs_max_t, blocks_t, fp16_bytes, half_to_f32, put_rows, safe_inv


_JUST_BELOW_HALF = np.nextafter(F32(0.5), F32(0))


class Q8_0(Format):
    name = "Q8_0"
    half_fields = ((0, 2),)
    nan_reaches_scale = True

    def quantize_blocks(self, x):
        xt = blocks_t(x)  # (32, n_blocks)
        d = abs_max_t(xt) / F32(127)
        xt *= safe_inv(d)
        # roundf (half away from zero): add the largest float32 below 0.5 with v's sign, truncate
        xt += np.copysign(_JUST_BELOW_HALF, xt)
        out = np.empty((len(d), 34), np.uint8)
        out[:, :2] = fp16_bytes(d)
        put_rows(out[:, 2:], xt.astype(np.int8).view(np.uint8).T)
        return out

    def dequantize_blocks(self, b):
        d = half_to_f32(b[:, :2])
        return d[:, None] * b[:, 2:].view(np.int8).astype(F32)
