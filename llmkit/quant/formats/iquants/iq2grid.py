"""The lattice grids of the 1- and 2-bit i-quants and the search tables ggml builds from them
(ggml-quants.c, iq2xs_init_impl), for every grid size that function knows:

    grid size  types            dequantizer values per coordinate   neighbour distances kept
    256        IQ2_XXS (16)     8, 25, 43 (uint8)                   2
    512        IQ2_XS  (17)     8, 25, 43 (uint8)                   2
    1024       IQ2_S   (22)     8, 25, 43 (uint8)                   1
    2048       IQ1_S/IQ1_M      -1, 0, 1 (int8)                     3

Each grid point is 8 coordinates, each one of three levels l = 0, 1, 2. The constant grids are not
typed into llmkit: they are read back from ggml's own dequantizer (`ggml_lib.dequantize`) by
decoding crafted blocks (super-scale 1, sub-block scale 0, no signs, one grid index per group of 8).

API (the tables read-only, built once per process and cached on disk as .npy under
`llmkit.config.cache_dir("iqgrid")`, written atomically: lattice.GridSpec, shared with iq3grid.py):

    tables(grid_size) -> (grid, kmap, neighbours)
        grid        (grid_size, 8) uint8, ggml's search form kgrid_q2xs: 2*l + 1 (1, 3 or 5)
        kmap        (43692,) int32, indexed by u = sum(l_k << 2k) over the 8 levels (0..3):
                    >= 0: u is grid point kmap[u];
                    <  0: u is off the grid, its neighbour list starts at neighbours[-kmap[u] - 1]
        neighbours  (N,) uint16: for each off-grid u in increasing order, a count n then n grid
                    indices: the grid points at the `nwant` smallest squared distances from 2*l+1,
                    ordered by (distance, index), exactly as ggml's qsort leaves them
    values(grid_size) -> (grid_size, 8) the dequantizer's grid: uint8 (IQ2) or int8 (IQ1)
    levels(grid_size) -> (grid_size, 8) uint8: l of every coordinate ((grid - 1) // 2)
    kernel_tables(grid_size) -> (levels, kmap, neighbours): what the IQ2 and IQ1 kernels read
    signs_table() -> (128,) uint8: ksigns_iq2xs, 7 sign bits plus an 8th making the count even
    GRID_SIZE: {type name: grid size}, KMAP_SIZE = 43692

>>> g, kmap, nb = tables(256)
>>> g.shape, kmap.shape, int(kmap[0]), int(kmap[1]) < 0
((256, 8), (43692,), 0, True)
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.iquants.lattice import GridSpec

GRID_SIZE = {"IQ2_XXS": 256, "IQ2_XS": 512, "IQ2_S": 1024, "IQ1_S": 2048, "IQ1_M": 2048}
KMAP_SIZE = 43692
VERSION = 1
_NWANT = {256: 2, 512: 2, 1024: 1, 2048: 3}
_MEMO: dict = {}  # grid size -> the tables; ("kernel", grid size) -> kernel_tables


def tables(grid_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid, kmap, neighbours) of a grid size (see the module docstring)."""
    return _SPEC.get(_MEMO, grid_size)[:3]


def values(grid_size: int) -> np.ndarray:
    """The dequantizer's grid (grid_size, 8): uint8 for the IQ2 grids, int8 for IQ1's."""
    return _SPEC.get(_MEMO, grid_size)[3]


def levels(grid_size: int) -> np.ndarray:
    """The level l (0, 1, 2) of each coordinate of every grid point, (grid_size, 8) uint8."""
    return tables(grid_size)[0] >> 1


def kernel_tables(grid_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(levels, kmap, neighbours): what the IQ2 and IQ1 kernels read (made once)."""
    return _SPEC.kernel_tables(_MEMO, grid_size)


def signs_table() -> np.ndarray:
    """ggml's ksigns_iq2xs: entry s is s with bit 7 set when s has an odd number of bits."""
    s = np.arange(128, dtype=np.uint8)
    parity = np.unpackbits(s[:, None], axis=1).sum(axis=1) & 1
    return s | (parity.astype(np.uint8) << 7)


def _read_values(grid_size: int) -> np.ndarray:
    """Every grid point's 8 values, decoded by ggml's dequantizer from blocks holding indices 0.. in order."""
    from llmkit.quant.formats import ggml_lib

    idx = np.arange(grid_size, dtype=np.int64).reshape(-1, 32)  # 32 groups of 8 per 256-weight block
    nb = len(idx)
    if grid_size == 256:  # IQ2_XXS: per 32 weights, 4 index bytes then a u32 of signs and scale (all 0)
        b = np.zeros((nb, 66), np.uint8)
        b[:, 1] = 0x3C  # d = 1.0
        q = np.zeros((nb, 8, 8), np.uint8)
        q[:, :, :4] = idx.reshape(nb, 8, 4)
        b[:, 2:] = q.reshape(nb, 64)
        tid, scale = 16, 0.125  # d * (0.5 + 0) * 0.25
    elif grid_size == 512:  # IQ2_XS: u16 per group, index in the low 9 bits, signs above (0)
        b = np.zeros((nb, 74), np.uint8)
        b[:, 1] = 0x3C
        b[:, 2:66] = idx.astype("<u2").view(np.uint8).reshape(nb, 64)
        tid, scale = 17, 0.125
    elif grid_size == 1024:  # IQ2_S: low 8 index bits in qs, 2 high bits per group in qh
        b = np.zeros((nb, 82), np.uint8)
        b[:, 1] = 0x3C
        b[:, 2:34] = idx & 0xFF
        hi = (idx >> 8).reshape(nb, 8, 4) << (2 * np.arange(4))
        b[:, 66:74] = hi.sum(axis=2)
        tid, scale = 22, 0.125
    else:  # IQ1_S: low 8 bits in qs, 3 high bits per group in qh (u16 per 32 weights); value + 0.125
        b = np.zeros((nb, 50), np.uint8)
        b[:, 1] = 0x3C
        b[:, 2:34] = idx & 0xFF
        hi = ((idx >> 8).reshape(nb, 8, 4) << (3 * np.arange(4))).sum(axis=2)
        b[:, 34:50] = hi.astype("<u2").view(np.uint8).reshape(nb, 16)
        tid, scale = 19, 1.0
    y = ggml_lib.dequantize(tid, b, nb * 256).astype(np.float64).reshape(grid_size, 8)
    if grid_size == 2048:
        v = np.rint(y - 0.125)
        if not np.array_equal(v + 0.125, y) or not np.isin(v, (-1, 0, 1)).all():
            raise RuntimeError("ggml's IQ1_S dequantizer gave values off its grid")
        return v.astype(np.int8)
    v = np.rint(y / scale)
    if not np.array_equal(v * scale, y) or len(np.unique(v)) != 3:
        raise RuntimeError(f"ggml's dequantizer gave values off the {grid_size}-point grid")
    return v.astype(np.uint8)


def _kernel_form(grid, kmap, neighbours, values):
    """The kernels read the grid as its levels (a writable copy, as they were always given)."""
    return np.ascontiguousarray(grid >> 1), kmap, neighbours


_SPEC = GridSpec(stem=f"iq2grid-v{VERSION}", kind="i-quant", dim=8, bits=2, kmap_size=KMAP_SIZE, grid_dtype=np.uint8,
                 nwant=_NWANT, read_values=_read_values, kernel_form=_kernel_form, signed=(2048,))
