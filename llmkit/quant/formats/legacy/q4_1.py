"""Q4_1: blocks of 32 = fp16 d, fp16 min m + 4-bit q; d = (max - min) / 15,
q = min(15, trunc((x - m)/d + 0.5)) (block32.py)."""

from llmkit.quant.formats.legacy.block32 import WithMin32


class Q4_1(WithMin32):
    name, nmax, qs_at = "Q4_1", 15, 4
