"""A read-only view of one generation of an index directory: its chunk rows, BM25, vectors (through
the vector-store protocol), entity graph and embedding model, loaded lazily, so a BM25 query never
touches faiss and no query imports the indexing code."""

from __future__ import annotations

import os
import sqlite3

import numpy as np

from llmkit.errors import BadInput
from llmkit.rag.embed.models import stored_model
from llmkit.rag.index.analysis import doc_terms, query_groups, query_terms
from llmkit.rag.index.bm25 import BM25Index
from llmkit.rag.index.catalog import chunk_texts
from llmkit.rag.index.manifest import DB, pin_generation, read_manifest
from llmkit.rag.index.segmented import open_bm25, open_vectors
from llmkit.rag.index.vectors import VectorStore, rows_of_ids


def unit_leads(unit: np.ndarray) -> np.ndarray:
    """Unit id -> the first row of that unit (-1 for an id no row has); the writer stores it as
    gen-N/lead.npy so that a query does not sort every row's unit.

    >>> unit_leads(np.array([2, 0, 2, 0, 3]))
    array([ 1, -1,  0,  4])
    """
    units, first = np.unique(unit, return_index=True)
    lead = np.full(int(units[-1]) + 1 if len(units) else 0, -1, np.int64)
    lead[units] = first
    return lead


