"""Reading a segmented generation (written by `segments.py`): the BM25 index and the vectors of a
base (the last full build's, hard-linked) whose rows that are gone are dead, plus a small delta
holding the rows added since. A query sees one index over the generation's rows: each base row's
place among them is `base/row_of.npy` (-1: dead), each delta row's `delta/row_of.npy`; dead rows
are never candidates, and both segments score BM25 with the generation's global statistics (N,
mean length, each term's document frequency and idf), so scores equal a full build's.

    gen-N/segments.json      marks the generation segmented (rows of each part)
    gen-N/base/row_of.npy    base row -> row of the generation (-1: dead)
    gen-N/base/bm25/         the base's postings (linked) with idf.npy, df.npy, params.json of gen-N
    gen-N/base/vectors.npy   the base's vectors, and its faiss.index (linked)
    gen-N/delta/row_of.npy   delta row -> row of the generation
    gen-N/delta/bm25/        a BM25 index of the delta rows (global statistics; base_term.npy)
    gen-N/delta/vectors.npy  the delta rows' vectors, searched exactly
"""

from __future__ import annotations

import os

import numpy as np

from llmkit.rag.index.bm25 import BM25Index
from llmkit.rag.index.vectors import FaissStore, exact_search

SEGMENTS = "segments.json"


def is_segmented(gdir: str) -> bool:
    return os.path.exists(os.path.join(gdir, SEGMENTS))


def vectors_dir(gdir: str) -> str:
    """The directory holding the vectors.npy (and faiss.index) of a generation's (base) vectors."""
    return os.path.join(gdir, "base") if is_segmented(gdir) else gdir


def open_bm25(gdir: str, n: int):
    """The BM25 index of generation directory `gdir` (`n` rows), segmented or not."""
    return SegmentedBM25(gdir, n) if is_segmented(gdir) else BM25Index.load(os.path.join(gdir, "bm25"))


def open_vectors(gdir: str, n: int, kind: str | None):
    """The vector store of generation directory `gdir` (`n` rows) in the index directory."""
    return SegmentedVectors(gdir, n, kind) if is_segmented(gdir) else FaissStore(gdir, n, kind)


def _load(path: str) -> np.ndarray | None:
    return np.load(path, mmap_mode="r") if os.path.exists(path) else None


class _Parts:
    """The base's and the delta's rows within the generation."""

    def __init__(self, gdir: str, n: int):
        self.n = n
        self.base_rows = np.load(os.path.join(gdir, "base", "row_of.npy"))
        self.alive = self.base_rows >= 0
        self.all_alive = bool(self.alive.all())
        delta = _load(os.path.join(gdir, "delta", "row_of.npy"))
        self.delta_rows = np.zeros(0, np.int64) if delta is None else np.asarray(delta)

    def base_mask(self, allowed) -> np.ndarray | None:
        """Which base rows a search may return: alive and allowed (None: every one)."""
        if allowed is None:
            return None if self.all_alive else self.alive
        return self.alive & np.asarray(allowed, bool)[np.maximum(self.base_rows, 0)]

    def delta_mask(self, allowed) -> np.ndarray | None:
        return None if allowed is None else np.asarray(allowed, bool)[self.delta_rows]

    @staticmethod
    def merge(lists, k: int) -> list[tuple[int, float]]:
        """The k best (row, score) pairs of several lists, ties by lower row (a full build's order)."""
        got = [p for part in lists for p in part]
        got.sort(key=lambda p: (-p[1], p[0]))
        return got[:k]


class _Terms:
    """The generation's vocabulary, for `term in bm25.vocab`: the terms some row of it has."""

    def __init__(self, bm25: "SegmentedBM25"):
        self.bm25 = bm25

    def __contains__(self, term: str) -> bool:
        return self.bm25.doc_freq(term) > 0


