"""What the 3-bit i-quants share: 256-weight super-blocks of 8 sub-blocks of 32, each weight's
magnitude a level l = 0..7 (value 2l+1), each group of 4 levels a point of a fixed lattice grid
(iq3grid.py: 256 points for IQ3_XXS, 512 for IQ3_S) and its sign a bit.

The search (ggml's quantize_row_iq3_xxs_impl / quantize_row_iq3_s_impl): per sub-block, trial
scales around max/15; each group of 4 takes its nearest levels, and when that pattern is off the
grid, the listed neighbour nearest in weighted distance; the best scale by weighted least squares,
then the off-grid groups refitted at it. Weights are x^2, or with an imatrix qw * sqrt(sigma2 + x^2).
The search is branchy, so it runs only as compiled numba kernels (_kernels_iq3.py): without numba
these types are unavailable (MissingDependency).
"""

from __future__ import annotations

import numpy as np

from llmkit.errors import BadInput, MissingDependency
from llmkit.quant.formats.base import Format
from llmkit.quant.formats.numerics import F32

_KERNELS = None


def kernels():
    """The compiled kernel module (numba imported on first use, with jit.py's cache directory)."""
    global _KERNELS
    if _KERNELS is None:
        from llmkit.quant.formats import jit

        jit.kernels()  # sets NUMBA_CACHE_DIR; None without numba
        try:
            from llmkit.quant.formats import _kernels_iq3
        except ImportError:
            raise MissingDependency("numba", "quant") from None
        _KERNELS = _kernels_iq3
    return _KERNELS


def neighbour_values(grid: np.ndarray, neighbours: np.ndarray) -> np.ndarray:
    """(len(neighbours), 4) float32: the grid values of the point listed at each position of the
    neighbour lists (positions holding a list's count get a valid, unused row)."""
    return grid[np.minimum(neighbours, len(grid) - 1)].astype(F32)


def sign_bits(bytes_: np.ndarray) -> np.ndarray:
    """(..., k) uint8 of 8 sign bits each -> (..., 8k) float32 of +1 / -1, bit j of byte i for weight 8i + j."""
    bits = np.unpackbits(bytes_[..., None], axis=-1, bitorder="little")
    return (F32(1) - F32(2) * bits.astype(F32)).reshape(*bytes_.shape[:-1], -1)


class GridFormat(Format):
    """An i-quant whose search runs as a compiled kernel on whole rows, with or without an imatrix
    (the same column weights for every row). `kernel`: its name in the kernel module; `needs_imatrix`:
    llama.cpp refuses the type without one."""

    block = 256
    uses_imatrix = True
    weighted_compiled = True
    half_fields = ((0, 2),)
    kernel = ""
    needs_imatrix = False
    _warm = False

    def kernel_module(self):
        return kernels()

    def tables(self) -> tuple:
        raise NotImplementedError

    def compiled(self) -> bool:
        """The kernels are this format's only path: they run whenever numba is installed. Asking also
        compiles (or loads) the kernel here, in the caller's thread: the write layer asks from its
        main thread before it forks worker processes, and a fork while another thread holds numba's
        compiler lock would leave the workers waiting on it for ever."""
        try:
            self.kernel_module()
        except MissingDependency:
            return False
        self.warm()
        return True

    def warm(self) -> None:
        """Compile or load the kernel (and build the tables) once, on one block of zeros."""
        if not self._warm:
            out = np.empty((1, self.type_size), np.uint8)
            one = np.zeros((1, self.block), F32)
            getattr(self.kernel_module(), self.kernel)(one, one, True, *self.tables(), out)
            self._warm = True

    def quantize(self, rows: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
        n_rows, n = rows.shape
        if n % self.block:
            raise BadInput(f"{self.name} needs rows of a multiple of {self.block} weights, got {n}.")
        if imatrix is None and self.needs_imatrix:
            raise BadInput(f"{self.name} needs an importance matrix (llama.cpp refuses it without one too). "
                           "Pass --imatrix, or choose another type.")
        k = self.kernel_module()
        x = np.ascontiguousarray(rows, dtype=F32).reshape(-1, self.block)
        if imatrix is None:
            qw = np.zeros((1, self.block), F32)
        else:
            qw = np.ascontiguousarray(imatrix, dtype=F32).reshape(-1)
            if qw.size != n:
                raise BadInput(f"{self.name}: the imatrix has {qw.size} values for rows of {n} weights.")
            qw = qw.reshape(n // self.block, self.block)
        out = np.empty((len(x), self.type_size), np.uint8)
        getattr(k, self.kernel)(x, qw, imatrix is not None, *self.tables(), out)
        return out.reshape(n_rows, self.row_bytes(n))