class Index:
    """A read-only view of one generation of an index directory."""

    def __init__(self, directory: str):
        self.dir = directory
        for _ in range(50):  # a generation retired between reading the manifest and pinning it: again
            self.manifest = read_manifest(directory)
            gen = self.manifest["generation"]
            self.gdir = os.path.join(directory, f"gen-{gen}")
            self._pin, retired = pin_generation(self.gdir)  # held while this view lives
            if not retired:
                break
        else:
            raise BadInput(f"index '{directory}' changed generation 50 times while opening it. Run the query again.")
        try:  # mapped: opening reads no per-row array, whatever the index's size
            self.rows = np.load(os.path.join(self.gdir, "rows.npy"), mmap_mode="r")
            self.collection = np.load(os.path.join(self.gdir, "collection.npy"), mmap_mode="r")
            self.parent = np.load(os.path.join(self.gdir, "parent.npy"), mmap_mode="r")
        except (OSError, ValueError) as e:
            raise BadInput(f"index '{directory}' is damaged (generation {gen}: {e}). Rebuild it with llmkit rag index.") from None
        self.collections: list[str] = self.manifest["collection_order"]
        # one reader may serve calls from several threads (rag serve), one at a time
        self.con = sqlite3.connect(f"file:{os.path.join(directory, DB)}?mode=ro", uri=True, check_same_thread=False)
        self._bm25: BM25Index | None = None
        self._vstore = None
        self._vectors = None
        self._embedder = None
        self._parent_rows = None
        self._graph = None
        self.analysis = self.manifest["analysis"]
        self.idents = self.manifest["bm25_idents"]  # identifiers split into their words for BM25
        self._unit = None
        self._lead = None
        self._embedded = None

    def close(self) -> None:
        """Let go of the database, the vector store and the generation pin (a view is not used after)."""
        self.con.close()
        if self._vstore is not None:
            self._vstore.close()
            self._vstore = None
        if self._pin is not None:
            self._pin.close()
            self._pin = None

    def tok(self, text: str) -> list[str]:
        """BM25 terms of a query, analysed as the index's chunks were (`analysis.py`)."""
        return query_terms(text, self.analysis, self.idents)

    def tok_doc(self, text: str) -> list[str]:
        """BM25 terms of a chunk's text, as the index holds them."""
        return doc_terms(text, self.analysis, self.idents)

    def tok_groups(self, text: str) -> list[tuple[str, ...]]:
        """A query's words as groups of alternative terms (a word is present when any of them is)."""
        return query_groups(text, self.analysis, self.idents)

    @property
    def unit(self) -> np.ndarray | None:
        """Row -> the unit results are ranked as (a document; a code definition), or None for an
        index that ranks chunks (manifest `ranking`)."""
        if self._unit is None and self.manifest["ranking"] == "documents" and self.n:
            self._unit = np.load(os.path.join(self.gdir, "unit.npy"), mmap_mode="r")
        return self._unit

    @property
    def lead(self) -> np.ndarray | None:
        """Unit -> its first row (a document's opening chunk; chunks of a document are added in order),
        for indexes that rank units: gen-N/lead.npy mapped, or computed for a generation without it."""
        if self._lead is None and self.unit is not None and len(self.unit):
            path = os.path.join(self.gdir, "lead.npy")
            self._lead = np.load(path, mmap_mode="r") if os.path.exists(path) else unit_leads(self.unit)
        return self._lead

    @property
    def n(self) -> int:
        return len(self.rows)

    def graph_list(self, text: str, depth: int, allowed=None, override=None) -> tuple[list[int], list[float]]:
        """(rows, graph scores) of the chunks reached from the query's entities in one or two hops."""
        return self.graph.top(text, depth, allowed, override)

    @property
    def graph(self):
        """The entity graph of this generation (an index built with one)."""
        if self._graph is None:
            if not self.has_graph or not os.path.isdir(os.path.join(self.gdir, "graph")):
                raise BadInput(f"index '{self.dir}' has no entity graph. Build it with: llmkit rag index "
                               f"{self.dir} FILES... --graph")
            from llmkit.rag.index.graph import Graph

            self._graph = Graph(os.path.join(self.gdir, "graph"))
        return self._graph

    @property
    def has_graph(self) -> bool:
        """Was the index built with an entity graph beside BM25 and vectors?"""
        return bool(self.manifest["graph"])

    @property
    def bm25(self) -> BM25Index:
        """This generation's BM25 index (a segmented generation's behaves as one: `segmented.py`)."""
        if self._bm25 is None:
            self._bm25 = open_bm25(self.gdir, self.n)
        return self._bm25

    @property
    def vstore(self):
        """The served vector engine holding this index's vectors (indexes built with a store URI)."""
        if self._vstore is None:
            from llmkit.rag.index.milvus import open_store

            self._vstore = open_store(self.manifest["store"], self.dir)
        return self._vstore

    @property
    def vector_store(self) -> VectorStore:
        """This generation's vectors: faiss files in the index directory, or the served engine."""
        if self._vectors is None:
            if self.manifest["store"]:
                from llmkit.rag.index.milvus import MilvusVectors

                self._vectors = MilvusVectors(self)
            else:
                self._vectors = open_vectors(self.gdir, self.n, self.manifest["index"])
        return self._vectors

    def vectors(self) -> np.ndarray:
        """Every row's vector, in row order (memory-mapped; read from the engine for served stores)."""
        return self.vector_store.vectors()

    def rows_of_ids(self, ids) -> np.ndarray:
        """Rows of these chunk ids (ids not in this generation are ignored)."""
        return rows_of_ids(self.rows, ids)

    def embedder(self, model: str | None = None, runtime: str = "onnx", threads: int | None = None):
        """The index's embedding model at the index's precision on `runtime` (a different model must
        give the index's dimension), kept for this view's life (the first call's settings hold)."""
        if self._embedder is None:
            from llmkit.rag.embed.embedder import load_embedder
            from llmkit.rag.embed.models import check_query_model

            name = model or stored_model(self.manifest["model"])
            check_query_model(model, self.manifest["model"], self.dir)  # an endpoint index: the same model only
            precision = self.manifest["embed_precision"]
            if runtime == "torch":
                precision = "fp32"  # int8 vectors are close to fp32 ones: searchable either way
            emb = load_embedder(name, runtime, precision, self.manifest["query_prompt"],
                                self.manifest["passage_prompt"], threads=threads)
            if self.manifest["dim"] and emb.dim != self.manifest["dim"]:
                raise BadInput(f"the embedding model '{emb.name}' gives {emb.dim}-d vectors but index '{self.dir}' "
                               f"holds {self.manifest['dim']}-d ones. Query with the model it was built with.")
            self._embedder = emb
        return self._embedder

    # -- retrieval ---------------------------------------------------------------------------------
    def bm25_list(self, tokens: list[str], depth: int, allowed=None, weights=None) -> tuple[list[int], list[float]]:
        """(rows, BM25 scores), best first."""
        top = self.bm25.top_k(tokens, depth, allowed, weights)
        return [d for d, _ in top], [s for _, s in top]

    def dense_list(self, qvec: np.ndarray, depth: int, allowed=None) -> tuple[list[int], list[float]]:
        """(rows, inner products with the query vector), best first; a mask is applied inside the
        vector store's search."""
        if self.n == 0:
            return [], []
        embedded = self.embedded
        if embedded is not None:  # a searchable-first generation: rows without a vector yet are not candidates
            allowed = embedded if allowed is None else np.asarray(allowed, bool) & embedded
        q = np.ascontiguousarray(qvec.reshape(-1), dtype=np.float32)
        return self.vector_store.search(q, depth, allowed)

    @property
    def embedded(self) -> np.ndarray | None:
        """Which rows have their vector, in a generation published before its embedding ended; None
        when every row has one."""
        if self._embedded is None:
            path = os.path.join(self.gdir, "embedded.npy")
            self._embedded = np.load(path, mmap_mode="r") if os.path.exists(path) else False
        return None if self._embedded is False else np.asarray(self._embedded, bool)

    def parent_rows(self) -> np.ndarray:
        """Row -> dense parent index (for fusing at the parent level)."""
        if self._parent_rows is None:
            _, self._parent_rows = np.unique(self.parent, return_inverse=True)
        return self._parent_rows

    def texts(self, rows) -> list[str]:
        """Chunk texts of rows, in order."""
        ids = [int(self.rows[r]) for r in rows]
        got = chunk_texts(self.con, ids)
        return [got.get(i, "") for i in ids]
