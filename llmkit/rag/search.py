"""Query an index: BM25, dense (faiss) and (optional) graph retrieval with metadata filters, required
terms and collection masks applied inside retrieval; the lists are fused by `fusion.py`.

When parents are returned, each list is first mapped to parents (a parent takes the rank and score
of its best chunk in that list, later chunks of the same parent are dropped), so several chunks of
one parent never add up.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from dataclasses import dataclass, field

import numpy as np

from llmkit.errors import BadInput
from llmkit.rag.bm25 import BM25Index, tokenize
from llmkit.rag.manifest import DB, read_manifest


def dedupe_to_groups(ids: list[int], group: np.ndarray, scores=None):
    """Map a ranked list of rows to their groups (parents), keeping each group's first (best) rank
    (and its score, when scores are given: then (groups, scores) is returned)."""
    seen, out, out_s = set(), [], []
    for i, d in enumerate(ids):
        g = int(group[d])
        if g not in seen:
            seen.add(g)
            out.append(g)
            if scores is not None:
                out_s.append(scores[i])
    return out if scores is None else (out, out_s)


_FILTER = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(>=|<=|!=|=|>|<|~)\s*(.*)$")


def parse_filter(expr: str) -> tuple[str, str, str]:
    """'date>=2025-01-01' -> ('date', '>=', '2025-01-01'); '~' is a substring match, '=' takes * globs."""
    m = _FILTER.match(expr)
    if not m:
        raise BadInput(f"cannot read the filter {expr!r}. Write FIELD=VALUE, FIELD!=VALUE, FIELD>=VALUE, "
                       "FIELD<VALUE or FIELD~TEXT (e.g. source=notes/*, 'date>=2025-01-01').")
    return m.group(1), m.group(2), m.group(3).strip().strip("'\"")


def _number(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


_IDENT = re.compile(r"\"([^\"]+)\"|“([^”]+)”|'([^']{3,})'|(\b\w+\(\))|(\b[A-Za-z]+_\w+\b)|(\b[a-z]+[A-Z]\w*\b)"
                    r"|(\b[A-Z][A-Z0-9]{1,}\b)|(\b(?=\w*\d)(?=\w*[A-Za-z])[\w.-]+\w\b)")
_STOP_CAPS = {"I", "A", "AN", "THE", "OR", "AND", "OF", "IN", "ON", "TO", "IS"}


def detect_required(query: str) -> list[str]:
    """Quoted phrases, identifiers (snake_case, camelCase, f(), ALLCAPS, words with digits) and
    capitalised names after the first word: the terms an answer must contain.

    >>> detect_required('How does "page cache" work with kmalloc() and CONFIG_SLUB in ext4 for Linus Torvalds?')
    ['page cache', 'kmalloc()', 'CONFIG_SLUB', 'ext4', 'Linus', 'Torvalds']
    """
    found = []
    for m in _IDENT.finditer(query):
        term = next(g for g in m.groups() if g)
        if term.upper() in _STOP_CAPS and term.isupper():
            continue
        found.append(term)
    spans = [m.span() for m in _IDENT.finditer(query)]
    for m in re.finditer(r"(?<=\S\s)([A-Z][a-z]{2,})\b", query):
        if not any(a <= m.start() < b for a, b in spans) and m.group(1) not in found:
            found.append(m.group(1))
    return found


def load_synonyms(path: str) -> dict[str, list[str]]:
    """Synonym file: `term: syn1, syn2` (one way) or `a, b, c` (all equivalent); '#' comments."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read the synonyms file '{path}' ({e}).") from None
    syn: dict[str, list[str]] = {}
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if ":" in line or "=>" in line:
            head, _, rest = line.replace("=>", ":").partition(":")
            heads, alts = [head.strip()], [a.strip() for a in rest.split(",") if a.strip()]
        else:
            heads = alts = [a.strip() for a in line.split(",") if a.strip()]
        if not heads or not alts:
            raise BadInput(f"{path}:{n}: cannot read {line!r}; write 'term: syn1, syn2' or 'a, b, c'.")
        for h in heads:
            syn.setdefault(h.lower(), []).extend(a for a in alts if a.lower() != h.lower())
    return syn


