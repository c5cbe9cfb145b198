"""MXFP4 (OCP microscaling FP4): blocks of 32 = one E8M0 exponent byte e, then 16 bytes of 4-bit
E2M1 codes (weight j in the low nibble of byte j, weight 16+j in the high one). A weight is
E2M1(code) * 2^(e-127); ggml stores the E2M1 values doubled (integers) and halves the scale.

e = floor(log2 max|x|) - 2 + 127 (0 for an all-zero block), and each weight takes the code whose
value is nearest (the first such code on a tie).

    >>> E2M1_DOUBLED.tolist()
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
"""

from __future__ import annotations

import numpy as np

from llmkit.errors import BadInput, MissingDependency
from llmkit.quant.formats.base import Format
from llmkit.quant.formats.jit import DEFAULT, Kernels, load_kernels
from llmkit.quant.formats.numerics import F32


def _e2m1_doubled() -> np.ndarray:
    """Twice the value of each 4-bit E2M1 code: sign bit, 2 exponent bits (bias 1), 1 mantissa bit."""
    c = np.arange(16)
    sign, exp, man = c >> 3, (c >> 1) & 3, c & 1
    value = np.where(exp == 0, man * 0.5, 2.0 ** (exp - 1) * (1 + man * 0.5))
    return (np.where(sign == 1, -1, 1) * 2 * value).astype(np.int8)


E2M1_DOUBLED = _e2m1_doubled()
_TABLE = E2M1_DOUBLED.astype(F32)
_MAGNITUDES = _TABLE[:8]  # codes 0..7: 0, 1, 2, 3, 4, 6, 8, 12
# n = 0..12 -> the code of the largest magnitude <= n
_BELOW = (np.searchsorted(E2M1_DOUBLED[:8], np.arange(13), side="right") - 1).astype(np.uint8)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """2^(e-128) as float32 from its bits (ggml_e8m0_to_fp32_half): e < 2 are the subnormals."""
    e = np.asarray(e, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
    return bits.view(F32)


def exponents(amax: np.ndarray) -> np.ndarray:
    """(uint8)(floorf(log2f(amax)) - 2 + 127), 0 where amax is 0. log2f is taken in float64 and
    rounded to float32 (so just below a power of two it rounds up as log2f does); below 2^-125 the
    value is negative and the C cast keeps its low byte (x86: truncate to int32)."""
    with np.errstate(divide="ignore"):
        lg = np.log2(amax.astype(np.float64)).astype(F32)
    v = np.floor(lg) - F32(2) + F32(127)
    v = np.where(amax > 0, v, F32(0))
    return (v.astype(np.int32) & 0xFF).astype(np.uint8)


def nearest_codes(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """best_index_mxfp4 of every x (float32, any shape) with the power-of-two scale d (broadcast): the
    first code with the smallest |value * d - x|. By symmetry the scan over |x| and the 8 magnitudes
    gives the code, its sign taken from x (a negative value never beats code 0's error |x|); the errors
    fall then rise along the magnitudes, so only the two around |x| / d compete, the lower on a tie."""
    a = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore"):
        r = a / d  # exact: d is a power of two
        lo = _BELOW[np.minimum(r, F32(12)).astype(np.int32)]  # the largest magnitude <= r
        hi = np.minimum(lo + 1, 7)
        err_lo = np.abs(_MAGNITUDES[lo] * d - a)
        err_hi = np.abs(_MAGNITUDES[hi] * d - a)
    best = lo + ((hi > lo) & (err_hi < err_lo)).astype(np.uint8)
    best[(x < 0) & (best > 0)] += 8
    return best


_KERNEL = None


def kernel(kernels: Kernels = DEFAULT):
    """The compiled quantizer (_kernels_fp4.mxfp4), or None where numba is missing or switched off
    (LLMKIT_NO_JIT) or the run (`kernels`) leaves it out."""
    global _KERNEL
    if not kernels.on():  # available() also points numba's cache at llmkit's
        return None
    if _KERNEL is None:
        try:
            _KERNEL = load_kernels("lowbit._kernels_fp4").mxfp4
        except MissingDependency:
            _KERNEL = False
    return _KERNEL or None


class MXFP4(Format):
    name = "MXFP4"

    def compiled(self, kernels: Kernels = DEFAULT, weighted: bool = False) -> bool:
        return kernel(kernels) is not None

    def quantize(self, rows, imatrix=None, kernels: Kernels = DEFAULT):
        """As Format.quantize (MXFP4 takes no imatrix), with this module's own kernel."""
        k = kernel(kernels)
        if k is None:
            return super().quantize(rows, None, kernels)
        n_rows, n = rows.shape
        if n % 32:
            raise BadInput(f"MXFP4 needs rows of a multiple of 32 weights, got {n}.")
        x = np.ascontiguousarray(rows, dtype=F32).reshape(-1, 32)
        out = np.empty((len(x), 17), np.uint8)
        k(x, out, _TABLE)
        return out.reshape(n_rows, self.row_bytes(n))

    def quantize_blocks(self, x):
        nb = len(x)
        e = exponents(np.abs(x).max(axis=1))
        d = e8m0_half(e)
        q = nearest_codes(x, d[:, None])
        out = np.empty((nb, 17), np.uint8)
        out[:, 0] = e
        out[:, 1:] = q[:, :16] | (q[:, 16:] << 4)
        return out

    def dequantize_blocks(self, b):
        d = e8m0_half(b[:, 0])
        q = b[:, 1:]
        return np.concatenate([_TABLE[q & 0xF], _TABLE[q >> 4]], axis=1) * d[:, None]
