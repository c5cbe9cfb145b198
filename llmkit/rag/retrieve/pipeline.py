"""The query pipeline: pre-retrieval (routing, expansion, required terms, LLM rewriting, HyDE),
retrieval (BM25, dense, graph lists with filters applied inside retrieval), fusion (weighted RRF or a
convex combination of normalised scores, `fusion.py`) and post-retrieval (parents, re-ranking).
Models are passed in, loaded once by the caller for a whole batch; `options.py` declares what a
caller asks for and builds a pipeline from it.

Results are ranked as units: documents, and in code each definition (indexes whose manifest says
`ranking: documents`). Each list is first mapped to its units before fusion and before the top k is
cut, a unit taking the rank and score of its best chunk in that list (MaxP), so several chunks of one
document never add up and one long document cannot fill the results. In the dense list a unit's
score then leans a quarter of the way toward its first chunk's (`lead_blend`): a document's opening
says what it is about. The chunk a hit shows for its unit is the unit's best chunk under the same
fusion run over the chunk lists (`best_rows`), so the passage agrees with both retrievers, not with
whichever list ranked one of its chunks highest. `chunks` returns raw chunk hits; `parents` groups
by parent instead (small-to-big). docs/design/rag-defaults.md has the measurements behind these
choices.

The graph list (an index with an entity graph) joins the fusion at the weight `rag tune` chose for
it; asked for without one (`graph_rerank`), it only re-ranks inside the fused candidates: RRF of
the fused order (weight 1) and the graph's order of those candidates (`graph_rerank`), so it can
move a candidate but never bring one in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from llmkit.errors import BadInput, OptionError
from llmkit.rag.index.reader import Index
from llmkit.rag.retrieve.expand import expand_synonyms, expand_tokens, load_synonyms
from llmkit.rag.retrieve.filters import both, collection_mask, detect_required, filter_mask, must_mask
from llmkit.rag.retrieve.fusion import fuse
from llmkit.rag.retrieve.hits import Hit, dedupe_to_groups, fetch
from llmkit.rag.retrieve.options import GRAPH_RERANK, QueryOptions, resolve_fusion
from llmkit.rag.retrieve.route import route

LEAD = 0.25  # how far a unit's dense score moves from its best chunk's toward its first chunk's


def _blend(s_max: np.ndarray, s_first: np.ndarray) -> np.ndarray:
    return s_max - LEAD * (s_max - s_first)


def lead_blend(ix: Index, qvec: np.ndarray, rows: list[int], scores: list[float]) -> tuple[list[int], list[float]]:
    """A dense list of chunks as a list of units (module doc), each unit scored by its best chunk's
    inner product moved a quarter of the way toward its first chunk's: s = max - LEAD * (max - first).
    A document's opening states what it is about; a match deep inside a long document is weaker
    evidence that the document answers the question."""
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
class QueryResult:
    query: str
    hits: list[Hit]
    notes: list[str] = field(default_factory=list)  # what the pre-retrieval steps decided (--explain)
    variants: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Ranked:
    """One retriever's list for one query variant: chunk rows best first with their scores, and,
    when results are ranked as units and the retriever scores units its own way (the dense list's
    lead blend), that unit-level list."""

    name: str
    weight: float
    rows: list[int]
    scores: list[float]
    units: tuple[list[int], list[float]] | None = None

    def chunk_list(self) -> tuple:
        return self.name, self.weight, self.rows, self.scores

    def unit_list(self, groups: np.ndarray) -> tuple:
        """(name, weight, unit ids, scores): each unit at its best row's rank (module doc)."""
        rows, scores = self.units or (self.rows, self.scores)
        return (self.name, self.weight, *dedupe_to_groups(rows, groups, scores))


