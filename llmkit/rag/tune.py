"""`rag tune`: choose an index's fusion from data and store it in the manifest.

No fixed fusion is right for every corpus (RRF 1:1 wins on Cranfield and loses to dense alone on a
library-science collection), so the index measures it:

1. Queries. Judged ones when given (`--queries/--qrels`, relevance per document). Otherwise
   pseudo-queries made from the corpus itself (inverse cloze): a sentence of a sampled chunk is the
   query and that chunk is the answer, matched *without* the sentence (its BM25 score and its
   vector are recomputed from the rest of the chunk), so the retrievers must find the passage a
   sentence came from, not the sentence; or a section heading / document title whose chunks are the
   answer; or, with a local GGUF (`-m`), a question the model writes for the chunk.
   Plain inverse cloze flatters BM25: the rest of a chunk repeats the sentence's own rare words,
   while real relevant documents miss many of a query's words (the vocabulary problem, Furnas et
   al. 1987; term mismatch, Zhao & Callan 2010). So each word of the query is also removed from the
   rest of the chunk with probability `mismatch` (0.5, chosen from that literature, not fitted).
   Measured (benchmarks/rag_tune_bench.py): on Cranfield plain inverse cloze chose a BM25-leaning
   fusion that lost 0.008 nDCG@10 to RRF 1:1 on the real queries; with mismatch 0.5 the choice is
   +0.013 over the best single retriever; on a WordNet-to-Webster collection +0.05.
2. Candidate lists are retrieved once per query (BM25, BM25 + feedback terms, dense, graph), then
   every configuration is scored from them: weighted RRF (dense share 0-1, k 20/60/100), convex
   combinations of min-max / z-score / distribution-based / theoretical-min-max normalised scores,
   each with and without query expansion and parent-level fusion.
3. Choice. The queries are split in two (seeded): the configurations are ranked on the first half;
   among those within one standard error (paired per-query differences) of the best, the simplest
   wins (differences within noise keep the simpler setting). The second half checks the choice: if
   it does worse there than the built-in default beyond noise, the default is kept.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from llmkit.errors import BadInput
from llmkit.rag.fusion import NORMS, fuse
from llmkit.rag.search import Index, dedupe_to_groups

MIN_CHUNKS = 30  # fewer usable chunks cannot make a meaningful set of pseudo-queries
_SENT_SPLIT = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+|(?<=[。！？；])\s*|\n\s*\n")


@dataclass
class Query:
    text: str
    relevant: dict  # unit -> grade (parents for pseudo-queries, document keys for judged ones)
    row: int = -1  # the chunk a pseudo-query was made from
    remainder: str | None = None  # that chunk's text without the query sentence
    kind: str = "judged"


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

    def settings(self) -> dict:
        return {"method": self.method, "k": self.k, "weights": self.weights(), "norm": self.norm,
                "expand": self.expand, "parents": self.parents}

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


# -- queries -----------------------------------------------------------------------------------------

def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT_SPLIT.split(text) if s and s.strip()]


def _words(s: str) -> int:
    return len(re.findall(r"\w+", s))


def pseudo_queries(index: Index, n: int = 400, seed: int = 0, llm=None,
                   progress: Callable[[str, int, int], None] | None = None, mismatch: float = 0.5) -> list[Query]:
    """Inverse-cloze (and heading / LLM) queries made from a seeded sample of the index's chunks;
    each query word is removed from the matched rest of its chunk with probability `mismatch`."""
    rows_meta = index.con.execute("SELECT c.id, c.parent_id, c.doc_id, c.text, c.meta FROM chunks c").fetchall()
    live = {int(r): i for i, r in enumerate(index.rows.tolist())}
    by_row = {live[cid]: (pid, did, text, meta) for cid, pid, did, text, meta in rows_meta if cid in live}
    usable = sorted(r for r, (_, _, text, _) in by_row.items()
                    if len(text) >= 200 and sum(1 for s in _sentences(text) if 5 <= _words(s) <= 40) >= 1
                    and len(_sentences(text)) >= 2)
    if len(usable) < MIN_CHUNKS:
        raise BadInput(f"rag tune needs at least {MIN_CHUNKS} chunks of 200+ characters with two or more sentences "
                       f"to make pseudo-queries; this index has {len(usable)}. Index more text, or pass judged "
                       "queries with --queries and --qrels.")
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(usable), size=min(n, len(usable)), replace=False)
    # sections: (doc, heading) -> parents holding them, for heading queries
    parent_of_row = index.parent
    sections: dict = {}
    for r, (pid, did, _, meta) in by_row.items():
        m = json.loads(meta)
        for key in ("section", "title"):
            h = str(m.get(key) or "").strip()
            if h:
                sections.setdefault((did, key, h.lower()), set()).add(int(parent_of_row[r]))
    out: list[Query] = []
    for i, j in enumerate(picked.tolist()):
        if progress:
            progress("pseudo-queries", i, len(picked))
        row = usable[j]
        pid, did, text, meta = by_row[row]
        target = {int(parent_of_row[row]): 1}
        if llm is not None:
            q = llm.complete("Write one short search question that the following passage answers. "
                             f"Output only the question.\n\nPassage: {text[:1500]}", 48).strip().split("\n")[0]
            if q:
                out.append(Query(q, target, row, None, "llm"))
                continue
        m = json.loads(meta)
        heads = [(k, str(m.get(k) or "").strip()) for k in ("section", "title")]
        heads = [(k, h) for k, h in heads if 2 <= _words(h) <= 15 and h.lower() not in text.lower()]
        if heads and rng.random() < 0.3:
            k, h = heads[0]
            units = sections.get((did, k, h.lower()), set())
            if 0 < len(units) <= 5:  # a heading over many parents is too vague to judge
                out.append(Query(h, {u: 1 for u in units}, row, None, "heading"))
                continue
        cands = [s for s in _sentences(text) if 5 <= _words(s) <= 40]
        s = cands[int(rng.integers(len(cands)))]
        rest = text.replace(s, " ", 1)
        if mismatch > 0:
            words = sorted({w.lower() for w in re.findall(r"\w+", s)})
            drop = {w for w in words if rng.random() < mismatch}
            rest = re.sub(r"\w+", lambda m: "" if m.group().lower() in drop else m.group(), rest)
        out.append(Query(s, target, row, rest, "sentence"))
    return out


def judged_queries(index: Index, queries: list[tuple[str, str]], qrels: dict) -> list[Query]:
    """Judged queries whose documents are in the index (relevance per document key)."""
    keys = set(document_keys(index))
    named = {d for rel in qrels.values() for d in rel}
    if not named & keys:
        sample_q = ", ".join(sorted(named)[:3])
        sample_i = ", ".join(sorted(keys)[:3])
        raise BadInput(f"the qrels name no document of this index (qrels: {sample_q} ...; index: {sample_i} ...). "
                       "Use the ids of the indexed documents (a JSONL record's id field, else the file path).")
    out = [Query(text, qrels[qid]) for qid, text in queries if qid in qrels]
    if len(out) < 10:
        raise BadInput(f"only {len(out)} of the queries have judgments; rag tune needs at least 10.")
    return out


def document_keys(index: Index) -> list[str]:
    """Per row, the judged document id (a JSONL record's id, else its source path)."""
    got: dict[int, str] = {}
    for cid, source, doc_id in index.con.execute(
            "SELECT c.id, d.source, json_extract(c.meta, '$.doc_id') FROM chunks c JOIN docs d ON d.id = c.doc_id"):
        got[cid] = str(doc_id or source)
    return [got.get(int(r), "") for r in index.rows.tolist()]


# -- candidate lists -----------------------------------------------------------------------------------

def _bm25_doc_score(bm, doc_tokens: list[str], query: list[str], weights=None) -> tuple[float, bool]:
    """BM25 of one (modified) document, as BM25Index.scores computes it: (score, matches a term)."""
    tf = Counter(doc_tokens)
    dl = len(doc_tokens)
    norm = bm.k1 * (1 - bm.b + bm.b * dl / bm.doc_len.mean())
    s, hit = 0.0, False
    for i, t in enumerate(query):
        tid = bm.vocab.get(t)
        f = tf.get(t, 0)
        if tid is None or f == 0:
            continue
        w = bm.idf[tid] if weights is None else bm.idf[tid] * weights[i]
        if weights is None or weights[i] != 0:
            hit = True
        s += w * (f * (bm.k1 + 1) / (f + norm))
    return float(s), hit


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
        s, hit = _bm25_doc_score(bm, index.tok(q.remainder), toks, weights)
        scores[q.row], mask[q.row] = s, hit
    return _top(scores, mask, depth)


def collect(index: Index, embedder, queries: list[Query], depth: int = 100, expand: int = 10,
            graph: bool = False, progress=None) -> list[dict]:
    """Per query, the candidate lists every configuration is scored from: {name: (rows, scores)}."""
    from llmkit.rag.query import expand_tokens

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
        lists["dense"] = _top(ds, np.ones(index.n, bool), depth)
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


# -- scoring -------------------------------------------------------------------------------------------

def _ndcg(ranked: list, rel: dict, k: int = 10) -> float:
    dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(rel.values(), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def score_config(c: Config, lists: list[dict], queries: list[Query], unit, groups) -> np.ndarray:
    """Per-query nDCG@10 of one configuration. `unit` maps a fused id to its judged unit (a row's,
    or with parent-level fusion a parent group's, parent id or document key)."""
    out = np.zeros(len(queries))
    for i, (L, q) in enumerate(zip(lists, queries)):
        parts = []
        if c.w_dense < 1.0:
            parts.append(("bm25", 1.0 - c.w_dense, *L["bm25x" if c.expand else "bm25"]))
        if c.w_dense > 0.0:
            parts.append(("dense", c.w_dense, *L["dense"]))
        if c.w_graph > 0 and "graph" in L:
            parts.append(("graph", c.w_graph, *L["graph"]))
        if c.parents:
            parts = [(n, w, *dedupe_to_groups(ids, groups, sc)) for n, w, ids, sc in parts]
        ranked = list(dict.fromkeys(unit[d] for d, _ in fuse(parts, c.method, c.k, c.norm)[:60]))
        out[i] = _ndcg(ranked, q.relevant)
    return out


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


def choose(scores: dict, configs: list[Config], tune_idx: np.ndarray, hold_idx: np.ndarray):
    """(chosen, kept_default): the simplest configuration within one standard error of the best on
    the tuning half; the default instead when the choice is worse on the held-out half beyond noise."""
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
        if d.mean() < -se:
            return DEFAULT, True
    return chosen, False


def tune(index: Index, embedder, queries: list[Query], source: str, seed: int = 0, expand: bool = True,
         progress=None) -> TuneReport:
    """Score the grid on `queries` and choose (module doc)."""
    t0 = time.perf_counter()
    # the graph list only with judged queries: a pseudo-query's own sentence put its entities next to
    # the rest of its chunk in the co-occurrence graph, which leaving the sentence out of the chunk's
    # score does not undo (measured on Cranfield: pseudo-tuning then chose graph weight 0.25 and lost
    # 0.06 nDCG@10 on the real queries)
    graph = index.has_graph and source == "judged"
    lists = collect(index, embedder, queries, expand=10 if expand else 0, graph=graph, progress=progress)
    groups = index.parent_rows()
    if source == "judged":  # units: document keys; a parent group's is its first row's
        unit = document_keys(index)
        group_unit: dict[int, str] = {}
        for r, g in enumerate(groups.tolist()):
            group_unit.setdefault(g, unit[r])
        gunit = [group_unit[g] for g in range(len(group_unit))]
    else:  # units: parent ids (group g is the g-th distinct parent id)
        unit = [int(p) for p in index.parent.tolist()]
        gunit = [int(p) for p in np.unique(index.parent).tolist()]
    configs = grid(expand=expand, graph=graph)
    scores = {}
    for n, c in enumerate(configs):
        if progress:
            progress("scoring configurations", n, len(configs))
        scores[c] = score_config(c, lists, queries, gunit if c.parents else unit, groups)
    rng = np.random.default_rng(seed + 1)
    perm = rng.permutation(len(queries))
    half = len(queries) // 2
    tune_idx, hold_idx = np.sort(perm[:half]), np.sort(perm[half:])
    chosen, kept = choose(scores, configs, tune_idx, hold_idx)
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


def save_choice(directory: str, report: TuneReport) -> None:
    """Store the choice in the manifest (under the writer lock; read again inside it)."""
    from llmkit.rag.manifest import read_manifest, write_manifest, writer_lock

    with writer_lock(directory):
        m = read_manifest(directory)
        m["fusion"] = {**report.chosen, "tuned": {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "source": report.source,
            "queries": report.queries, "label": report.chosen_label, "score": round(report.tune_score, 4),
            "heldout": round(report.heldout_score, 4), "default": round(report.default_score, 4),
            "default_heldout": round(report.default_heldout, 4), "kept_default": report.kept_default,
            "generation": m.get("generation")}}
        write_manifest(directory, m)


def reset_choice(directory: str) -> bool:
    """Drop the stored choice; True when there was one."""
    from llmkit.rag.manifest import read_manifest, write_manifest, writer_lock

    with writer_lock(directory):
        m = read_manifest(directory)
        had = m.pop("fusion", None) is not None
        if had:
            write_manifest(directory, m)
    return had

