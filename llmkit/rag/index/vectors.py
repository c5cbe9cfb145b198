"""Where a generation's vectors live, behind one small protocol, and the default store: faiss files
in the index directory (gen-N/vectors.npy and gen-N/faiss.index). The other store is a served
Milvus engine (`milvus.py`); chunks, metadata and BM25 stay in the index directory either way.

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


def write_faiss(path: str, vectors: np.ndarray, kind: str) -> str:
    """Write an inner-product faiss index of `kind` (flat: exact; hnsw) atomically; returns the kind."""
    import faiss

    if kind == "flat":
        index = faiss.IndexFlatIP(vectors.shape[1])
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(vectors.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
    else:
        raise BadInput(f"unknown index type {kind!r}; use auto, flat or hnsw.")
    index.add(np.ascontiguousarray(vectors))
    faiss.write_index(index, path + ".tmp")
    os.replace(path + ".tmp", path)
    return kind


class FaissStore:
    """Vectors of one generation in its directory: vectors.npy (memory-mapped) and faiss.index."""

    def __init__(self, gdir: str, n: int):
        self.gdir, self.n = gdir, n
        self._faiss = None

    @property
    def faiss_index(self):
        if self._faiss is None:
            try:
                import faiss
            except ImportError:
                from llmkit.errors import MissingDependency

                raise MissingDependency("faiss-cpu", "rag") from None
            faiss.omp_set_num_threads(1)  # single queries: one thread is faster here (no fork/join)
            self._faiss = faiss.read_index(os.path.join(self.gdir, "faiss.index"))
        return self._faiss

    def vectors(self) -> np.ndarray:
        return np.load(os.path.join(self.gdir, "vectors.npy"), mmap_mode="r")

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.vectors()[np.asarray(rows, np.int64)], np.float32)

    def search(self, q: np.ndarray, depth: int, allowed: np.ndarray | None) -> tuple[list[int], list[float]]:
        """Exact scores over few allowed rows; else faiss, with the mask as an ID selector."""
        q2 = q.reshape(1, -1)
        if allowed is not None:
            rows = np.flatnonzero(allowed)
            if len(rows) == 0:
                return [], []
            if len(rows) <= EXACT_BELOW:
                s = np.asarray(self.vectors()[rows]) @ q
                top = np.lexsort((rows, -s))[:depth]
                return rows[top].tolist(), s[top].tolist()
            import faiss

            sel = faiss.IDSelectorBitmap(np.packbits(allowed, bitorder="little"))
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