class Pipeline:
    """Answer queries against one index with the models loaded once. The options are the caller's;
    what follows from them and the index (the fusion to run and where it came from, the graph
    list's re-ranking weight, the synonyms) is resolved here, once."""

    def __init__(self, index: Index, opts: QueryOptions, llm=None, reranker=None):
        opts.validate()
        self.index, self.opts, self.llm, self.reranker = index, opts, llm, reranker
        if opts.steps.need_llm and llm is None:
            raise OptionError("{rewrite}/{subqueries}/{hyde} need a local GGUF model ({llm} MODEL.gguf).")
        self.fusion, self.fusion_source = resolve_fusion(opts, index.manifest)
        self.graph_rerank = 0.0
        if opts.graph and "graph" not in self.fusion.weights:  # no tuned or given weight: re-rank only
            self.graph_rerank = GRAPH_RERANK if opts.graph is True else float(opts.graph)
            index.graph  # noqa: B018 -- an index without a graph says how to build one
        self.synonyms = load_synonyms(opts.filters.synonyms) if opts.filters.synonyms else None
        if opts.mode != "bm25" and index.n:
            self.embedder()  # load once up front, so per-query times measure retrieval, not model loading

    def embedder(self):
        return self.index.embedder(self.opts.model, self.opts.runtime)

    def run(self, query: str) -> QueryResult:
        t0 = time.perf_counter()
        o, ix = self.opts, self.index
        if not query.strip():
            raise BadInput("the query is empty.")
        res = QueryResult(query, [])
        self._qvec: dict[str, np.ndarray] = {}  # query vectors of this run (routing and retrieval share them)
        if ix.n == 0:
            raise BadInput(f"index '{ix.dir}' has no chunks to search. Add documents with llmkit rag index.")
        allowed = self._restrictions(query, res)
        if allowed is not None and not allowed.any():
            res.notes.append("no chunk passes the filters / required terms")
            res.seconds = time.perf_counter() - t0
            return res
        variants = self._variants(query, res)
        if o.filters.route and len(ix.collections) > 1 and not o.filters.collections:
            allowed = both(allowed, self._route(variants, allowed, res))
        hyde_doc = None
        if o.steps.hyde:
            hyde_doc = self.llm.complete(f"Write a short factual passage (3 sentences) that answers: {query}", 120)
            res.notes.append(f"HyDE passage: {hyde_doc!r}")
        fused = self._fuse(self._lists(variants, allowed, res, hyde_doc, o.candidates))
        if self.graph_rerank > 0 and fused:
            fused = self._graph_rerank(variants[0], fused, allowed)
        hits = [Hit(row, score, ranks) for row, score, ranks in fused]
        if self.reranker is not None:
            hits = self._rerank(query, hits, res)
        res.hits = fetch(ix, hits[:o.k])
        res.seconds = time.perf_counter() - t0
        return res

    # -- steps -------------------------------------------------------------------------------------
    def _restrictions(self, query: str, res: QueryResult):
        """The rows the filters, collections and required terms allow (None: all)."""
        f, ix = self.opts.filters, self.index
        allowed = both(filter_mask(ix, f.filters), collection_mask(ix, f.collections))
        must = list(f.must) + (detect_required(query) if f.auto_must else [])
        if must:
            res.notes.append(f"required terms: {', '.join(repr(m) for m in must)}")
            allowed = both(allowed, must_mask(ix, must))
        return allowed

    def _variants(self, query: str, res: QueryResult) -> list[str]:
        """The query and what the LLM steps add to it (paraphrases, sub-queries)."""
        st = self.opts.steps
        variants = [query]
        if st.rewrite:
            alts = self.llm.lines(f"Rewrite this search query in {st.rewrite} different ways, one per line, "
                                  f"keeping its meaning. Output only the queries.\n\nQuery: {query}", st.rewrite)
            variants += alts
            res.notes.append(f"rewrites: {alts}")
        if st.subqueries:
            subs = self.llm.lines("Break this question into at most 3 short, self-contained search queries, "
                                  f"one per line. Output only the queries.\n\nQuestion: {query}", 3)
            variants += subs
            res.notes.append(f"sub-queries: {subs}")
        res.variants = variants
        return variants

    def _lists(self, variants, allowed, res, hyde_doc, depth) -> list[Ranked]:
        """Every retriever's list for every query variant."""
        o, ix, w = self.opts, self.index, self.fusion.weights
        lists = []
        use_bm25 = o.mode in ("bm25", "hybrid") and w.get("bm25", 1.0) > 0
        use_dense = o.mode in ("dense", "hybrid") and w.get("dense", 1.0) > 0
        qvecs = self._dense_vectors(variants, res, hyde_doc) if use_dense else None
        for i, q in enumerate(variants):
            if use_bm25:
                toks, weights = self._bm25_terms(q, allowed, res)
                lists.append(Ranked("bm25", w.get("bm25", 1.0), *ix.bm25_list(toks, depth, allowed, weights)))
            if qvecs is not None:
                rows, scores = ix.dense_list(qvecs[i], depth, allowed)
                units = None
                if not (self.fusion.parents or o.chunks) and ix.unit is not None:  # ranked as units
                    units = lead_blend(ix, qvecs[i], rows, scores)
                lists.append(Ranked("dense", w.get("dense", 1.0), rows, scores, units))
        if w.get("graph", 0.0) > 0:  # the entity-graph list (an index built with --graph)
            lists.append(Ranked("graph", w["graph"], *ix.graph_list(variants[0], depth, allowed)))
        return lists

    def _dense_vectors(self, variants, res, hyde_doc):
        """Query vectors of the variants (HyDE's passage added to the first), or None when the model
        does not know most of the query's word pieces (hybrid then runs BM25 alone)."""
        emb = self.embedder()
        unk = emb.unknown_share(variants[0])
        if unk > 0.5 and self.opts.mode == "hybrid":
            res.notes.append(f"dense retriever skipped: the embedding model does not know {unk:.0%} of the "
                             "query's word pieces (e.g. Chinese with an English-only model)")
            return None
        qvecs = self._query_vectors(variants)
        if hyde_doc:
            v = qvecs[0] + emb.passages([hyde_doc])[0]
            qvecs[0] = v / (np.linalg.norm(v) or 1.0)
        return qvecs

    def _bm25_terms(self, q, allowed, res):
        """(terms, weights) of one query variant for BM25: its own, the synonyms', the feedback terms."""
        ix = self.index
        toks = ix.tok(q)
        weights = [1.0] * len(toks)
        if self.synonyms:
            extra = expand_synonyms(toks, q, self.synonyms, ix.tok)
            if extra:
                res.notes.append(f"synonyms added: {extra}")
            toks, weights = toks + extra, weights + [1.0] * len(extra)
        if self.fusion.expand:
            toks, weights, added = expand_tokens(ix, toks, weights, self.fusion.expand, allowed)
            if added:
                res.notes.append(f"expansion terms: {added}")
        return toks, weights

    def groups(self):
        """Row -> the unit results are ranked as: parents (`parents`), else documents and code
        definitions (indexes that record them), else None (raw chunks)."""
        if self.fusion.parents:
            return self.index.parent_rows()
        return None if self.opts.chunks else self.index.unit

    def _fuse(self, lists: list[Ranked]):
        """(row, fused score, per-retriever ranks) best first. Ranked as units, each list is first
        mapped to its units (module doc), and the row that stands for a unit is its best chunk under
        the same fusion of the chunk lists."""
        f = self.fusion
        groups = self.groups()
        if groups is None:
            return self._with_ranks(fuse([r.chunk_list() for r in lists], f.method, f.rrf_k, f.norm),
                                    [r.chunk_list() for r in lists], lambda d: d)
        unit_lists = [r.unit_list(groups) for r in lists]
        passage = best_rows(fuse([r.chunk_list() for r in lists], f.method, f.rrf_k, f.norm), groups)
        return self._with_ranks(fuse(unit_lists, f.method, f.rrf_k, f.norm), unit_lists, passage.__getitem__)

    @staticmethod
    def _with_ranks(fused, lists, row_of):
        ranks_of: dict[int, dict] = {}
        for name, _, ids, _ in lists:
            for r, d in enumerate(ids, 1):
                ranks_of.setdefault(d, {}).setdefault(name, r)
        return [(row_of(d), s, ranks_of.get(d, {})) for d, s in fused]

    def _graph_rerank(self, text, fused, allowed):
        """The fused candidates re-ranked by RRF with the graph list restricted to them (module doc)."""
        ix = self.index
        rows, _ = ix.graph_list(text, self.opts.candidates, allowed)
        groups = self.groups()
        key = (lambda r: int(groups[r])) if groups is not None else int
        place = {key(row): i for i, (row, _, _) in enumerate(fused)}
        g_order = list(dict.fromkeys(key(r) for r in rows if key(r) in place))
        merged = fuse([("fused", 1.0, [key(row) for row, _, _ in fused], None),
                       ("graph", self.graph_rerank, g_order, None)], "rrf", 60)
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

    def _rerank(self, query: str, hits: list[Hit], res: QueryResult) -> list[Hit]:
        depth = self.opts.steps.rerank_depth
        head, tail = hits[:depth], hits[depth:]
        if not head:
            return hits
        texts = self.index.texts([h.row for h in head])
        t = time.perf_counter()
        scores = self.reranker.score(query, texts)
        res.notes.append(f"re-ranked the top {len(head)} in {time.perf_counter() - t:.2f} s")
        for h, s in zip(head, scores):
            h.rerank = float(s)
        head = [h for _, h in sorted(enumerate(head), key=lambda x: (-x[1].rerank, x[0]))]
        return head + tail


