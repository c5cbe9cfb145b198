"""Where a generation's vectors live, behind one small protocol, and the default store: files in the
index directory. The other store is a served Milvus engine (`milvus.py`); chunks, metadata and BM25
stay in the index directory either way.

The default store is gen-N/vectors.npy, float32 or float16 (`VECTOR_DTYPES`), memory-mapped and
never loaded whole: exact (flat) search multiplies the query with it block by block, keeping the
best rows of each block; an HNSW index (gen-N/faiss.index, its vectors stored as float32 or fp16
scalar-quantized codes) is opened with faiss's mmap flag, so its vector codes stay on disk and only
its graph is read into memory. An index written before flat search was mapped also holds a flat
faiss.index; it is not read.

A store answers `search(query vector, depth, allowed rows)` with (rows, inner products) best first,
a mask applied inside the search, and `vectors()` with every row's vector in row order.
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

from llmkit.errors import BadInput

HNSW_ABOVE = 100_000  # auto: exact flat search up to this many vectors, HNSW beyond
EXACT_BELOW = 20_000  # few allowed rows: exact scores over them beat a filtered graph walk
BLOCK = 16_384  # rows per block of a mapped exact search (a few MB of float32 scores and vectors)
VECTOR_DTYPES = ("float32", "float16")  # how vectors.npy stores them (float16: half the disk and page cache)


class VectorStore(Protocol):
    """The vectors of one index generation."""

    def search(self, q: np.ndarray, depth: int, allowed: np.ndarray | None) -> tuple[list[int], list[float]]:
        """(rows, inner products with the float32 query vector `q`), best first, among `allowed` rows."""

    def vectors(self) -> np.ndarray:
        """Every row's vector, in row order."""

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of these rows, in that order."""


def index_kind(index_type: str, n: int, hnsw_above: int = HNSW_ABOVE) -> str:
    """flat (exact) or hnsw: as asked, or exact up to `hnsw_above` vectors (auto)."""
    if index_type == "auto":
        return "hnsw" if n > hnsw_above else "flat"
    return index_type


def rows_of_ids(rows: np.ndarray, ids) -> np.ndarray:
    """Positions in the sorted chunk-id array `rows` of these ids (ids not in it are ignored)."""
    ids = np.asarray(sorted(ids), np.int64)
    n = len(rows)
    pos = np.searchsorted(rows, ids)
    pos = np.clip(pos, 0, max(n - 1, 0))
    return pos[rows[pos] == ids] if n else pos[:0]


def exact_search(vectors: np.ndarray, q: np.ndarray, depth: int,
                 allowed: np.ndarray | None = None) -> tuple[list[int], list[float]]:
    """The `depth` rows of `vectors` (any float dtype, memory-mapped) with the highest inner product
    with `q` among `allowed` ones, best first, ties by lower row; read a block at a time.

    >>> v = np.array([[1, 0], [0, 1], [0.6, 0.8], [1, 0]], np.float16)
    >>> exact_search(v, np.array([1, 0], np.float32), 2)
    ([0, 3], [1.0, 1.0])
    """
    keep_rows, keep_s = [], []
    for lo in range(0, len(vectors), BLOCK):
        s = np.asarray(vectors[lo:lo + BLOCK], np.float32) @ q
        rows = np.arange(lo, lo + len(s))
        if allowed is not None:
            ok = np.asarray(allowed[lo:lo + len(s)], bool)
            rows, s = rows[ok], s[ok]
        if depth < len(s):  # every row tied with the block's depth-th best stays: ties resolve by row
            kth = np.partition(s, len(s) - depth)[len(s) - depth]
            sel = s >= kth
            rows, s = rows[sel], s[sel]
        keep_rows.append(rows)
        keep_s.append(s)
    if not keep_rows:
        return [], []
    rows, s = np.concatenate(keep_rows), np.concatenate(keep_s)
    top = np.lexsort((rows, -s))[:depth]
    return rows[top].tolist(), [float(x) for x in s[top]]


def vector_dtype(asked: str | None, previous_gdir: str | None) -> str:
    """The storage dtype of a new generation's vectors: as asked, else the previous generation's
    (chosen once, kept by later runs), else float32."""
    if asked:
        if asked not in VECTOR_DTYPES:
            raise BadInput(f"unknown vector dtype {asked!r}; use {' or '.join(VECTOR_DTYPES)}.")
        return asked
    try:
        old = np.load(os.path.join(previous_gdir, "vectors.npy"), mmap_mode="r") if previous_gdir else None
    except (OSError, ValueError):
        old = None
    return "float16" if old is not None and old.dtype == np.float16 else "float32"


def write_vectors(gdir: str, kind: str, dtype: str = "float32") -> str:
    """Store gen-N/vectors.npy (written float32) as `dtype` (converted a block at a time, renamed
    into place) and write the faiss index `kind` needs (hnsw: faiss.index; flat: none, the mapped
    vectors are searched); returns the kind."""
    path = os.path.join(gdir, "vectors.npy")
    vectors = np.load(path, mmap_mode="r")
    if dtype != vectors.dtype.name:
        tmp = path + ".tmp.npy"
        out = np.lib.format.open_memmap(tmp, "w+", np.dtype(dtype), vectors.shape)
        for lo in range(0, len(vectors), BLOCK):
            out[lo:lo + BLOCK] = vectors[lo:lo + BLOCK]
        out.flush()
        del out
        os.replace(tmp, path)
        vectors = np.load(path, mmap_mode="r")
    index = os.path.join(gdir, "faiss.index")
    if kind == "flat":
        if os.path.exists(index):
            os.remove(index)
        return kind
    return write_faiss(index, vectors, kind)


def write_faiss(path: str, vectors: np.ndarray, kind: str) -> str:
    """Write an inner-product faiss index of `kind` (flat: exact; hnsw, over fp16 codes when the
    vectors are float16) atomically; returns the kind."""
    import faiss

    d = vectors.shape[1]
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind == "hnsw" and vectors.dtype == np.float16:
        index = faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_fp16, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
    else:
        raise BadInput(f"unknown index type {kind!r}; use auto, flat or hnsw.")
    for lo in range(0, len(vectors), BLOCK):  # added a block at a time: no float32 copy of them all
        part = np.ascontiguousarray(vectors[lo:lo + BLOCK], np.float32)
        if lo == 0 and not index.is_trained:
            index.train(part)  # fp16 codes need no statistics: training only marks the index ready
        index.add(part)
    faiss.write_index(index, path + ".tmp")
    os.replace(path + ".tmp", path)
    return kind


class FaissStore:
    """Vectors of one generation in its directory: vectors.npy (memory-mapped) and, for an HNSW
    index, faiss.index (its codes mapped too)."""

    def __init__(self, gdir: str, n: int, kind: str | None = None):
        self.gdir, self.n = gdir, n
        # flat: the mapped vectors are the index (a flat faiss.index of an older index is not read)
        self.exact = kind == "flat" or not os.path.exists(os.path.join(gdir, "faiss.index"))
        self._faiss = None
        self._vectors = None

    @property
    def faiss_index(self):
        if self._faiss is None:
            try:
                import faiss
            except ImportError:
                from llmkit.errors import MissingDependency

                raise MissingDependency("faiss-cpu", "rag") from None
            faiss.omp_set_num_threads(1)  # single queries: one thread is faster here (no fork/join)
            path = os.path.join(self.gdir, "faiss.index")
            try:  # vector codes stay on disk, mapped; only the graph is read
                self._faiss = faiss.read_index(path, faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
            except RuntimeError:  # an index type faiss cannot map
                self._faiss = faiss.read_index(path)
        return self._faiss

    def vectors(self) -> np.ndarray:
        """Every row's vector, memory-mapped, in the stored dtype (float32 or float16)."""
        if self._vectors is None:
            self._vectors = np.load(os.path.join(self.gdir, "vectors.npy"), mmap_mode="r")
        return self._vectors

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.vectors()[np.asarray(rows, np.int64)], np.float32)

    def search(self, q: np.ndarray, depth: int, allowed: np.ndarray | None) -> tuple[list[int], list[float]]:
        """Exact scores over few allowed rows or a flat index (mapped, block by block); else faiss
        HNSW, with the mask as an ID selector."""
        q2 = q.reshape(1, -1)
        if allowed is not None:
            rows = np.flatnonzero(allowed)
            if len(rows) == 0:
                return [], []
            if len(rows) <= EXACT_BELOW:
                s = np.asarray(self.vectors()[rows], np.float32) @ q
                top = np.lexsort((rows, -s))[:depth]
                return rows[top].tolist(), s[top].tolist()
        if self.exact:
            return exact_search(self.vectors(), q, depth, allowed)
        if allowed is not None:
            import faiss

            sel = faiss.IDSelectorBitmap(np.packbits(np.asarray(allowed, bool), bitorder="little"))
            params = (faiss.SearchParametersHNSW(sel=sel, efSearch=max(64, depth))
                      if isinstance(self.faiss_index, faiss.IndexHNSW) else faiss.SearchParameters(sel=sel))
            dist, idx = self.faiss_index.search(q2, min(depth, self.n), params=params)
        else:
            idx_obj = self.faiss_index
            if hasattr(idx_obj, "hnsw"):
                idx_obj.hnsw.efSearch = max(64, depth)
            dist, idx = idx_obj.search(q2, min(depth, self.n))
        keep = idx[0] >= 0
        return [int(i) for i in idx[0][keep]], [float(x) for x in dist[0][keep]]
