"""`rag tune`: choose an index's fusion from data and store it in the manifest.

No fixed fusion is right for every corpus (RRF 1:1 wins on Cranfield and loses to dense alone on a
library-science collection), so the index measures it:

1. Queries. Judged ones when given (`--queries/--qrels`, relevance per document). Otherwise
   pseudo-queries made from the corpus itself (inverse cloze): a sentence of a sampled chunk is the
   query and that chunk is the answer, matched *without* the sentence (its BM25 score and its
   vector are recomputed from the rest of the chunk), so the retrievers must find the passage a
   sentence came from, not the sentence; or a section heading / document title whose chunks are the
   answer; or, with a local GGUF (`llm_path`), a question the model writes for the chunk.
   Plain inverse cloze flatters BM25: the rest of a chunk repeats the sentence's own rare words,
   while real relevant documents miss many of a query's words (the vocabulary problem, Furnas et
   al. 1987; term mismatch, Zhao & Callan 2010). So each word of the query is also removed from the
   rest of the chunk with probability `mismatch` (`queries.MISMATCH`; docs/design/rag-defaults.md
   has the measurements that chose it).
2. Candidate lists are retrieved once per query (BM25, BM25 + feedback terms, dense, graph), then
   every configuration is scored from them: weighted RRF (dense share 0-1, k 20/60/100), convex
   combinations of min-max / z-score / distribution-based / theoretical-min-max normalised scores,
   each with and without query expansion and parent-level fusion (indexes that rank documents: each
   list mapped to documents before fusion, as queries do, and no parent variants).
3. Choice. The queries are split in two (seeded): the configurations are ranked on the first half;
   among those within one standard error (paired per-query differences) of the best, the simplest
   wins (differences within noise keep the simpler setting). The second half checks the choice: if
   it does worse there than the built-in default beyond noise, the default is kept; a choice made
   on pseudo-queries must even beat the default there by one standard error.
4. `rag index` runs this at the end of a run (`auto_tune`) on one pseudo-query per 20 chunks.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from llmkit.errors import BadInput
from llmkit.rag.evaluate.metrics import ndcg
from llmkit.rag.evaluate.queries import Query, document_keys
from llmkit.rag.index.reader import Index
from llmkit.rag.retrieve.expand import expand_tokens
from llmkit.rag.retrieve.fusion import NORMS, fuse
from llmkit.rag.retrieve.hits import dedupe_to_groups
from llmkit.rag.retrieve.options import Fusion
from llmkit.rag.retrieve.pipeline import lead_blend_all


@dataclass(frozen=True)
class Config:
    method: str  # rrf | cc
    w_dense: float  # dense share of the bm25/dense weight (0: BM25 alone, 1: dense alone)
    k: int = 60
    norm: str = "minmax"
    expand: int = 0
    parents: bool = False
    w_graph: float = 0.0

    def weights(self) -> dict:
        w = {"bm25": round(1.0 - self.w_dense, 3), "dense": round(self.w_dense, 3)}
        if self.w_graph:
            w["graph"] = round(self.w_graph, 3)
        return w

    def fusion(self) -> Fusion:
        return Fusion(method=self.method, rrf_k=self.k, weights=self.weights(), norm=self.norm, expand=self.expand,
                      parents=self.parents)

    def settings(self) -> dict:
        """The fusion as the manifest stores it."""
        return self.fusion().to_dict()

    def complexity(self) -> float:
        """Simplest first: the built-in default, single retrievers, weighted RRF, score fusion; each
        extra step (expansion, parents, the graph list) counts one more."""
        if self.method == "rrf" and self.w_dense == 0.5 and self.k == 60:
            base = 0.0
        elif self.w_dense in (0.0, 1.0):
            base = 0.5
        else:
            base = 1.0 if self.method == "rrf" else 2.0
        return base + (self.expand > 0) + self.parents + (self.w_graph > 0)

    def label(self) -> str:
        if self.w_dense in (0.0, 1.0) and not self.w_graph:
            head = "bm25" if self.w_dense == 0 else "dense"
        elif self.method == "rrf":
            head = f"rrf k{self.k} bm25 {1 - self.w_dense:.1f} dense {self.w_dense:.1f}"
        else:
            head = f"cc {self.norm} bm25 {1 - self.w_dense:.2f} dense {self.w_dense:.2f}"
        return head + (f" graph {self.w_graph:g}" if self.w_graph else "") + \
            (f" +expand {self.expand}" if self.expand else "") + (" +parents" if self.parents else "")


DEFAULT = Config("rrf", 0.5, 60)


def grid(expand: bool = True, parents: bool = True, graph: bool = False) -> list[Config]:
    """The search space (single retrievers included: tuning may find that one list alone is best)."""
    base = [Config("rrf", w, k) for w in (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0) for k in (20, 60, 100)]
    base = [c for c in base if c.w_dense not in (0.0, 1.0) or c.k == 60]
    base += [Config("cc", w, 60, n) for n in NORMS for w in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)]
    out = []
    for c in base:
        for e in ((0, 10) if expand else (0,)):
            if e and c.w_dense == 1.0:
                continue  # expansion changes only the BM25 list
            for p in ((False, True) if parents else (False,)):
                for g in ((0.0, 0.1, 0.25) if graph else (0.0,)):
                    out.append(Config(c.method, c.w_dense, c.k, c.norm, e, p, g))
    return out


def _top(scores: np.ndarray, mask: np.ndarray, depth: int) -> tuple[list[int], list[float]]:
    """The best `depth` rows among `mask`, ties by lower row."""
    cand = np.flatnonzero(mask)
    if len(cand) > depth:
        kth = np.partition(scores[cand], len(cand) - depth)[len(cand) - depth]
        cand = cand[scores[cand] >= kth]
    cand = cand[np.lexsort((cand, -scores[cand]))][:depth]
    return cand.tolist(), scores[cand].tolist()


def _bm25_list(index: Index, q: Query, toks, weights, depth):
    bm = index.bm25
    scores = bm.scores(toks, weights)
    mask = np.zeros(index.n, bool)
    for t, w in zip(toks, weights or [1.0] * len(toks)):
        if w != 0:
            mask[bm.postings(t)] = True
    if q.remainder is not None:
        s, hit = bm.score_text(index.tok_doc(q.remainder), toks, weights)
        scores[q.row], mask[q.row] = s, hit
    return _top(scores, mask, depth)


def collect(index: Index, embedder, queries: list[Query], depth: int = 100, expand: int = 10,
            graph: bool = False, progress=None) -> list[dict]:
    """Per query, the candidate lists every configuration is scored from: {name: (rows, scores)}."""
    vecs = index.vectors()
    qv = embedder.queries([q.text for q in queries])
    left_out = [i for i, q in enumerate(queries) if q.remainder is not None]
    rv = embedder.passages([queries[i].remainder for i in left_out]) if left_out else None
    rest_vec = {i: rv[j] for j, i in enumerate(left_out)}
    out = []
    for i, q in enumerate(queries):
        if progress:
            progress("retrieving", i, len(queries))
        toks = index.tok(q.text)
        lists = {"bm25": _bm25_list(index, q, toks, None, depth)}
        ds = np.asarray(vecs @ qv[i], dtype=np.float64)
        if i in rest_vec:
            ds[q.row] = float(rest_vec[i] @ qv[i])
        # as queries run: an index that ranks units scores each by lead_blend (pipeline module doc)
        lists["dense"] = lead_blend_all(index, ds, depth) if index.unit is not None else \
            _top(ds, np.ones(index.n, bool), depth)
        if expand:
            ids, sc = lists["bm25"]
            top = list(zip(ids[:10], sc[:10]))
            texts = index.texts([r for r, _ in top])
            if q.remainder is not None:
                texts = [q.remainder if r == q.row else t for (r, _), t in zip(top, texts)]
            xt, xw, _ = expand_tokens(index, toks, [1.0] * len(toks), expand, top=top, texts=texts)
            lists["bm25x"] = _bm25_list(index, q, xt, xw, depth)
        if graph:
            over = (q.row, index.graph.text_score(q.text, q.remainder)) if q.remainder is not None else None
            lists["graph"] = index.graph_list(q.text, depth, override=over)
        out.append(lists)
    return out


def score_config(c: Config, lists: list[dict], queries: list[Query], unit, groups, ranked_by=None) -> np.ndarray:
    """Per-query nDCG@10 of one configuration. `unit` maps a fused id to its judged unit (a row's,
    or with parent-level fusion a parent group's, parent id or document key). With `ranked_by`
    (row -> document unit: an index that ranks documents) each list is mapped to documents before
    fusion, as queries are, and `unit` maps document units."""
    out = np.zeros(len(queries))
    for i, (L, q) in enumerate(zip(lists, queries)):
        parts = []
        if c.w_dense < 1.0:
            parts.append(("bm25", 1.0 - c.w_dense, *L["bm25x" if c.expand else "bm25"]))
        if c.w_dense > 0.0:
            parts.append(("dense", c.w_dense, *L["dense"]))
        if c.w_graph > 0 and "graph" in L:
            parts.append(("graph", c.w_graph, *L["graph"]))
        if ranked_by is not None:  # the mapping depends on the list only: kept in L for the next config
            parts = [(n, w, *_mapped(L, n, c.expand, ranked_by)) for n, w, _, _ in parts]
        elif c.parents:
            parts = [(n, w, *dedupe_to_groups(ids, groups, sc)) for n, w, ids, sc in parts]
        ranked = list(dict.fromkeys(unit[d] for d, _ in fuse(parts, c.method, c.k, c.norm)[:60]))
        out[i] = ndcg(ranked, q.relevant)
    return out


def _mapped(L: dict, name: str, expand: bool, ranked_by) -> tuple[list, list]:
    """The list `name` of one query's lists L mapped to documents (computed once, stored in L)."""
    key = "bm25x" if name == "bm25" and expand else name
    got = L.get(key + "@docs")
    if got is None:
        ids, sc = L[key]
        got = L[key + "@docs"] = dedupe_to_groups(ids, ranked_by, sc)
    return got


@dataclass
class Row:
    config: str
    mean: float
    settings: dict
    complexity: float


@dataclass
class TuneReport:
    source: str  # "pseudo" | "judged"
    queries: int
    chosen: dict
    chosen_label: str
    tune_score: float
    heldout_score: float
    default_score: float
    default_heldout: float
    best_single: str
    best_single_heldout: float
    kept_default: bool
    top: list[Row] = field(default_factory=list)
    kinds: dict = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["top"] = [asdict(r) for r in self.top]
        return d


def choose(scores: dict, configs: list[Config], tune_idx: np.ndarray, hold_idx: np.ndarray, strict: bool = False):
    """(chosen, kept_default): the simplest configuration within one standard error of the best on
    the tuning half; the default instead when the choice is worse on the held-out half beyond noise
    (`strict`, for pseudo-queries: unless it beats the default there by at least one standard error)."""
    means = {c: float(scores[c][tune_idx].mean()) for c in configs}
    best = max(configs, key=lambda c: (means[c], -c.complexity()))
    ok = []
    for c in configs:
        d = scores[best][tune_idx] - scores[c][tune_idx]
        se = d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else 0.0
        if means[best] - means[c] <= se:
            ok.append(c)
    chosen = min(ok, key=lambda c: (c.complexity(), -means[c]))
    if len(hold_idx) > 1 and chosen != DEFAULT:
        d = scores[chosen][hold_idx] - scores[DEFAULT][hold_idx]
        se = d.std(ddof=1) / math.sqrt(len(d))
        if (d.mean() < se) if strict else (d.mean() < -se):
            return DEFAULT, True
    return chosen, False


def units_of(index: Index, source: str):
    """(unit, parent-group unit, ranked_by) for `score_config`: what a fused id is judged as."""
    groups = index.parent_rows()
    if index.unit is not None:  # documents: pseudo-queries name unit ids, judged ones document keys
        n_units = int(index.unit.max()) + 1 if index.n else 0
        if source != "judged":
            return list(range(n_units)), None, index.unit
        keys, per = document_keys(index), [""] * n_units
        for r, u in enumerate(index.unit.tolist()):
            per[u] = per[u] or keys[r]
        return per, None, index.unit
    if source == "judged":  # units: document keys; a parent group's is its first row's
        unit = document_keys(index)
        group_unit: dict[int, str] = {}
        for r, g in enumerate(groups.tolist()):
            group_unit.setdefault(g, unit[r])
        return unit, [group_unit[g] for g in range(len(group_unit))], None
    # units: parent ids (group g is the g-th distinct parent id)
    return [int(p) for p in index.parent.tolist()], [int(p) for p in np.unique(index.parent).tolist()], None


def tune(index: Index, embedder, queries: list[Query], source: str, seed: int = 0, expand: bool = True,
         progress=None) -> TuneReport:
    """Score the grid on `queries` and choose (module doc)."""
    t0 = time.perf_counter()
    # the graph list only with judged queries: a pseudo-query's own sentence put its entities next to
    # the rest of its chunk in the co-occurrence graph, which leaving the sentence out of the chunk's
    # score does not undo, so pseudo-queries overrate the graph list
    graph = index.has_graph and source == "judged"
    lists = collect(index, embedder, queries, expand=10 if expand else 0, graph=graph, progress=progress)
    groups = index.parent_rows()
    unit, gunit, ranked_by = units_of(index, source)
    configs = grid(expand=expand, parents=ranked_by is None, graph=graph)
    scores = {}
    for n, c in enumerate(configs):
        if progress:
            progress("scoring configurations", n, len(configs))
        scores[c] = score_config(c, lists, queries, gunit if c.parents else unit, groups, ranked_by)
    rng = np.random.default_rng(seed + 1)
    perm = rng.permutation(len(queries))
    half = len(queries) // 2
    tune_idx, hold_idx = np.sort(perm[:half]), np.sort(perm[half:])
    # pseudo-queries are a proxy: their choice must also win on the held-out half, or a choice that
    # only fits the tuning half's noise replaces the default
    chosen, kept = choose(scores, configs, tune_idx, hold_idx, strict=source != "judged")
    singles = [c for c in configs if c.w_dense in (0.0, 1.0) and not c.expand and not c.parents and not c.w_graph]
    best_single = max(singles, key=lambda c: scores[c][tune_idx].mean())
    ranked = sorted(configs, key=lambda c: -scores[c][tune_idx].mean())[:12]
    return TuneReport(
        source=source, queries=len(queries), chosen=chosen.settings(), chosen_label=chosen.label(),
        tune_score=float(scores[chosen][tune_idx].mean()), heldout_score=float(scores[chosen][hold_idx].mean()),
        default_score=float(scores[DEFAULT][tune_idx].mean()), default_heldout=float(scores[DEFAULT][hold_idx].mean()),
        best_single=best_single.label(), best_single_heldout=float(scores[best_single][hold_idx].mean()),
        kept_default=kept,
        top=[Row(c.label(), round(float(scores[c][tune_idx].mean()), 4), c.settings(), c.complexity()) for c in ranked],
        kinds=dict(Counter(q.kind for q in queries)), seconds=time.perf_counter() - t0)


def run_tune(index_dir: str, judged: tuple[str, str] | None = None, n_queries: int = 400, seed: int = 0,
             llm_path: str | None = None, expand: bool = True, runtime: str = "onnx", progress=None) -> TuneReport:
    """Tune the index in `index_dir` on judged queries (a queries file and a qrels file) or, without
    them, on `n_queries` pseudo-queries (questions a local model writes, with `llm_path`)."""
    from llmkit.rag.evaluate.queries import judged_from_files, pseudo_queries

    index = Index(index_dir)
    if index.n == 0:
        raise BadInput(f"index '{index_dir}' has no chunks. Add documents with llmkit rag index first.")
    emb = index.embedder(None, runtime)
    if judged:
        return tune(index, emb, judged_from_files(index, *judged), "judged", seed, expand=expand, progress=progress)
    llm = None
    if llm_path:
        from llmkit.rag.llm import LocalLLM

        llm = LocalLLM(llm_path)
    qs = pseudo_queries(index, n_queries, seed, llm, progress)
    return tune(index, emb, qs, "pseudo", seed, expand=expand, progress=progress)


AUTO_SHARE = 0.05  # auto-tuning makes one pseudo-query per 20 chunks: about a tenth of the indexing time
AUTO_MIN, AUTO_MAX = 50, 400  # fewer pseudo-queries cannot choose; more add time, not precision
RETUNE = 0.2  # tune again when the chunks changed by more than this share since the last tune


def auto_tune(directory: str, report, progress=None) -> dict:
    """Tune the fusion at the end of `rag index` on pseudo-queries when the index has enough chunks
    and changed by more than RETUNE since its last tune (a choice made on judged queries is kept):
    what was done, as a dict with a `why` line. The run's generation is already published and the
    choice is written atomically at the end, so an interrupted tune loses nothing."""
    t0 = time.perf_counter()
    index = Index(directory)
    n = index.n
    tuned = (index.manifest.get("fusion") or {}).get("tuned") or {}
    if tuned.get("source") == "judged":
        return {"done": False, "why": "kept the fusion tuned on judged queries (rag tune-reset drops it)"}
    if tuned.get("chunks"):
        was, changed = tuned["chunks"], report.chunks_added + report.docs_removed
        if changed <= RETUNE * was and abs(n - was) <= RETUNE * was:
            return {"done": False, "why": f"kept the tuned fusion: the corpus changed by less than {RETUNE:.0%}"}
    n_q = min(AUTO_MAX, int(n * AUTO_SHARE))
    from llmkit.rag.evaluate.queries import MIN_CHUNKS, pseudo_queries

    if n_q < max(AUTO_MIN, MIN_CHUNKS):
        return {"done": False, "why": f"too small to tune ({n} chunks, {int(AUTO_MIN / AUTO_SHARE)} needed): the "
                                      "fusion stays RRF 1:1"}
    try:
        qs = pseudo_queries(index, n_q, 0)
    except BadInput:
        return {"done": False, "why": "too few chunks with two or more sentences to make pseudo-queries: the fusion "
                                      "stays RRF 1:1"}
    rep = tune(index, index.embedder(), qs, "pseudo", 0, progress=progress)
    save_choice(directory, rep, chunks=n)
    return {"done": True, "queries": len(qs), "label": rep.chosen_label, "kept_default": rep.kept_default,
            "seconds": round(time.perf_counter() - t0, 2),
            "why": f"fusion tuned on {len(qs)} pseudo-queries: {rep.chosen_label}"
                   + (" (kept the default)" if rep.kept_default else "")}


def save_choice(directory: str, report: TuneReport, chunks: int | None = None) -> None:
    """Store the choice in the manifest (under the writer lock; read again inside it)."""
    from llmkit.rag.index.manifest import now, read_manifest, write_manifest, writer_lock

    with writer_lock(directory):
        m = read_manifest(directory)
        m["fusion"] = {**report.chosen, "tuned": {
            "date": now(), "source": report.source,
            "queries": report.queries, "label": report.chosen_label, "score": round(report.tune_score, 4),
            "heldout": round(report.heldout_score, 4), "default": round(report.default_score, 4),
            "default_heldout": round(report.default_heldout, 4), "kept_default": report.kept_default,
            "generation": m["generation"], **({"chunks": chunks} if chunks else {})}}
        write_manifest(directory, m)


def reset_choice(directory: str) -> bool:
    """Drop the stored choice; True when there was one."""
    from llmkit.rag.index.manifest import read_manifest, write_manifest, writer_lock

    with writer_lock(directory):
        m = read_manifest(directory)
        had = m.pop("fusion", None) is not None
        if had:
            write_manifest(directory, m)
    return had