@dataclass
class Hit:
    row: int
    score: float
    ranks: dict = field(default_factory=dict)
    rerank: float | None = None
    chunk_id: int = 0
    parent_id: int = 0
    source: str = ""
    text: str = ""
    parent_text: str = ""
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"chunk_id": self.chunk_id, "parent_id": self.parent_id, "doc": self.source, "score": round(self.score, 6),
             "ranks": self.ranks, "text": self.text, "parent_text": self.parent_text, "meta": self.meta}
        if self.rerank is not None:
            d["rerank_score"] = round(self.rerank, 6)
        if self.meta.get("line_start"):  # code: where to open it
            d["line"] = self.meta["line_start"]
        return d


class Index:
    """A read-only view of one generation of an index directory."""

    def __init__(self, directory: str):
        self.dir = directory
        self.manifest = read_manifest(directory)
        gen = self.manifest["generation"]
        self.gdir = os.path.join(directory, f"gen-{gen}")
        try:
            self.rows = np.load(os.path.join(self.gdir, "rows.npy"))
            self.collection = np.load(os.path.join(self.gdir, "collection.npy"))
            self.parent = np.load(os.path.join(self.gdir, "parent.npy"))
        except (OSError, ValueError) as e:
            raise BadInput(f"index '{directory}' is damaged (generation {gen}: {e}). Rebuild it with llmkit rag index.") from None
        self.collections: list[str] = self.manifest.get("collection_order", [])
        self.con = sqlite3.connect(f"file:{os.path.join(directory, DB)}?mode=ro", uri=True)
        self._bm25: BM25Index | None = None
        self._faiss = None
        self._vstore = None
        self._embedder = None
        self._parent_rows = None
        self._graph = None
        self.stem = bool(self.manifest.get("stem", False))
        self.idents = bool(self.manifest.get("bm25_idents", False))  # indexes before 2026-11-30: plain words

    def tok(self, text: str) -> list[str]:
        """BM25 terms of a text, tokenized as the index was (stemmed or not)."""
        return tokenize(text, self.stem, self.idents)

    @property
    def n(self) -> int:
        return len(self.rows)

    def graph_list(self, text: str, depth: int, allowed=None, override=None) -> tuple[list[int], list[float]]:
        """(rows, graph scores) of the chunks reached from the query's entities in one or two hops."""
        return self.graph.top(text, depth, allowed, override)

    @property
    def graph(self):
        """The entity graph of this generation (an index built with --graph)."""
        if self._graph is None:
            if not self.has_graph or not os.path.isdir(os.path.join(self.gdir, "graph")):
                raise BadInput(f"index '{self.dir}' has no entity graph. Build it with: llmkit rag index "
                               f"{self.dir} FILES... --graph")
            from llmkit.rag.graph import Graph

            self._graph = Graph(os.path.join(self.gdir, "graph"))
        return self._graph

    @property
    def has_graph(self) -> bool:
        """Was the index built with --graph (an entity graph beside BM25 and vectors)?"""
        return bool(self.manifest.get("graph"))

    @property
    def bm25(self) -> BM25Index:
        if self._bm25 is None:
            self._bm25 = BM25Index.load(os.path.join(self.gdir, "bm25"))
        return self._bm25

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

    @property
    def vstore(self):
        """The served vector engine holding this index's vectors (indexes built with --store)."""
        if self._vstore is None:
            from llmkit.rag.vstore import open_store

            self._vstore = open_store(self.manifest["store"], self.dir)
        return self._vstore

    def vectors(self) -> np.ndarray:
        """Every row's vector, in row order (memory-mapped; read from the engine for --store indexes)."""
        if not self.manifest.get("store"):
            return np.load(os.path.join(self.gdir, "vectors.npy"), mmap_mode="r")
        got = self.vstore.vectors(self.manifest["store"]["collection"], self.rows.tolist())
        out = np.zeros((self.n, self.manifest.get("dim") or 0), np.float32)
        for i, cid in enumerate(self.rows.tolist()):
            out[i] = got[cid]
        return out

    def _dense_remote(self, q: np.ndarray, depth: int, allowed) -> tuple[list[int], list[float]]:
        """dense_list on a served engine: ids of this generation only (a mask goes to the engine as
        an id list, or, for very large masks, is applied to an over-fetched answer)."""
        from llmkit.rag.vstore import MAX_IN_FILTER

        ids, limit = None, depth + 32  # + rows removed but not yet deleted, which are dropped below
        if allowed is not None:
            rows = np.flatnonzero(allowed)
            if len(rows) == 0:
                return [], []
            if len(rows) <= MAX_IN_FILTER:
                ids = self.rows[rows]
            else:
                limit = min(16384, max(limit, int(limit * self.n / len(rows)) + 32))
        got, scores = self.vstore.search(self.manifest["store"]["collection"], q, limit,
                                         self.manifest["generation"], ids, ef=max(64, depth))
        out_r, out_s = [], []
        rows = self.rows_of_ids(got) if got else np.zeros(0, np.int64)
        row_of = dict(zip(self.rows[rows].tolist(), rows.tolist()))
        for cid, s in zip(got, scores):
            r = row_of.get(cid)
            if r is None or (allowed is not None and not allowed[r]):
                continue
            out_r.append(int(r))
            out_s.append(s)
            if len(out_r) == depth:
                break
        return out_r, out_s

    def embedder(self, model: str | None = None, runtime: str = "onnx"):
        """The index's embedding model at the index's precision on `runtime` (a different model must
        give the index's dimension)."""
        if self._embedder is None:
            from llmkit.rag.embed import load_embedder

            name = model or (None if self.manifest["model"] == "default" else self.manifest["model"])
            precision = self.manifest.get("embed_precision", "fp32")
            if runtime == "torch":
                precision = "fp32"  # int8 vectors are close to fp32 ones (cosine ~0.97+): searchable either way
            emb = load_embedder(name, runtime, precision, self.manifest.get("query_prompt", ""),
                                self.manifest.get("passage_prompt", ""))
            if self.manifest.get("dim") and emb.dim != self.manifest["dim"]:
                raise BadInput(f"the embedding model '{emb.name}' gives {emb.dim}-d vectors but index '{self.dir}' "
                               f"holds {self.manifest['dim']}-d ones. Query with the model it was built with.")
            self._embedder = emb
        return self._embedder

    # -- masks -------------------------------------------------------------------------------------
    def rows_of_ids(self, ids) -> np.ndarray:
        """Rows of these chunk ids (ids not in this generation are ignored)."""
        ids = np.asarray(sorted(ids), np.int64)
        pos = np.searchsorted(self.rows, ids)
        pos = np.clip(pos, 0, max(self.n - 1, 0))
        return pos[self.rows[pos] == ids] if self.n else pos[:0]

    def filter_mask(self, filters: list[str]) -> np.ndarray | None:
        """Rows whose metadata satisfies every filter (SQLite json_extract over the chunk metadata)."""
        if not filters:
            return None
        fields = set(self.manifest.get("fields", []))
        where, args = [], []
        for expr in filters:
            key, op, value = parse_filter(expr)
            if key not in fields:
                raise BadInput(f"unknown filter field '{key}'. Fields in this index: {', '.join(sorted(fields))}.")
            col = f"json_extract(meta, '$.\"{key}\"')"
            num = _number(value)
            if op == "~":
                where.append(f"instr(lower(CAST({col} AS TEXT)), lower(?)) > 0")
                args.append(value)
            elif op in ("=", "!=") and ("*" in value or "?" in value):
                where.append(("NOT " if op == "!=" else "") + f"CAST({col} AS TEXT) GLOB ?")
                args.append(value)
            elif num is not None:
                where.append(f"(typeof({col}) IN ('integer','real') AND {col} {op} ?"
                             f" OR typeof({col}) = 'text' AND CAST({col} AS REAL) {op} ? AND trim({col}) GLOB '[0-9.+-]*')")
                args.extend([num, num])
            else:
                where.append(f"CAST({col} AS TEXT) {op} ?")
                args.append(value)
        ids = [r for (r,) in self.con.execute(f"SELECT id FROM chunks WHERE {' AND '.join(where)}", args)]
        mask = np.zeros(self.n, bool)
        mask[self.rows_of_ids(ids)] = True
        return mask

    def collection_mask(self, names: list[str]) -> np.ndarray | None:
        if not names:
            return None
        unknown = [c for c in names if c not in self.collections]
        if unknown:
            raise BadInput(f"no collection '{unknown[0]}' in this index. Collections: {', '.join(self.collections) or 'none'}.")
        codes = [self.collections.index(c) for c in names]
        return np.isin(self.collection, codes)

    def must_mask(self, terms: list[str]) -> np.ndarray | None:
        """Rows containing every term (single words from the postings; phrases checked in the text)."""
        if not terms:
            return None
        mask = np.ones(self.n, bool)
        for term in terms:
            toks = self.tok(term)
            if not toks:
                continue
            m = np.zeros(self.n, bool)
            cand = None
            for t in set(toks):
                p = self.bm25.postings(t)
                cand = p if cand is None else np.intersect1d(cand, p, assume_unique=True)
            m[cand] = True
            m &= mask
            if len(toks) > 1 or not re.fullmatch(r"[\w]+", term):
                needle = term.lower()
                rows = np.flatnonzero(m)
                for r, text in zip(rows.tolist(), self.texts(rows)):
                    if needle not in " ".join(text.lower().split()):
                        m[r] = False
            mask &= m
        return mask

    # -- retrieval ---------------------------------------------------------------------------------
    def bm25_list(self, tokens: list[str], depth: int, allowed=None, weights=None) -> tuple[list[int], list[float]]:
        """(rows, BM25 scores), best first."""
        top = self.bm25.top_k(tokens, depth, allowed, weights)
        return [d for d, _ in top], [s for _, s in top]

    def dense_list(self, qvec: np.ndarray, depth: int, allowed=None) -> tuple[list[int], list[float]]:
        """(rows, inner products with the query vector), best first; a mask is applied inside the
        faiss search."""
        if self.n == 0:
            return [], []
        q = np.ascontiguousarray(qvec.reshape(1, -1), dtype=np.float32)
        if self.manifest.get("store"):
            return self._dense_remote(q[0], depth, allowed)
        if allowed is not None:
            rows = np.flatnonzero(allowed)
            if len(rows) == 0:
                return [], []
            if len(rows) <= 20000:  # few allowed rows: exact scores over them beat a filtered graph walk
                vecs = np.load(os.path.join(self.gdir, "vectors.npy"), mmap_mode="r")
                s = np.asarray(vecs[rows]) @ q[0]
                top = np.lexsort((rows, -s))[:depth]
                return rows[top].tolist(), s[top].tolist()
            import faiss

            sel = faiss.IDSelectorBitmap(np.packbits(allowed, bitorder="little"))
            params = (faiss.SearchParametersHNSW(sel=sel, efSearch=max(64, depth))
                      if isinstance(self.faiss_index, faiss.IndexHNSW) else faiss.SearchParameters(sel=sel))
            dist, idx = self.faiss_index.search(q, min(depth, self.n), params=params)
        else:
            idx_obj = self.faiss_index
            if hasattr(idx_obj, "hnsw"):
                idx_obj.hnsw.efSearch = max(64, depth)
            dist, idx = idx_obj.search(q, min(depth, self.n))
        keep = idx[0] >= 0
        return [int(i) for i in idx[0][keep]], [float(x) for x in dist[0][keep]]

    def parent_rows(self) -> np.ndarray:
        """Row -> dense parent index (for fusing at the parent level)."""
        if self._parent_rows is None:
            _, self._parent_rows = np.unique(self.parent, return_inverse=True)
        return self._parent_rows

    def fetch(self, hits: list[Hit], with_parent: bool = True) -> list[Hit]:
        """Fill in text, parent text and metadata of hits from SQLite."""
        if not hits:
            return hits
        ids = [int(self.rows[h.row]) for h in hits]
        got = {r[0]: r for r in self.con.execute(
            f"SELECT c.id, c.parent_id, d.source, c.text, c.meta, p.text FROM chunks c JOIN docs d ON d.id = c.doc_id "
            f"JOIN parents p ON p.id = c.parent_id WHERE c.id IN ({','.join('?' * len(ids))})", ids)}
        for h, cid in zip(hits, ids):
            r = got.get(cid)
            if r is None:
                continue
            h.chunk_id, h.parent_id, h.source, h.text = r[0], r[1], r[2], r[3]
            h.meta = json.loads(r[4])
            h.parent_text = r[5] if with_parent else ""
        return hits

    def texts(self, rows) -> list[str]:
        """Chunk texts of rows, in order (queried 900 ids at a time: SQLite caps bound variables)."""
        ids = [int(self.rows[r]) for r in rows]
        got: dict[int, str] = {}
        for lo in range(0, len(ids), 900):
            part = ids[lo:lo + 900]
            got.update(self.con.execute(f"SELECT id, text FROM chunks WHERE id IN ({','.join('?' * len(part))})", part))
        return [got.get(i, "") for i in ids]
