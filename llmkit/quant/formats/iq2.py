"""What the 2-bit i-quants share (IQ2_XXS, IQ2_XS, IQ2_S): 256-weight super-blocks with an fp16
super-scale d, 4-bit sub-block scales s (a weight is d * (0.5 + s) / 4 * grid value * sign), each
group of 8 weights a point of a lattice grid (iq2grid.py: 256, 512 or 1024 points, coordinates
8, 25 or 43) with its 8 signs.

The search (ggml's quantize_row_iq2_*_impl): per sub-block, weights qw * sqrt(sigma2 + x^2); the
signs taken out (IQ2_XXS/XS keep 7 sign bits per group, so an odd count of minus signs gives up the
least important one); trial scales; each group of 8 takes its nearest levels, and off the grid the
listed neighbour nearest in weighted distance; the best scale by weighted least squares; the
off-grid groups refitted at it. It is branchy, so it runs only as compiled numba kernels
(_kernels_iq2.py): without numba these types are unavailable (MissingDependency).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from llmkit.errors import BadInput, MissingDependency
from llmkit.quant.formats import iq2grid
from llmkit.quant.formats.base import Format
from llmkit.quant.formats.numerics import F32

_KERNELS = None
_READY: set[str] = set()
_LOCK = threading.Lock()


def _after_fork() -> None:
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def kernels():
    """The compiled kernel module (numba imported on first use, with jit.py's cache directory)."""
    global _KERNELS
    if _KERNELS is None:
        import numpy.ma  # noqa: F401 - numba's first call imports it: not in a thread a fork may copy mid-import

        from llmkit.quant.formats import jit

        jit.kernels()  # sets NUMBA_CACHE_DIR; None without numba
        try:
            from llmkit.quant.formats import _kernels_iq2
        except ImportError:
            raise MissingDependency("numba", "quant") from None
        _KERNELS = _kernels_iq2
    return _KERNELS


def sign_values(signs: np.ndarray) -> np.ndarray:
    """(..., k) uint8 of 8 sign bits each -> (..., 8k) float32 +1 / -1 (bit j of byte i: weight 8i + j)."""
    bits = np.unpackbits(signs[..., None], axis=-1, bitorder="little")
    return (F32(1) - F32(2) * bits.astype(F32)).reshape(*signs.shape[:-1], -1)


def sub_scales(d: np.ndarray, s: np.ndarray) -> np.ndarray:
    """d (nb,) and 4-bit codes s (nb, k) -> d * (0.5 + s) * 0.25, float32 (nb, k), in ggml's order."""
    return d[:, None] * (F32(0.5) + s.astype(F32)) * F32(0.25)


def scale_nibbles(b: np.ndarray) -> np.ndarray:
    """(nb, 8) bytes of two 4-bit codes each (low nibble first) -> (nb, 16) codes."""
    return np.stack([b & 0xF, b >> 4], axis=2).reshape(len(b), 16)


class IQ2Format(Format):
    """A 2-bit i-quant: the kernel `kernel` on whole rows with the grid of `grid_size` points;
    `needs_imatrix`: ggml's quantizer asserts without column weights (llama.cpp refuses the type)."""

    block = 256
    uses_imatrix = True
    weighted_compiled = True
    half_fields = ((0, 2),)
    kernel = ""
    grid_size = 256
    needs_imatrix = True

    def compiled(self) -> bool:
        """The kernels are this format's only path: they run whenever numba is installed. The first
        call loads this format's tables and kernel (the write layer asks here, before its workers start)."""
        try:
            self.ready()
        except MissingDependency:
            return False
        return True

    def ready(self):
        """The kernel module, with this format's kernel loaded (compiled on the very first run) and its
        tables built: once per process, under a lock, so no worker forked later inherits a half-done load."""
        k = kernels()
        if self.name not in _READY:
            with _LOCK:
                if self.name not in _READY:
                    _, kmap, nbrs = iq2grid.tables(self.grid_size)
                    row = np.zeros((1, 256), F32)
                    qw = np.ones(256, F32)
                    getattr(k, self.kernel)(row, qw, np.empty((1, self.type_size), np.uint8), _levels(self.grid_size),
                                            kmap, nbrs)
                    _READY.add(self.name)
        return k

    def quantize(self, rows: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
        """rows (n_rows, n) float32 with column weights imatrix (n,) -> (n_rows, row_bytes) uint8, ggml's bytes."""
        n_rows, n = rows.shape
        if n % self.block:
            raise BadInput(f"{self.name} needs rows of a multiple of {self.block} weights, got {n}.")
        if imatrix is None and self.needs_imatrix:
            raise BadInput(f"{self.name} needs an importance matrix (llama.cpp refuses it without one, or aborts "
                           "where the imatrix lacks the tensor). Give an imatrix covering it, or choose another type.")
        k = self.ready()
        x = np.ascontiguousarray(rows, dtype=F32)
        qw = np.zeros(0, F32) if imatrix is None else np.ascontiguousarray(imatrix, dtype=F32).reshape(-1)
        if imatrix is not None and len(qw) != n:
            raise BadInput(f"{self.name}: the importance matrix has {len(qw)} values for rows of {n} weights.")
        _, kmap, nbrs = iq2grid.tables(self.grid_size)
        out = np.empty((n_rows, self.row_bytes(n)), np.uint8)
        getattr(k, self.kernel)(x, qw, out, _levels(self.grid_size), kmap, nbrs)
        return out


_LEVELS: dict[int, np.ndarray] = {}


def _levels(grid_size: int) -> np.ndarray:
    """The grid's levels (0..2 per coordinate), as the kernels read them (made once)."""
    g = _LEVELS.get(grid_size)
    if g is None:
        g = _LEVELS[grid_size] = np.ascontiguousarray(iq2grid.levels(grid_size))
    return g
