"""Q4_0: blocks of 32 = fp16 d + 16 bytes of 4-bit q; d = m / -8 where m is the signed value of
largest magnitude, q = min(15, trunc(x/d + 8.5)), weights j and j+16 share a byte (block32.py)."""

from llmkit.quant.formats.legacy.block32 import Symmetric32


class Q4_0(Symmetric32):
    name, nmax, qs_at = "Q4_0", 8, 2
