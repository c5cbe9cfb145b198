"""RAG benchmark (not a test): llmkit vs rank-bm25 on the same chunks and tokens, in one run.

    python benchmarks/rag_bench.py                       # 100k chunks of data/kernel-docs.txt (or Zipfian text)
    python benchmarks/rag_bench.py --chunks 20000 --build-docs 500

1. BM25 top-10 latency: llmkit's inverted index vs rank-bm25 `get_scores` + sort; the top-10 must be identical.
2. Hybrid latency at N chunks (query embedding excluded): BM25 top-100 + faiss top-100 + weighted RRF.
   Vectors: real MiniLM embeddings of --real chunks; the remaining rows reuse them with small noise
   (flat-search latency does not depend on the values). HNSW recall@10 vs flat is measured on the
   real embeddings only (recall on random vectors means nothing).
3. Index build split: `llmkit rag index` on --build-docs documents: embedding time vs everything else,
   index size on disk; peak RSS of this process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def chunks_from(path: str | None, n: int, seed: int = 0) -> list[str]:
    from llmkit.rag.chunking import recursive_spans

    out: list[str] = []
    if path and os.path.exists(path):
        text = open(path, encoding="utf-8").read()
        paras = [p for p in text.split("\n\n") if p.strip()]
        while len(out) < n:
            for p in paras:
                out.extend(s.text for s in recursive_spans(p, 400, 0))
                if len(out) >= n:
                    break
        return out[:n]
    rng = np.random.default_rng(seed)  # Zipfian synthetic text: 50k-word vocabulary, s = 1.1
    words = [f"w{i}" for i in range(50_000)]
    for _ in range(n):
        ids = np.minimum(rng.zipf(1.1, size=int(rng.integers(30, 90))) - 1, len(words) - 1)
        out.append(" ".join(words[i] for i in ids))
    return out


def pct(xs, q):
    return float(np.percentile(np.asarray(xs) * 1000, q))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="data/kernel-docs.txt")
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--real", type=int, default=3000, help="chunks embedded for real (HNSW recall, vector pool)")
    ap.add_argument("--build-docs", type=int, default=300, help="documents for the index-build split")
    args = ap.parse_args()

    import rank_bm25

    from llmkit.rag.bm25 import BM25Index, tokenize
    from llmkit.rag.search import rrf

    texts = chunks_from(args.corpus, args.chunks)
    rng = np.random.default_rng(1)
    qsrc = [texts[i] for i in rng.choice(len(texts), args.queries, replace=False)]
    queries = []
    for t in qsrc:
        toks = tokenize(t)
        start = int(rng.integers(0, max(1, len(toks) - 4)))
        queries.append(toks[start:start + 4])
    print(f"corpus: {len(texts)} chunks ({'kernel docs' if os.path.exists(args.corpus) else 'Zipfian synthetic'}), "
          f"{len(queries)} queries")

    tok = [tokenize(t) for t in texts]
    t = time.perf_counter()
    ours = BM25Index.build(tok)
    build_ours = time.perf_counter() - t
    t = time.perf_counter()
    ref = rank_bm25.BM25Okapi(tok)
    build_ref = time.perf_counter() - t
    lat_ref, lat_ours, same = [], [], 0
    for q in queries:
        t = time.perf_counter()
        s = ref.get_scores(q)
        top_ref = [int(d) for d in sorted(range(len(s)), key=lambda d: (-s[d], d))[:10] if s[d] > 0]
        lat_ref.append(time.perf_counter() - t)
        t = time.perf_counter()
        top = [d for d, _ in ours.top_k(q, 10)]
        lat_ours.append(time.perf_counter() - t)
        same += top == top_ref
    print(f"BM25 build: rank-bm25 {build_ref:.1f} s, llmkit {build_ours:.1f} s")
    print(f"BM25 top-10: rank-bm25 p50 {pct(lat_ref, 50):.1f} ms, llmkit p50 {pct(lat_ours, 50):.2f} ms "
          f"p95 {pct(lat_ours, 95):.2f} ms -> {np.median(lat_ref) / np.median(lat_ours):.0f}x faster; "
          f"identical top-10: {same}/{len(queries)}")

    # -- dense + hybrid ------------------------------------------------------------------------
    import faiss

    from llmkit.rag.embed import Embedder

    faiss.omp_set_num_threads(1)
    emb = Embedder()
    n_real = min(args.real, len(texts))
    t = time.perf_counter()
    real = emb.passages(texts[:n_real])
    rate = n_real / (time.perf_counter() - t)
    print(f"embedding: {rate:.0f} chunks/s (all-MiniLM-L6-v2, CPU) -> {len(texts) / rate / 60:.0f} min for all {len(texts)}")
    reps = -(-len(texts) // n_real)
    vecs = np.tile(real, (reps, 1))[:len(texts)]
    vecs = vecs + rng.normal(0, 0.02, vecs.shape).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(vecs)
    qv = emb.queries([" ".join(q) for q in queries])
    lat = []
    for q, v in zip(queries, qv):
        t = time.perf_counter()
        b = [d for d, _ in ours.top_k(q, 100)]
        _, idx = flat.search(v.reshape(1, -1), 100)
        rrf([(1.0, b), (1.0, idx[0].tolist())], 60)[:10]
        lat.append(time.perf_counter() - t)
    print(f"hybrid at {len(texts)} chunks (flat, query embedding excluded): p50 {pct(lat, 50):.1f} ms, "
          f"p95 {pct(lat, 95):.1f} ms")
    hnsw = faiss.IndexHNSWFlat(real.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = 80
    hnsw.add(real)
    hnsw.hnsw.efSearch = 64
    small_flat = faiss.IndexFlatIP(real.shape[1])
    small_flat.add(real)
    _, exact = small_flat.search(qv, 10)
    t = time.perf_counter()
    _, approx = hnsw.search(qv, 10)
    hnsw_ms = (time.perf_counter() - t) / len(qv) * 1000
    rec = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact)])
    print(f"HNSW (M=32, efSearch=64) recall@10 vs flat on {n_real} real embeddings: {rec:.3f}, {hnsw_ms:.2f} ms/query")

    # -- index build split ---------------------------------------------------------------------
    from llmkit.rag.store import IndexOptions, build

    tmp = tempfile.mkdtemp(prefix="ragbench-")
    try:
        with open(os.path.join(tmp, "docs.jsonl"), "w", encoding="utf-8") as f:
            per = max(1, len(texts[:n_real]) // args.build_docs)
            for i in range(args.build_docs):
                body = "\n\n".join(texts[i * per:(i + 1) * per])
                if body.strip():
                    f.write(json.dumps({"id": i, "text": body}) + "\n")
        rep = build(os.path.join(tmp, "idx"), [os.path.join(tmp, "docs.jsonl")], IndexOptions(sizes=(400,), overlap=50))
        size = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(os.path.join(tmp, "idx")) for n in ns)
        other = rep.total_s - rep.embed_s
        print(f"index build ({rep.chunks_indexed} chunks): embedding {rep.embed_s:.1f} s, everything else {other:.1f} s "
              f"({100 * other / max(rep.embed_s, 1e-9):.0f}% of embedding); on disk {size / 2**20:.1f} MB "
              f"({size / max(rep.chunks_indexed, 1) / 1024:.1f} kB/chunk)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
