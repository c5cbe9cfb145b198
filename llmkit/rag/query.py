"""The query pipeline: pre-retrieval (routing, expansion, required terms, LLM rewriting, HyDE),
retrieval (BM25, dense, hybrid fusion by weighted RRF or a convex combination of normalised scores,
filters inside retrieval) and post-retrieval (parents, re-ranking). Models are passed in, loaded
once by the caller for a whole batch.

The fusion settings come from, in order: the caller's explicit values, the index's tuned choice
(`rag tune`, stored in its manifest), the built-in default (RRF 1:1, k 60)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from llmkit.errors import BadInput
from llmkit.rag.bm25 import tokenize
from llmkit.rag.fusion import METHODS, NORMS, fuse
from llmkit.rag.search import Hit, Index, dedupe_to_groups, detect_required

MODES = ("bm25", "dense", "hybrid")
RETRIEVERS = ("bm25", "dense", "graph")
# the built-in fusion; `rag tune` stores another choice in the manifest under "fusion"
DEFAULT_FUSION = {"method": "rrf", "k": 60, "weights": {"bm25": 1.0, "dense": 1.0}, "norm": "minmax",
                  "expand": 0, "parents": False}


def fusion_settings(manifest: dict, **given) -> tuple[dict, str]:
    """(settings, where they came from): explicit values (not None) over the index's tuned choice
    over the built-in default."""
    tuned = manifest.get("fusion") or {}
    out = {**DEFAULT_FUSION, **{k: v for k, v in tuned.items() if k in DEFAULT_FUSION}}
    source = "tuned" if tuned else "default"
    overrides = {k: v for k, v in given.items() if v is not None}
    if overrides:
        out.update(overrides)
        source = "flags" if source == "default" else "tuned + flags"
    return out, source


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

    def validate(self) -> None:
        if self.mode not in MODES:
            raise BadInput(f"unknown mode {self.mode!r}; use bm25, dense or hybrid.")
        if self.k < 1 or self.depth < 1:
            raise BadInput(f"-k and --depth must be positive (got {self.k}, {self.depth}).")
        for name, w in self.weights.items():
            if name not in RETRIEVERS or w < 0:
                raise BadInput(f"bad weight {name}={w}; use --weights bm25=W,dense=W[,graph=W] with W >= 0.")
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


def parse_weights(text: str) -> dict:
    """'bm25=0.3,dense=0.7' -> {'bm25': 0.3, 'dense': 0.7}."""
    out = {"bm25": 1.0, "dense": 1.0}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, val = part.partition("=")
        try:
            out[name.strip()] = float(val)
        except ValueError:
            raise BadInput(f"cannot read the weight {part!r}; write --weights bm25=0.3,dense=0.7.") from None
        if not sep:
            raise BadInput(f"cannot read the weight {part!r}; write --weights bm25=0.3,dense=0.7.")
    return out


def prf_terms(index: Index, tokens: list[str], n_terms: int, allowed=None, n_docs: int = 10,
              top=None, texts=None) -> list[tuple[str, float]]:
    """Pseudo-relevance feedback (RM3-style): the terms most probable in the top BM25 hits,
    weighted by each hit's normalised score, that are not in the query and occur in >= 2 chunks.
    `top` [(row, score)] and `texts` replace the index's own ranking and texts (the tuner's
    leave-one-sentence-out runs)."""
    top = top if top is not None else index.bm25.top_k(tokens, n_docs, allowed)
    if not top or n_terms <= 0:
        return []
    weights = np.array([s for _, s in top])
    weights = weights / weights.sum()
    acc: Counter = Counter()
    texts = texts if texts is not None else index.texts([r for r, _ in top])
    for (row, _), w, text in zip(top, weights, texts):
        toks = index.tok(text)
        if not toks:
            continue
        for t, c in Counter(toks).items():
            acc[t] += w * c / len(toks)
    bm = index.bm25
    q = set(tokens)
    out = []
    for t, p in acc.most_common():
        tid = bm.vocab.get(t)
        if t in q or tid is None or bm.indptr[tid + 1] - bm.indptr[tid] < 2 or bm.idf[tid] < 1.0:
            continue
        out.append((t, p * float(bm.idf[tid])))
        if len(out) == n_terms:
            break
    return out


def expand_tokens(index: Index, toks: list[str], weights: list[float], n_terms: int, allowed=None,
                  top=None, texts=None) -> tuple[list[str], list[float], list[str]]:
    """The BM25 query with `n_terms` feedback terms added at half the weight of the original words
    (RM3 interpolation): (tokens, weights, added terms)."""
    terms = prf_terms(index, toks, n_terms, allowed, top=top, texts=texts)
    if not terms:
        return toks, weights, []
    best = max(w for _, w in terms)
    return toks + [t for t, _ in terms], weights + [0.5 * w / best for _, w in terms], [t for t, _ in terms]


def expand_synonyms(tokens: list[str], query: str, synonyms: dict, tok=tokenize) -> list[str]:
    """Tokens of the synonyms of query words and phrases (phrases match on the lower-cased query)."""
    extra = []
    low = " ".join(query.lower().split())
    for head, alts in synonyms.items():
        if (" " in head and head in low) or any(t in tokens for t in tok(head)):
            for a in alts:
                extra.extend(t for t in tok(a) if t not in tokens and t not in extra)
    return extra


class Pipeline:
    """Answer queries against one index with the models loaded once."""

    def __init__(self, index: Index, opts: QueryOptions, llm=None, reranker=None, model: str | None = None,
                 runtime: str = "onnx"):
        opts.validate()
        self.index, self.opts, self.llm, self.reranker = index, opts, llm, reranker
        self.model, self.runtime = model, runtime
        if (opts.rewrite or opts.subqueries or opts.hyde) and llm is None:
            raise BadInput("--rewrite/--subqueries/--hyde need a local GGUF model (-m MODEL.gguf).")
        if opts.hyde and opts.mode == "bm25":
            raise BadInput("--hyde embeds a hypothetical answer; use it with --mode dense or hybrid.")
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
        allowed = _and(ix.filter_mask(o.filters), ix.collection_mask(o.collections))
        must = list(o.must) + (detect_required(query) if o.auto_must else [])
        if must:
            res.notes.append(f"required terms: {', '.join(repr(m) for m in must)}")
            allowed = _and(allowed, ix.must_mask(must))
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
            allowed = _and(allowed, self._route(variants, allowed, res))
        hyde_doc = None
        if o.hyde:
            hyde_doc = self.llm.complete(f"Write a short factual passage (3 sentences) that answers: {query}", 120)
            res.notes.append(f"HyDE passage: {hyde_doc!r}")
        lists = self._lists(variants, allowed, res, hyde_doc, o.depth)
        fused = self._fuse(lists)
        hits = [Hit(row, score, ranks) for row, score, ranks in fused]
        if self.reranker is not None:
            hits = self._rerank(query, hits)
        hits = ix.fetch(hits[:o.k])
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
                lists.append(("dense", o.weights.get("dense", 1.0), *ix.dense_list(qvecs[i], depth, allowed)))
        if o.weights.get("graph", 0.0) > 0:  # the entity-graph list (an index built with --graph)
            lists.append(("graph", o.weights.get("graph", 1.0), *ix.graph_list(variants[0], depth, allowed)))
        return lists

    def _fuse(self, lists):
        """Fuse the lists (parents first when returning parents); per-retriever ranks of each result."""
        ix, o = self.index, self.opts
        if o.parents:
            groups = ix.parent_rows()
            best_row: dict[int, int] = {}
            conv = []
            for name, w, rows, scores in lists:
                for r in rows:
                    g = int(groups[r])
                    best_row.setdefault(g, r)  # the first list's best chunk represents the parent
                conv.append((name, w, *dedupe_to_groups(rows, groups, scores)))
            lists = conv
        fused = fuse(lists, o.fusion, o.rrf_k, o.norm)
        ranks_of: dict[int, dict] = {}
        for name, _, ids, _ in lists:
            for r, d in enumerate(ids, 1):
                ranks_of.setdefault(d, {}).setdefault(name, r)
        out = []
        for d, s in fused:
            row = best_row[d] if o.parents else d
            out.append((row, s, ranks_of.get(d, {})))
        return out

    def _route(self, variants, allowed, res) -> np.ndarray:
        """Pick the collection(s) whose best-matching chunk matches best: per collection the top BM25
        score and the top dense cosine, each divided by its maximum over collections, averaged;
        collections within 85% of the best are searched. (Summing fused scores would favour big
        collections merely for having more chunks.)"""
        ix, o = self.index, self.opts
        n_c = len(ix.collections)
        evidence = []
        if o.mode in ("bm25", "hybrid"):
            s = ix.bm25.scores(ix.tok(variants[0]))
            if allowed is not None:
                s = np.where(allowed, s, 0.0)
            best = np.zeros(n_c)
            np.maximum.at(best, ix.collection, s)
            evidence.append(("bm25", best))
        if o.mode in ("dense", "hybrid"):
            emb = self.embedder()
            if emb.unknown_share(variants[0]) <= 0.5:
                q = self._query_vectors(variants[:1])[0]
                rows, sims = ix.dense_list(q, 50, allowed)  # the scores are the inner products
                best = np.full(n_c, -1.0)
                for r, sim in zip(rows, sims):
                    c = ix.collection[r]
                    best[c] = max(best[c], float(sim))
                evidence.append(("dense cosine", np.clip(best, 0, None)))
        score = np.zeros(n_c)
        used = 0
        for _, best in evidence:
            if best.max() > 0:
                score += best / best.max()
                used += 1
        if not used:
            res.notes.append("routing: no evidence, searching all collections")
            return np.ones(ix.n, bool)
        score /= used
        chosen = [int(i) for i in np.flatnonzero(score >= 0.85 * score.max())]
        order = np.argsort(-score)
        detail = "; ".join(f"{ix.collections[i]} {score[i]:.2f} (" + ", ".join(f"{name} {best[i]:.2f}" for name, best in evidence)
                           + ")" for i in order)
        res.notes.append(f"routing: {detail} -> {', '.join(ix.collections[i] for i in chosen)}")
        return np.isin(ix.collection, chosen)

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


def _and(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a & b
