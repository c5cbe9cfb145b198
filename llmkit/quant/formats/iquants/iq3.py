"""What the 3-bit i-quants share: 256-weight super-blocks of 8 sub-blocks of 32, each weight's
magnitude a level l = 0..7 (value 2l+1), each group of 4 levels a point of a fixed lattice grid
(iq3grid.py: 256 points for IQ3_XXS, 512 for IQ3_S) and its sign a bit.

The search (ggml's quantize_row_iq3_xxs_impl / quantize_row_iq3_s_impl): per sub-block, trial
scales around max/15; each group of 4 takes its nearest levels, and when that pattern is off the
grid, the listed neighbour nearest in weighted distance; the best scale by weighted least squares,
then the off-grid groups refitted at it. Weights are x^2, or with an imatrix qw * sqrt(sigma2 + x^2).
The search is branchy, so it runs only as compiled numba kernels (_kernels_iq3.py) on whole rows
(lattice.LatticeFormat): without numba these types are unavailable (MissingDependency).

`GridFormat` is also the base of the 1-bit types (iq1.py), whose kernels take the same arguments.
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants import iq3grid
from llmkit.quant.formats.iquants.lattice import LatticeFormat
from llmkit.quant.formats.jit import load_kernels
from llmkit.quant.formats.numerics import F32

_KERNELS = None


def kernels():
    """The compiled kernel module _kernels_iq3 (imported on first use: jit.load_kernels)."""
    global _KERNELS
    _KERNELS = _KERNELS or load_kernels("iquants._kernels_iq3")
    return _KERNELS


class GridFormat(LatticeFormat):
    """An i-quant whose kernel takes the rows as 256-weight blocks, the column weights per block
    (blocks per row, 256) with a flag saying whether to use them, the tables, and the output
    blocks. IQ3: the tables are (grid, kmap, neighbours, each neighbour's values) (iq3grid.kernel_tables)."""

    grids = iq3grid

    def kernel_module(self):
        return kernels()

    def run(self, k, x, qw, out):
        blocks = x.reshape(-1, self.block)
        w = np.zeros((1, self.block), F32) if qw is None else qw.reshape(-1, self.block)
        getattr(k, self.kernel)(blocks, w, qw is not None, *self.tables(), out.reshape(-1, self.type_size))
