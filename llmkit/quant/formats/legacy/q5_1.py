"""Q5_1: blocks of 32 = fp16 d, fp16 min + 32 high bits + 4-bit low parts; d = (max - min) / 31,
q = trunc((x - m)/d + 0.5) with no clamp, as in ggml (block32.py)."""

from llmkit.quant.formats.legacy.block32 import WithMin32


class Q5_1(WithMin32):
    name, nmax, qh_at, qs_at = "Q5_1", 31, 4, 8
    clamp = False  # ggml's Q5_1 does not clamp
