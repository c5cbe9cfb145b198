"""numba kernel of MXFP4's quantizer (quantize_row_mxfp4_ref, loop for loop; jit.py's rules: float32
throughout, no fastmath). Takes x (n_blocks, 32) float32 and fills out (n_blocks, 17) uint8; the
same bytes as mxfp4.py's numpy path. Imported only through mxfp4.kernel()."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

F = np.float32
ZERO = F(0.0)
OPTS = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")


@njit(inline="always", **OPTS)
def _best(v, d, table):
    """best_index_mxfp4: the first code with the smallest |value * d - v|."""
    best = 0
    best_err = abs(table[0] * d - v)
    for k in range(1, 16):
        err = abs(table[k] * d - v)
        if err < best_err:
            best = k
            best_err = err
    return best


@njit(**OPTS)
def mxfp4(x, out, table):
    for i in range(x.shape[0]):
        amax = ZERO
        for j in range(32):
            a = abs(x[i, j])
            if amax < a:
                amax = a
        e = 0
        if amax > ZERO:  # log2f as float64 rounded to float32, like the numpy path; the C cast keeps the low byte
            v = F(math.floor(F(math.log2(float(amax))))) - F(2) + F(127)
            e = int(v) & 0xFF
        d = F(math.ldexp(1.0, e - 128))  # 2^(e-128): exact in float32, subnormal for e < 2
        out[i, 0] = e
        for j in range(16):
            q0 = _best(x[i, j], d, table)
            q1 = _best(x[i, 16 + j], d, table)
            out[i, 1 + j] = q0 | (q1 << 4)
