"""What the 2-bit i-quants share (IQ2_XXS, IQ2_XS, IQ2_S): 256-weight super-blocks with an fp16
super-scale d, 4-bit sub-block scales s (a weight is d * (0.5 + s) / 4 * grid value * sign), each
group of 8 weights a point of a lattice grid (iq2grid.py: 256, 512 or 1024 points, coordinates
8, 25 or 43) with its 8 signs.

The search (ggml's quantize_row_iq2_*_impl): per sub-block, weights qw * sqrt(sigma2 + x^2); the
signs taken out (IQ2_XXS/XS keep 7 sign bits per group, so an odd count of minus signs gives up the
least important one); trial scales; each group of 8 takes its nearest levels, and off the grid the
listed neighbour nearest in weighted distance; the best scale by weighted least squares; the
off-grid groups refitted at it. It is branchy, so it runs only as compiled numba kernels
(_kernels_iq2.py) on whole rows (lattice.LatticeFormat): without numba these types are unavailable
(MissingDependency).
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants import iq2grid
from llmkit.quant.formats.iquants.lattice import LatticeFormat
from llmkit.quant.formats.jit import load_kernels
from llmkit.quant.formats.numerics import F32

_KERNELS = None


def kernels():
    """The compiled kernel module _kernels_iq2 (imported on first use: jit.load_kernels)."""
    global _KERNELS
    _KERNELS = _KERNELS or load_kernels("iquants._kernels_iq2")
    return _KERNELS


def sub_scales(d: np.ndarray, s: np.ndarray) -> np.ndarray:
    """d (nb,) and 4-bit codes s (nb, k) -> d * (0.5 + s) * 0.25, float32 (nb, k), in ggml's order."""
    return d[:, None] * (F32(0.5) + s.astype(F32)) * F32(0.25)


class IQ2Format(LatticeFormat):
    """A 2-bit i-quant: its kernel reads the grid's (levels, kmap, neighbours) (iq2grid.kernel_tables);
    `needs_imatrix`: ggml's quantizer asserts without column weights (llama.cpp refuses the type)."""

    grids = iq2grid
    needs_imatrix = True

    def kernel_module(self):
        return kernels()

    def run(self, k, x, qw, out):
        """The kernels take whole rows, the column weights (n,) (an empty array: none) and the tables."""
        getattr(k, self.kernel)(x, np.zeros(0, F32) if qw is None else qw, out, *self.tables())