class SegmentedBM25(_Parts):
    """BM25 over a segmented generation: the interface of `BM25Index` a query uses, in the
    generation's rows."""

    def __init__(self, gdir: str, n: int):
        super().__init__(gdir, n)
        self.base = BM25Index.load(os.path.join(gdir, "base", "bm25"))
        self.df = np.load(os.path.join(gdir, "base", "bm25", "df.npy"), mmap_mode="r")
        path = os.path.join(gdir, "delta", "bm25")
        self.delta = BM25Index.load(path) if os.path.isdir(path) else None
        self.k1, self.b, self.epsilon, self.avgdl = self.base.k1, self.base.b, self.base.epsilon, self.base.avgdl
        self.vocab = _Terms(self)

    @property
    def n_docs(self) -> int:
        return self.n

    def length_norm(self, doc_len):
        return self.base.length_norm(doc_len)

    def term_score(self, w, tf, norm):
        return self.base.term_score(w, tf, norm)

    score_text = BM25Index.score_text  # through term_idf and the shared statistics

    def doc_freq(self, term: str) -> int:
        t = self.base.vocab.get(term)
        if t is not None:
            return int(self.df[t])  # base and delta together
        return self.delta.doc_freq(term) if self.delta is not None else 0

    def term_idf(self, term: str) -> float | None:
        t = self.base.vocab.get(term)
        if t is not None and self.df[t] > 0:
            return float(self.base.idf[t])
        return self.delta.term_idf(term) if self.delta is not None else None

    def postings(self, term: str) -> np.ndarray:
        rows = self.base_rows[self.base.postings(term)]
        rows = rows[rows >= 0]
        if self.delta is not None:
            rows = np.concatenate([rows, self.delta_rows[self.delta.postings(term)]])
        return np.sort(rows)

    def scores(self, query: list[str], weights: list[float] | None = None) -> np.ndarray:
        out = np.zeros(self.n)
        s = self.base.scores(query, weights)
        out[self.base_rows[self.alive]] = s[self.alive]
        if self.delta is not None:
            out[self.delta_rows] = self.delta.scores(query, weights)
        return out

    def top_k(self, query: list[str], k: int = 10, allowed: np.ndarray | None = None,
              weights: list[float] | None = None) -> list[tuple[int, float]]:
        lists = [[(int(self.base_rows[d]), s) for d, s in self.base.top_k(query, k, self.base_mask(allowed), weights)]]
        if self.delta is not None:
            lists.append([(int(self.delta_rows[d]), s)
                          for d, s in self.delta.top_k(query, k, self.delta_mask(allowed), weights)])
        return self.merge(lists, k)


class SegmentedVectors(_Parts):
    """The vector-store protocol over a segmented generation: the base's store (flat or HNSW) asked
    for its alive rows, the delta's vectors searched exactly, the two lists merged by score."""

    def __init__(self, gdir: str, n: int, kind: str | None = None):
        super().__init__(gdir, n)
        self.base = FaissStore(os.path.join(gdir, "base"), len(self.base_rows), kind)
        self.delta = _load(os.path.join(gdir, "delta", "vectors.npy"))
        self._where = None

    def search(self, q: np.ndarray, depth: int, allowed: np.ndarray | None) -> tuple[list[int], list[float]]:
        rows, scores = self.base.search(q, depth, self.base_mask(allowed))
        lists = [[(int(self.base_rows[r]), s) for r, s in zip(rows, scores)]]
        if self.delta is not None and len(self.delta):
            rows, scores = exact_search(self.delta, q, depth, self.delta_mask(allowed))
            lists.append([(int(self.delta_rows[r]), s) for r, s in zip(rows, scores)])
        best = self.merge(lists, depth)
        return [r for r, _ in best], [s for _, s in best]

    def _positions(self) -> np.ndarray:
        """Row -> its base row, or -1 - its delta row."""
        if self._where is None:
            where = np.empty(self.n, np.int64)
            where[self.base_rows[self.alive]] = np.flatnonzero(self.alive)
            where[self.delta_rows] = -1 - np.arange(len(self.delta_rows))
            self._where = where
        return self._where

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        where = self._positions()[np.asarray(rows, np.int64)]
        base = self.base.vectors()
        out = np.zeros((len(where), base.shape[1]), np.float32)
        b = where >= 0
        out[b] = self.base.of_rows(where[b])
        if (~b).any():
            out[~b] = np.asarray(self.delta[-1 - where[~b]], np.float32)
        return out

    def vectors(self) -> np.ndarray:
        """Every row's vector in row order (assembled in memory: the tuner and `rag adapt` read them)."""
        return self.of_rows(np.arange(self.n))
