"""What the lattice i-quants share (IQ1_S/IQ1_M, IQ2_XXS/XS/S, IQ3_XXS/S): a format whose only path
is a compiled numba kernel run on whole rows, and the grid search tables those kernels read.

- `LatticeFormat`: the checks of `quantize` (row length, imatrix required or not, its length),
  the output rows, and a warm-up that compiles or loads the kernel once per process. A family
  (iq1.py, iq2.py, iq3.py) supplies only its kernel module, its kernel call (`run`) and the grid
  module its tables come from (`grids`).
- `sign_values`, `nibbles`: the dequantizers' bit unpacking.
- `GridSpec`: a family of grids (iq2grid.py, iq3grid.py): ggml's search tables (iqN_init_impl)
  built from the grid's values, kept in memory and on disk as .npy, written atomically.

Threads: the write layer asks `compiled()` from its main thread before it forks worker processes,
so numba is imported and the kernels compiled there; the warm-up and the table building run once
under locks that a forked child gets fresh (a thread of the parent may have held them at the fork).

    >>> sign_values(np.array([[0b00000101]], np.uint8)).tolist()
    [[-1.0, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0]]
    >>> nibbles(np.array([[0x21, 0x43]], np.uint8)).tolist()
    [[1, 2, 3, 4]]
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from llmkit.errors import BadInput, MissingDependency
from llmkit.quant.formats.base import Format
from llmkit.quant.formats.jit import DEFAULT, Kernels
from llmkit.quant.formats.numerics import F32

_WARM_LOCK = threading.Lock()
_TABLE_LOCK = threading.Lock()


def _after_fork() -> None:
    """A forked worker gets free locks (a thread of the parent may have held one at the fork)."""
    global _WARM_LOCK, _TABLE_LOCK
    _WARM_LOCK, _TABLE_LOCK = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def sign_values(signs: np.ndarray) -> np.ndarray:
    """(..., k) uint8 of 8 sign bits each -> (..., 8k) float32 +1 / -1 (bit j of byte i: weight 8i + j)."""
    bits = np.unpackbits(signs[..., None], axis=-1, bitorder="little")
    return (F32(1) - F32(2) * bits.astype(F32)).reshape(*signs.shape[:-1], -1)


def nibbles(b: np.ndarray) -> np.ndarray:
    """(nb, k) bytes of two 4-bit codes each (low nibble first) -> (nb, 2k) codes, uint8."""
    return np.stack([b & 0xF, b >> 4], axis=2).reshape(len(b), -1)


class LatticeFormat(Format):
    """An i-quant whose search runs only as a compiled kernel on whole rows, with the same column
    weights (the imatrix) for every row or none. `kernel`: its name in the family's kernel module
    (the type's name, lower-cased); `grids`: the grid module (iq2grid, iq3grid) whose GRID_SIZE
    gives the type's grid; `needs_imatrix`: llama.cpp refuses the type without one, so llmkit too."""

    block = 256
    uses_imatrix = True
    weighted_compiled = True
    half_fields = ((0, 2),)
    kernel = ""
    grids = None
    needs_imatrix = False
    _warm = False

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls.kernel = cls.name.lower()

    def kernel_module(self):
        """The family's kernel module (jit.load_kernels); MissingDependency without numba."""
        raise NotImplementedError

    def tables(self) -> tuple:
        """The arrays the kernel reads after the column weights: the grid module's kernel_tables."""
        return self.grids.kernel_tables(self.grids.GRID_SIZE[self.name])

    def run(self, k, x: np.ndarray, qw: np.ndarray | None, out: np.ndarray) -> None:
        """The family's kernel call: rows x (n_rows, n) float32, column weights qw (n,) float32 or
        None, into out (n_rows, row_bytes) uint8."""
        raise NotImplementedError

    def compiled(self, kernels: Kernels = DEFAULT, weighted: bool = False) -> bool:
        """The kernels are this format's only path: they run whenever numba is installed, whatever the
        run decided. Asking also compiles (or loads) the kernel, in the caller's thread: see the module
        docstring."""
        try:
            self.ready(kernels)
        except MissingDependency:
            return False
        return True

    def ready(self, kernels: Kernels = DEFAULT):
        """The kernel module, with this format's kernel compiled (or loaded from numba's cache) and its
        tables built: once per process, on one block of zeros, so no worker forked later inherits a
        half-done load (`kernels.notice` hears of a first compilation)."""
        k = self.kernel_module()
        if not self._warm:
            with _WARM_LOCK:
                if not self._warm:
                    kernels.note_if_cold(k.__name__.rpartition(".")[2], self.kernel)
                    out = np.empty((1, self.type_size), np.uint8)
                    self.run(k, np.zeros((1, self.block), F32), np.ones(self.block, F32), out)
                    self._warm = True
        return k

    def quantize(self, rows: np.ndarray, imatrix: np.ndarray | None = None, kernels: Kernels = DEFAULT) -> np.ndarray:
        """rows (n_rows, n) float32 with column weights imatrix (n,) -> (n_rows, row_bytes) uint8, ggml's bytes."""
        n_rows, n = rows.shape
        if n % self.block:
            raise BadInput(f"{self.name} needs rows of a multiple of {self.block} weights, got {n}.")
        if imatrix is None and self.needs_imatrix:
            raise BadInput(f"{self.name} needs an importance matrix (llama.cpp refuses it without one, or aborts "
                           "where the imatrix lacks the tensor). Give an imatrix covering it, or choose another type.")
        k = self.ready(kernels)
        x = np.ascontiguousarray(rows, dtype=F32)
        qw = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=F32).reshape(-1)
        if qw is not None and qw.size != n:
            raise BadInput(f"{self.name}: the importance matrix has {qw.size} values for rows of {n} weights.")
        out = np.empty((n_rows, self.row_bytes(n)), np.uint8)
        self.run(k, x, qw, out)
        return out


