"""What TQ1_0 and TQ2_0 share (ggml's ternary types for BitNet b1.58 / TriLM models): one fp16 scale
d = max|x| per 256-weight block and a trit per weight, lroundf(x / d) + 1 in {0, 1, 2}.

    >>> trits(np.array([[-1.0, -0.5, -0.49, 0.0, 0.5, 1.0]], np.float32))[0].tolist()
    [0, 0, 1, 1, 2, 2]
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.numerics import F32, fp16_bytes, safe_inv


def scale_and_trits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n_blocks, 256) float32 -> the fp16 bytes of d = max|x| (n_blocks, 2) and the trits (n_blocks, 256)."""
    d = np.abs(x).max(axis=1)  # C: amax = MAX(amax, fabsf(v)) from 0 (finite input: the plain max)
    with np.errstate(over="ignore", invalid="ignore"):
        v = x * safe_inv(d)[:, None]  # x * id in float32, id = 1.0f/d (the float d, not its fp16 rounding)
    return fp16_bytes(d), trits(v)


def trits(v: np.ndarray) -> np.ndarray:
    """lroundf(v) + 1 for |v| <= 1 (x * id never exceeds 1 by more than a rounding): 0, 1 or 2 as
    uint16. A non-finite v (d so small that 1/d overflows) gives lroundf's LONG_MIN, whose low bits
    plus one are 1 in C's int: the trit of 0."""
    t = 1 + (v >= F32(0.5)).astype(np.uint16) - (v <= F32(-0.5)).astype(np.uint16)
    t[~np.isfinite(v)] = 1
    return t


def powers_of_3(n: int) -> np.ndarray:
    """3^(n-1), ..., 3, 1: the place values of n trits, most significant first."""
    return 3 ** np.arange(n - 1, -1, -1, dtype=np.uint16)
