"""Q5_0: blocks of 32 = fp16 d + 32 high bits (uint32) + 4-bit low parts; d = m / -16,
q = min(31, trunc(x/d + 16.5)) (block32.py)."""

from llmkit.quant.formats.legacy.block32 import Symmetric32


class Q5_0(Symmetric32):
    name, nmax, qh_at, qs_at = "Q5_0", 16, 2, 6
