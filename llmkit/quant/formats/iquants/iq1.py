"""What the 1-bit i-quants share: 256-weight super-blocks whose groups of 8 weights are points of
ggml's 2048-point ternary grid (values -1, 0, 1; iq2grid.py), shifted by +-1/8 per sub-block,
times a 3-bit sub-block scale and an fp16 super-scale. IQ1_S: sub-blocks of 32, one shift each;
IQ1_M: sub-blocks of 16, a shift per group of 8.

The search (ggml's quantize_row_iq1_s_impl / quantize_row_iq1_m_impl): per sub-block, the exact
weighted least squares over the two boundaries that split the sorted weights into -1, 0, 1, for
each shift; a group whose pattern is off the grid takes its nearest listed neighbour and the
scale is refitted. Weights qw * sqrt(sigma2 + x^2) (the imatrix: llama.cpp refuses both types
without one). It runs only as compiled numba kernels (_kernels_iq1.py), called as the IQ3 ones
(iq3.GridFormat).
"""

from __future__ import annotations

from llmkit.quant.formats.iquants import iq2grid
from llmkit.quant.formats.iquants.iq3 import GridFormat
from llmkit.quant.formats.jit import load_kernels

_KERNELS = None


def kernels():
    """The compiled kernel module _kernels_iq1 (imported on first use: jit.load_kernels)."""
    global _KERNELS
    _KERNELS = _KERNELS or load_kernels("iquants._kernels_iq1")
    return _KERNELS


class TernaryGridFormat(GridFormat):
    """IQ1_S / IQ1_M: the 2048-point grid as (levels, kmap, neighbours) (iq2grid.kernel_tables), an
    imatrix required."""

    grids = iq2grid
    needs_imatrix = True

    def kernel_module(self):
        return kernels()
