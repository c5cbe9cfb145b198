"""The query pipeline: pre-retrieval (routing, expansion, required terms, LLM rewriting, HyDE),
retrieval (BM25, dense, graph lists with filters applied inside retrieval), fusion (weighted RRF or a
convex combination of normalised scores, `fusion.py`) and post-retrieval (parents, re-ranking).
Models are passed in, loaded once by the caller for a whole batch; `options.py` builds a pipeline
from what a caller asks for.

Documents are ranked as documents (indexes made since 2026-12; code: each definition is a unit):
each list is first mapped to its units before fusion and before the top k is cut, a unit taking the
rank and score of its best chunk in that list (MaxP; later chunks of the same unit are dropped), so
several chunks of one document never add up and one long document cannot fill the results; a hit
keeps that best chunk (its text, offsets and document id). Measured on Cranfield: summing the
reciprocal ranks of a document's chunks instead lost 0.07-0.14 nDCG@10 (hybrid 0.3303 vs 0.4048,
dense 0.2297 vs 0.3728: two chunks at ranks 30 and 31 beat one at rank 1). In the dense list a
unit's score then leans a quarter of the way toward its first chunk's (`lead_blend`): dense nDCG@10
Cranfield 0.3728 -> 0.3774, WordNet -> Webster 0.4670 -> 0.4751 (MiniLM over whole documents 0.3750
and 0.4679); code units are single chunks, unchanged. `chunks` returns raw chunk hits; `parents`
groups by parent instead (small-to-big).

The graph list (an index with an entity graph) joins the fusion at the weight `rag tune` chose for
it; asked for without one (`graph_rerank`), it only re-ranks inside the fused candidates: RRF of
the fused order (weight 1) and the graph's order of those candidates (`graph_rerank`), so it can
move a candidate but never bring one in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from llmkit.errors import BadInput
from llmkit.errors import OptionError
from llmkit.rag.index.reader import Index
from llmkit.rag.retrieve.expand import expand_synonyms, expand_tokens
from llmkit.rag.retrieve.filters import both, collection_mask, detect_required, filter_mask, must_mask
from llmkit.rag.retrieve.fusion import METHODS, NORMS, fuse
from llmkit.rag.retrieve.hits import Hit, dedupe_to_groups, fetch
from llmkit.rag.retrieve.route import route
from llmkit.rag.retrieve.settings import MODES, RETRIEVERS


LEAD = 0.25  # how far a unit's dense score moves from its best chunk's toward its first chunk's


def _blend(s_max: np.ndarray, s_first: np.ndarray) -> np.ndarray:
    return s_max - LEAD * (s_max - s_first)


def lead_blend(ix: Index, qvec: np.ndarray, rows: list[int], scores: list[float]) -> tuple[list[int], list[float]]:
    """A dense list of chunks as a list of units (module doc), each unit scored by its best chunk's
    inner product moved a quarter of the way toward its first chunk's: s = max - LEAD * (max - first).
    A document's opening states what it is about; a match deep inside a long document is weaker
    evidence that the document answers the question. Measured (nDCG@10, dense): Cranfield MaxP 0.3728,
    first chunk only 0.3743, LEAD 0.25 0.3774, 0.5 0.3771 (MiniLM over whole documents: 0.3750).
    The best chunk still stands for the unit in the hits."""
    if not rows:
        return rows, scores
    unit, lead = ix.unit, ix.lead
    seen: set[int] = set()
    best_rows, best = [], []
    for row, s in zip(rows, scores):  # each unit's first (best) row, as dedupe_to_groups keeps it
        g = int(unit[row])
        if g not in seen:
            seen.add(g)
            best_rows.append(row)
            best.append(s)
    firsts = np.array([lead[int(unit[r])] for r in best_rows], np.int64)
    s_max = np.asarray(best, np.float64)
    s_first = s_max.copy()
    other = firsts != np.asarray(best_rows, np.int64)
    if other.any():
        q = np.ascontiguousarray(qvec.reshape(-1), dtype=np.float32)
        s_first[other] = ix.vector_store.of_rows(firsts[other]) @ q
    blended = _blend(s_max, s_first)
    order = np.lexsort((np.arange(len(blended)), -blended))
    return [best_rows[i] for i in order], [float(blended[i]) for i in order]


def lead_blend_all(ix: Index, scores: np.ndarray, depth: int) -> tuple[list[int], list[float]]:
    """lead_blend over every row's score at once (`rag tune` scores all rows): the top `depth` units
    by blended score, each as its best row."""
    unit, lead = ix.unit, ix.lead
    n_units = len(lead)
    best = np.full(n_units, -np.inf)
    np.maximum.at(best, unit, scores)
    have = np.flatnonzero(lead >= 0)
    blended = np.full(n_units, -np.inf)
    blended[have] = _blend(best[have], scores[lead[have]])
    top = have[np.lexsort((have, -blended[have]))][:depth]
    order = np.lexsort((np.arange(len(scores)), -scores))  # best row of each unit: its first in score order
    best_row = np.full(n_units, -1, np.int64)
    seen = unit[order]
    first_pos = np.unique(seen, return_index=True)
    best_row[first_pos[0]] = order[first_pos[1]]
    return best_row[top].tolist(), blended[top].tolist()


@dataclass
class QueryOptions:
    mode: str = "hybrid"
    k: int = 10
    weights: dict = field(default_factory=lambda: {"bm25": 1.0, "dense": 1.0})
    rrf_k: int = 60
    fusion: str = "rrf"  # rrf | cc (convex combination of normalised scores)
    norm: str = "minmax"  # score normalisation for cc: minmax | z | dbsf | tmm
    depth: int = 100  # candidates taken from each retriever before fusion
    filters: list[str] = field(default_factory=list)
    collections: list[str] = field(default_factory=list)
    route: bool = False
    must: list[str] = field(default_factory=list)
    auto_must: bool = False
    synonyms: dict | None = None
    expand: int = 0  # pseudo-relevance-feedback terms added to the BM25 query
    rewrite: int = 0  # LLM paraphrases
    subqueries: bool = False
    hyde: bool = False
    parents: bool = False
    rerank_depth: int = 20
    chunks: bool = False  # raw chunk hits instead of one hit per document (code: per definition)
    graph_rerank: float = 0.0  # RRF weight of the graph list re-ranking the fused candidates (0: off)

    def validate(self) -> None:
        if self.mode not in MODES:
            raise BadInput(f"unknown mode {self.mode!r}; use bm25, dense or hybrid.")
        if self.k < 1 or self.depth < 1:
            raise OptionError("{k} and {depth} must be positive (got {k_value}, {depth_value}).", k_value=self.k,
                              depth_value=self.depth)
        for name, w in self.weights.items():
            if name not in RETRIEVERS or w < 0:
                raise OptionError("bad weight {name}={w}; use {weights} bm25=W,dense=W[,graph=W] with W >= 0.",
                                  name=name, w=w)
        if self.fusion not in METHODS:
            raise BadInput(f"unknown fusion {self.fusion!r}; use rrf or cc.")
        if self.norm not in NORMS:
            raise BadInput(f"unknown score normalisation {self.norm!r}; use {', '.join(NORMS)}.")


@dataclass
class QueryResult:
    query: str
    hits: list[Hit]
    notes: list[str] = field(default_factory=list)  # what the pre-retrieval steps decided (--explain)
    variants: list[str] = field(default_factory=list)
    seconds: float = 0.0


class Pipeline:
    """Answer queries against one index with the models loaded once."""

    def __init__(self, index: Index, opts: QueryOptions, llm=None, reranker=None, model: str | None = None,
                 runtime: str = "onnx"):
        opts.validate()
        self.index, self.opts, self.llm, self.reranker = index, opts, llm, reranker
        self.model, self.runtime = model, runtime
        if (opts.rewrite or opts.subqueries or opts.hyde) and llm is None:
            raise OptionError("{rewrite}/{subqueries}/{hyde} need a local GGUF model ({llm} MODEL.gguf).")
        if opts.hyde and opts.mode == "bm25":
            raise OptionError("{hyde} embeds a hypothetical answer; use it with {mode} dense or hybrid.")
        if opts.mode != "bm25" and index.n:
            self.embedder()  # load once up front, so per-query times measure retrieval, not model loading

    def embedder(self):
        return self.index.embedder(self.model, self.runtime)

    def run(self, query: str) -> QueryResult:
        t0 = time.perf_counter()
        o, ix = self.opts, self.index
        if not query.strip():
            raise BadInput("the query is empty.")
        res = QueryResult(query, [])
        self._qvec: dict[str, np.ndarray] = {}  # query vectors of this run (routing and retrieval share them)
        if ix.n == 0:
            raise BadInput(f"index '{ix.dir}' has no chunks to search. Add documents with llmkit rag index.")
        allowed = both(filter_mask(ix, o.filters), collection_mask(ix, o.collections))
        must = list(o.must) + (detect_required(query) if o.auto_must else [])
        if must:
            res.notes.append(f"required terms: {', '.join(repr(m) for m in must)}")
            allowed = both(allowed, must_mask(ix, must))
        if allowed is not None and not allowed.any():
            res.notes.append("no chunk passes the filters / required terms")
            res.seconds = time.perf_counter() - t0
            return res
        variants = [query]
        if o.rewrite:
            alts = self.llm.lines(f"Rewrite this search query in {o.rewrite} different ways, one per line, "
                                  f"keeping its meaning. Output only the queries.\n\nQuery: {query}", o.rewrite)
            variants += alts
            res.notes.append(f"rewrites: {alts}")
        if o.subqueries:
            subs = self.llm.lines("Break this question into at most 3 short, self-contained search queries, "
                                  f"one per line. Output only the queries.\n\nQuestion: {query}", 3)
            variants += subs
            res.notes.append(f"sub-queries: {subs}")
        res.variants = variants
        if o.route and len(ix.collections) > 1 and not o.collections:
            allowed = both(allowed, self._route(variants, allowed, res))
        hyde_doc = None
        if o.hyde:
            hyde_doc = self.llm.complete(f"Write a short factual passage (3 sentences) that answers: {query}", 120)
            res.notes.append(f"HyDE passage: {hyde_doc!r}")
        lists = self._lists(variants, allowed, res, hyde_doc, o.depth)
        fused = self._fuse(lists)
        if o.graph_rerank > 0 and fused:
            fused = self._graph_rerank(variants[0], fused, allowed)
        hits = [Hit(row, score, ranks) for row, score, ranks in fused]
        if self.reranker is not None:
            hits = self._rerank(query, hits)
        hits = fetch(ix, hits[:o.k])
        res.hits = hits
        res.seconds = time.perf_counter() - t0
        return res

    # -- steps -------------------------------------------------------------------------------------
    def _lists(self, variants, allowed, res, hyde_doc, depth):
        """[(retriever name, weight, ranked rows)] for every query variant."""
        o, ix = self.opts, self.index
        lists = []
        use_bm25 = o.mode in ("bm25", "hybrid") and o.weights.get("bm25", 1.0) > 0
        use_dense = o.mode in ("dense", "hybrid") and o.weights.get("dense", 1.0) > 0
        qvecs = None
        if use_dense:
            emb = self.embedder()
            unk = emb.unknown_share(variants[0])
            if unk > 0.5 and o.mode == "hybrid":
                res.notes.append(f"dense retriever skipped: the embedding model does not know {unk:.0%} of the "
                                 "query's word pieces (e.g. Chinese with an English-only model)")
                use_dense = False
            else:
                qvecs = self._query_vectors(variants)
                if hyde_doc:
                    h = emb.passages([hyde_doc])[0]
                    v = qvecs[0] + h
                    qvecs[0] = v / (np.linalg.norm(v) or 1.0)
        for i, q in enumerate(variants):
            if use_bm25:
                toks = ix.tok(q)
                weights = [1.0] * len(toks)
                if o.synonyms:
                    extra = expand_synonyms(toks, q, o.synonyms, ix.tok)
                    if extra:
                        res.notes.append(f"synonyms added: {extra}")
                    toks, weights = toks + extra, weights + [1.0] * len(extra)
                if o.expand:
                    toks, weights, added = expand_tokens(ix, toks, weights, o.expand, allowed)
                    if added:
                        res.notes.append(f"expansion terms: {added}")
                lists.append(("bm25", o.weights.get("bm25", 1.0), *ix.bm25_list(toks, depth, allowed, weights)))
            if use_dense:
                rows, scores = ix.dense_list(qvecs[i], depth, allowed)
                if not (o.parents or o.chunks) and ix.unit is not None:  # ranked as units
                    rows, scores = lead_blend(ix, qvecs[i], rows, scores)
                lists.append(("dense", o.weights.get("dense", 1.0), rows, scores))
        if o.weights.get("graph", 0.0) > 0:  # the entity-graph list (an index built with --graph)
            lists.append(("graph", o.weights.get("graph", 1.0), *ix.graph_list(variants[0], depth, allowed)))
        return lists

    def groups(self):
        """Row -> the unit results are ranked as: parents (`parents`), else documents and code
        definitions (indexes that record them), else None (raw chunks)."""
        if self.opts.parents:
            return self.index.parent_rows()
        return None if self.opts.chunks else self.index.unit

    def _fuse(self, lists):
        """Fuse the lists, each first mapped to its units (module doc); per-retriever ranks of each result."""
        o = self.opts
        groups = self.groups()
        best_row: dict[int, int] = {}
        if groups is not None:
            best_rank: dict[int, int] = {}
            conv = []
            for name, w, rows, scores in lists:
                for r, row in enumerate(rows):
                    g = int(groups[row])
                    if r < best_rank.get(g, 1 << 30):  # the unit's best-ranked chunk in any list stands for it
                        best_rank[g], best_row[g] = r, row
                conv.append((name, w, *dedupe_to_groups(rows, groups, scores)))
            lists = conv
        fused = fuse(lists, o.fusion, o.rrf_k, o.norm)
        ranks_of: dict[int, dict] = {}
        for name, _, ids, _ in lists:
            for r, d in enumerate(ids, 1):
                ranks_of.setdefault(d, {}).setdefault(name, r)
        out = []
        for d, s in fused:
            row = best_row[d] if groups is not None else d
            out.append((row, s, ranks_of.get(d, {})))
        return out

    def _graph_rerank(self, text, fused, allowed):
        """The fused candidates re-ranked by RRF with the graph list restricted to them (module doc)."""
        ix, o = self.index, self.opts
        rows, _ = ix.graph_list(text, o.depth, allowed)
        groups = self.groups()
        key = (lambda r: int(groups[r])) if groups is not None else int
        place = {key(row): i for i, (row, _, _) in enumerate(fused)}
        g_order = list(dict.fromkeys(key(r) for r in rows if key(r) in place))
        merged = fuse([("fused", 1.0, [key(row) for row, _, _ in fused], None),
                       ("graph", o.graph_rerank, g_order, None)], "rrf", 60)
        g_rank = {u: r for r, u in enumerate(g_order, 1)}
        out = []
        for u, s in merged:
            row, _, ranks = fused[place[u]]
            out.append((row, s, {**ranks, **({"graph": g_rank[u]} if u in g_rank else {})}))
        return out

    def _route(self, variants, allowed, res) -> np.ndarray:
        """The rows of the collection(s) the query matches best (`route.py`)."""
        dense = self.opts.mode != "bm25"
        mask, note = route(self.index, self.opts.mode, variants[0], allowed, self.embedder() if dense else None,
                           lambda: self._query_vectors(variants[:1])[0])
        res.notes.append(note)
        return mask

    def _query_vectors(self, texts: list[str]) -> np.ndarray:
        """Embeddings of query texts, each computed once per run (a copy: HyDE edits it)."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._qvec]
        if missing:
            self._qvec.update(zip(missing, self.embedder().queries(missing)))
        return np.stack([self._qvec[t] for t in texts])

    def _rerank(self, query: str, hits: list[Hit]) -> list[Hit]:
        depth = self.opts.rerank_depth
        head, tail = hits[:depth], hits[depth:]
        if not head:
            return hits
        texts = self.index.texts([h.row for h in head])
        scores = self.reranker.score(query, texts)
        for h, s in zip(head, scores):
            h.rerank = float(s)
        head = [h for _, h in sorted(enumerate(head), key=lambda x: (-x[1].rerank, x[0]))]
        return head + tail