def best_rows(fused_rows: list[tuple[int, float]], groups: np.ndarray) -> dict[int, int]:
    """Unit -> its first row in a fused list of rows: the unit's best chunk under that fusion.

    >>> best_rows([(5, 0.9), (2, 0.8), (7, 0.5)], np.array([0, 0, 1, 0, 0, 1, 0, 0]))
    {1: 5, 0: 7}
    """
    out: dict[int, int] = {}
    for row, _ in fused_rows:
        out.setdefault(int(groups[row]), row)
    return out


def build_pipeline(index, opts: QueryOptions, need_llm: bool = False, llms: dict | None = None):
    """(Pipeline, the local LLM or None) for `opts` over `index` (an `Index`, or the directory to
    open); the LLM is loaded when a step or the caller (`need_llm`) needs it, once per path in `llms`
    (a cache a long-lived caller keeps), and shared with an llm: re-ranker."""
    opts.validate()
    if not isinstance(index, Index):
        index = Index(index)
    st = opts.steps
    cache = {} if llms is None else llms

    def llm_factory(path=None):
        key = path or st.llm_path
        if key not in cache:
            from llmkit.rag.remote_llm import open_llm

            cache[key] = open_llm(key)  # a local GGUF or an OpenAI-compatible endpoint
        return cache[key]

    llm = llm_factory() if (st.need_llm or need_llm) else None
    reranker = None
    if st.rerank:
        from llmkit.rag.retrieve.rerank import make_reranker

        reranker = make_reranker(st.rerank, llm_factory)
    return Pipeline(index, opts, llm=llm, reranker=reranker), llm
