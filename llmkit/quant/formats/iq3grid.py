"""The lattice grids of the 3-bit i-quants and the search tables ggml builds from them
(ggml-quants.c, iq3xs_init_impl), for both grid sizes that function knows:

    grid size  type            dequantizer values per coordinate         neighbour distances kept
    256        IQ3_XXS (18)    4, 12, 20, 28, 36, 44, 52, 62 (uint8)     2
    512        IQ3_S   (21)    1, 3, 5, 7, 9, 11, 13, 15 (uint8)         3

Each grid point is 4 coordinates, each one of eight levels l = 0..7. The constant grids are not
typed into llmkit: they are read back from ggml's own dequantizer (`ggml_lib.dequantize`) by
decoding crafted blocks (super-scale 1, sub-block scale 0, no signs, grid indices 0.. in order).

API (all arrays read-only, built once per process and cached on disk as .npy under
`llmkit.io.cache_dir("iqgrid")`, written atomically):

    tables(grid_size) -> (grid, kmap, neighbours)
        grid        (grid_size, 4) int8, ggml's search form kgrid_q3xs: 2*l + 1 (1, 3, ..., 15)
        kmap        (4096,) int32, indexed by u = sum(l_k << 3k) over the 4 levels:
                    >= 0: u is grid point kmap[u];
                    <  0: u is off the grid, its neighbour list starts at neighbours[-kmap[u] - 1]
        neighbours  (N,) uint16: for each off-grid u in increasing order, a count n then n grid
                    indices: the grid points at the `nwant` smallest squared distances from 2*l+1,
                    ordered by (distance, index), as ggml's qsort (comparing both) leaves them
    values(grid_size) -> (grid_size, 4) uint8: the dequantizer's grid
    GRID_SIZE: {type name: grid size}, KMAP_SIZE = 4096

>>> g, kmap, nb = tables(256)
>>> g.shape, kmap.shape, int(kmap[0]), int(kmap[1]) < 0
((256, 4), (4096,), 0, True)
"""

from __future__ import annotations

import os
import threading

import numpy as np

GRID_SIZE = {"IQ3_XXS": 256, "IQ3_S": 512}
KMAP_SIZE = 4096
VERSION = 1
_NWANT = {256: 2, 512: 3}
_LOCK = threading.Lock()
_MEMO: dict[int, tuple[np.ndarray, ...]] = {}
_NAMES = ("grid", "kmap", "neighbours", "values")


def tables(grid_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid, kmap, neighbours) of a grid size (see the module docstring)."""
    t = _get(grid_size)
    return t[0], t[1], t[2]


def values(grid_size: int) -> np.ndarray:
    """The dequantizer's grid (grid_size, 4) uint8."""
    return _get(grid_size)[3]


def _get(grid_size: int) -> tuple[np.ndarray, ...]:
    if grid_size not in _NWANT:
        raise ValueError(f"no 3-bit i-quant grid of size {grid_size}; sizes are {sorted(_NWANT)}")
    t = _MEMO.get(grid_size)
    if t is None:
        with _LOCK:
            t = _MEMO.get(grid_size)
            if t is None:
                t = _load(grid_size) or _save(grid_size, _build(grid_size))
                for a in t:
                    a.setflags(write=False)
                _MEMO[grid_size] = t
    return t


def _paths(grid_size: int):
    from llmkit.io import cache_dir

    d = cache_dir("iqgrid")
    return d, [d / f"iq3grid-v{VERSION}-{grid_size}-{n}.npy" for n in _NAMES]


def _load(grid_size: int):
    """The cached tables, or None when absent or not what this version writes."""
    _, paths = _paths(grid_size)
    try:
        t = tuple(np.load(p, allow_pickle=False) for p in paths)
    except (OSError, ValueError):
        return None
    grid, kmap, nb, vals = t
    ok = (grid.shape == (grid_size, 4) and grid.dtype == np.int8 and kmap.shape == (KMAP_SIZE,)
          and kmap.dtype == np.int32 and nb.dtype == np.uint16 and nb.ndim == 1 and vals.shape == (grid_size, 4)
          and vals.dtype == np.uint8)
    return t if ok else None


def _save(grid_size: int, t):
    """Write the tables (temp file + rename, so a reader never sees half a file); a read-only cache is no error."""
    d, paths = _paths(grid_size)
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


def _build(grid_size: int):
    """iq3xs_init_impl: the search grid, the map of every level pattern and the neighbour lists."""
    vals = _read_values(grid_size)
    lv = np.searchsorted(np.unique(vals), vals).astype(np.int64)  # the eight values in order -> 0..7
    grid = (2 * lv + 1).astype(np.int8)
    u = (lv << (3 * np.arange(4))).sum(axis=1)
    if len(np.unique(u)) != grid_size:
        raise RuntimeError(f"the {grid_size}-point grid read from ggml has repeated points")
    kmap = np.full(KMAP_SIZE, -1, np.int64)
    kmap[u] = np.arange(grid_size)
    off = np.nonzero(kmap < 0)[0]
    pos = (2 * ((off[:, None] >> (3 * np.arange(4))) & 7) + 1).astype(np.int32)  # (n_off, 4)
    d2 = ((pos[:, None, :] - grid.astype(np.int32)[None, :, :]) ** 2).sum(axis=2)  # (n_off, grid_size)
    # the nwant-th smallest distinct distance of each row (or its largest, when it has fewer)
    thr = d2.min(axis=1)
    big = np.iinfo(np.int32).max
    for _ in range(_NWANT[grid_size] - 1):
        nxt = np.where(d2 > thr[:, None], d2, big).min(axis=1)
        thr = np.where(nxt == big, thr, nxt)
    rows, cols = np.nonzero(d2 <= thr[:, None])
    order = np.lexsort((cols, d2[rows, cols], rows))  # by row, then (distance, index): ggml's qsort
    counts = np.bincount(rows, minlength=len(off))
    starts = np.concatenate([[0], np.cumsum(counts + 1)[:-1]])  # each list: its count, then its indices
    nb = np.empty(int(counts.sum()) + len(off), np.int64)
    mark = np.zeros(len(nb), bool)
    mark[starts] = True
    nb[starts] = counts
    nb[~mark] = cols[order]
    kmap[off] = -(starts + 1)
    return grid, kmap.astype(np.int32), nb.astype(np.uint16), vals