@dataclass(frozen=True)
class GridSpec:
    """A family of lattice grids: `dim` coordinates per point, each one of 2^`bits` levels in the
    index u = sum(l_k << bits*k) that kmap (`kmap_size` entries) maps; `nwant` {grid size: the
    neighbour distances kept}; `read_values(grid size)`: the dequantizer's grid, read from ggml;
    `kernel_form(grid, kmap, neighbours, values)`: the arrays the family's kernels read. The tables
    are cached as `stem`-<size>-<name>.npy under llmkit.config.cache_dir("iqgrid")."""

    stem: str
    kind: str  # for the error naming a grid size that does not exist
    dim: int
    bits: int
    kmap_size: int
    grid_dtype: type
    nwant: dict
    read_values: Callable[[int], np.ndarray]
    kernel_form: Callable[..., tuple]
    signed: tuple = ()  # the grid sizes whose values are int8 (the others: uint8)

    NAMES = ("grid", "kmap", "neighbours", "values")

    def get(self, memo: dict, grid_size: int) -> tuple[np.ndarray, ...]:
        """(grid, kmap, neighbours, values) of a grid size, read-only: from `memo` (the family module's,
        filled here), else the disk cache, else built from ggml's grid (and saved)."""
        if grid_size not in self.nwant:
            raise ValueError(f"no {self.kind} grid of size {grid_size}; sizes are {sorted(self.nwant)}")
        t = memo.get(grid_size)
        if t is None:
            with _TABLE_LOCK:
                t = memo.get(grid_size)
                if t is None:
                    t = self._load(grid_size) or self._save(grid_size, self.build(grid_size))
                    for a in t:
                        a.setflags(write=False)
                    memo[grid_size] = t
        return t

    def kernel_tables(self, memo: dict, grid_size: int) -> tuple[np.ndarray, ...]:
        """kernel_form of a grid size's tables, made once (kept in `memo` beside them)."""
        t = self.get(memo, grid_size)
        k = memo.get(("kernel", grid_size))
        if k is None:
            k = memo[("kernel", grid_size)] = self.kernel_form(*t)
        return k

    def build(self, grid_size: int) -> tuple[np.ndarray, ...]:
        """iq2xs_init_impl / iq3xs_init_impl: the search grid 2*l + 1, the map of every level pattern
        u to its grid point (>= 0) or to -(start + 1) of its neighbour list, and the lists: for each
        off-grid u in increasing order a count n, then the n grid points at the `nwant` smallest
        squared distances from 2*l + 1, by (distance, index) as ggml's qsort leaves them."""
        vals = self.read_values(grid_size)
        lv = np.searchsorted(np.unique(vals), vals).astype(np.int64)  # the values in order -> 0, 1, ...
        grid = (2 * lv + 1).astype(self.grid_dtype)
        shifts = self.bits * np.arange(self.dim)
        u = (lv << shifts).sum(axis=1)
        if len(np.unique(u)) != grid_size:
            raise RuntimeError(f"the {grid_size}-point grid read from ggml has repeated points")
        kmap = np.full(self.kmap_size, -1, np.int64)
        kmap[u] = np.arange(grid_size)
        off = np.nonzero(kmap < 0)[0]
        pos = (2 * ((off[:, None] >> shifts) & ((1 << self.bits) - 1)) + 1).astype(np.int32)  # (n_off, dim)
        g = grid.astype(np.int32)
        big = np.iinfo(np.int32).max
        counts = np.empty(len(off), np.int64)
        lists = []
        for c0 in range(0, len(off), 2048):  # chunks of rows: the distance matrix stays small
            d2 = ((pos[c0:c0 + 2048, None, :] - g[None, :, :]) ** 2).sum(axis=2)  # (chunk, grid_size)
            thr = d2.min(axis=1)
            for _ in range(self.nwant[grid_size] - 1):  # the nwant-th smallest distinct distance (or the largest)
                nxt = np.where(d2 > thr[:, None], d2, big).min(axis=1)
                thr = np.where(nxt == big, thr, nxt)
            rows, cols = np.nonzero(d2 <= thr[:, None])
            order = np.lexsort((cols, d2[rows, cols], rows))  # by row, then (distance, index): ggml's qsort
            counts[c0:c0 + len(d2)] = np.bincount(rows, minlength=len(d2))
            lists.append(cols[order])
        flat = np.concatenate(lists)
        starts = np.concatenate([[0], np.cumsum(counts + 1)[:-1]])  # each list: its count, then its indices
        nb = np.empty(len(flat) + len(off), np.int64)
        mark = np.zeros(len(nb), bool)
        mark[starts] = True
        nb[starts] = counts
        nb[~mark] = flat
        kmap[off] = -(starts + 1)
        return grid, kmap.astype(np.int32), nb.astype(np.uint16), vals

    def _paths(self, grid_size: int):
        from llmkit.config import cache_dir

        d = cache_dir("iqgrid")
        return d, [d / f"{self.stem}-{grid_size}-{n}.npy" for n in self.NAMES]

    def _load(self, grid_size: int):
        """The cached tables, or None when absent or not what this version writes."""
        _, paths = self._paths(grid_size)
        try:
            t = tuple(np.load(p, allow_pickle=False) for p in paths)
        except (OSError, ValueError):
            return None
        grid, kmap, nb, vals = t
        shape = (grid_size, self.dim)
        ok = (grid.shape == shape and grid.dtype == self.grid_dtype and kmap.shape == (self.kmap_size,)
              and kmap.dtype == np.int32 and nb.dtype == np.uint16 and nb.ndim == 1 and vals.shape == shape
              and vals.dtype == (np.int8 if grid_size in self.signed else np.uint8))
        return t if ok else None

    def _save(self, grid_size: int, t):
        """Write the tables (temp file + rename, so a reader never sees half a file); a read-only cache is no error."""
        d, paths = self._paths(grid_size)
        try:
            d.mkdir(parents=True, exist_ok=True)
            for p, a in zip(paths, t):
                tmp = p.with_name(f"{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                with open(tmp, "wb") as f:
                    np.save(f, a, allow_pickle=False)
                os.replace(tmp, p)
        except OSError:
            pass
        return t
