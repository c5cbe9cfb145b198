"""The lattice grids of the 3-bit i-quants and the search tables ggml builds from them
(ggml-quants.c, iq3xs_init_impl), for both grid sizes that function knows:

    grid size  type            dequantizer values per coordinate         neighbour distances kept
    256        IQ3_XXS (18)    4, 12, 20, 28, 36, 44, 52, 62 (uint8)     2
    512        IQ3_S   (21)    1, 3, 5, 7, 9, 11, 13, 15 (uint8)         3

Each grid point is 4 coordinates, each one of eight levels l = 0..7. The constant grids are not
typed into llmkit: they are read back from ggml's own dequantizer (`ggml_lib.dequantize`) by
decoding crafted blocks (super-scale 1, sub-block scale 0, no signs, grid indices 0.. in order).

API (the tables read-only, built once per process and cached on disk as .npy under
`llmkit.config.cache_dir("iqgrid")`, written atomically: lattice.GridSpec, shared with iq2grid.py):

    tables(grid_size) -> (grid, kmap, neighbours)
        grid        (grid_size, 4) int8, ggml's search form kgrid_q3xs: 2*l + 1 (1, 3, ..., 15)
        kmap        (4096,) int32, indexed by u = sum(l_k << 3k) over the 4 levels:
                    >= 0: u is grid point kmap[u];
                    <  0: u is off the grid, its neighbour list starts at neighbours[-kmap[u] - 1]
        neighbours  (N,) uint16: for each off-grid u in increasing order, a count n then n grid
                    indices: the grid points at the `nwant` smallest squared distances from 2*l+1,
                    ordered by (distance, index), as ggml's qsort (comparing both) leaves them
    values(grid_size) -> (grid_size, 4) uint8: the dequantizer's grid
    kernel_tables(grid_size) -> (grid, kmap, neighbours, neighbour values): what the IQ3 kernels read
    GRID_SIZE: {type name: grid size}, KMAP_SIZE = 4096

>>> g, kmap, nb = tables(256)
>>> g.shape, kmap.shape, int(kmap[0]), int(kmap[1]) < 0
((256, 4), (4096,), 0, True)
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants.lattice import GridSpec
from llmkit.quant.formats.numerics import F32

GRID_SIZE = {"IQ3_XXS": 256, "IQ3_S": 512}
KMAP_SIZE = 4096
VERSION = 1
_NWANT = {256: 2, 512: 3}
_MEMO: dict = {}  # grid size -> the tables; ("kernel", grid size) -> kernel_tables


def tables(grid_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid, kmap, neighbours) of a grid size (see the module docstring)."""
    return _SPEC.get(_MEMO, grid_size)[:3]


def values(grid_size: int) -> np.ndarray:
    """The dequantizer's grid (grid_size, 4) uint8."""
    return _SPEC.get(_MEMO, grid_size)[3]


def kernel_tables(grid_size: int) -> tuple[np.ndarray, ...]:
    """(grid, kmap, neighbours, neighbour values): what the IQ3 kernels read (made once)."""
    return _SPEC.kernel_tables(_MEMO, grid_size)


def _read_values(grid_size: int) -> np.ndarray:
    """Every grid point's 4 values, decoded by ggml's dequantizer from blocks holding indices 0.. in order
    (each group of 4 weights shows one grid point: 64 per 256-weight block)."""
    from llmkit.quant.formats import ggml_lib

    idx = np.arange(grid_size, dtype=np.int64).reshape(-1, 64)
    nb = len(idx)
    if grid_size == 256:  # IQ3_XXS: d, 64 index bytes, 8 u32 of signs (0) and a 4-bit scale s (0)
        b = np.zeros((nb, 98), np.uint8)
        b[:, 1] = 0x3C  # d = 1.0
        b[:, 2:66] = idx
        tid, scale = 18, 0.25  # d * (0.5 + s) * 0.5
    else:  # IQ3_S: d, 64 low index bytes, 8 bytes of 9th bits, 32 of signs, 4 of scales (d * (1 + 2s))
        b = np.zeros((nb, 110), np.uint8)
        b[:, 1] = 0x3C
        b[:, 2:66] = idx & 0xFF
        b[:, 66:74] = np.where((idx[:, 0] >> 8)[:, None] > 0, 0xFF, 0)
        tid, scale = 21, 1.0
    y = ggml_lib.dequantize(tid, b, nb * 256).astype(np.float64).reshape(grid_size, 4)
    v = np.rint(y / scale)
    if not np.array_equal(v * scale, y) or len(np.unique(v)) != 8 or v.min() < 0 or v.max() > 255:
        raise RuntimeError(f"ggml's dequantizer gave values off the {grid_size}-point grid")
    return v.astype(np.uint8)


def _kernel_form(grid, kmap, neighbours, values):
    """The tables and (len(neighbours), 4) float32: the grid values of the point listed at each position
    of the neighbour lists (positions holding a list's count get a valid, unused row)."""
    return grid, kmap, neighbours, grid[np.minimum(neighbours, len(grid) - 1)].astype(F32)


_SPEC = GridSpec(stem=f"iq3grid-v{VERSION}", kind="3-bit i-quant", dim=4, bits=3, kmap_size=KMAP_SIZE,
                 grid_dtype=np.int8, nwant=_NWANT, read_values=_read_values,
                 kernel_form=_kernel_form)
