"""RAG benchmark (not a test): llmkit vs rank-bm25 on the same chunks and tokens, in one run.

    python benchmarks/rag_bench.py                       # 100k chunks of data/kernel-docs.txt (or Zipfian text)
    python benchmarks/rag_bench.py --chunks 20000 --build-docs 500
    python benchmarks/rag_bench.py --parts runtime       # only part 4 (needs ../shared/data/cranfield)

1. BM25 top-10 latency: llmkit's inverted index vs rank-bm25 `get_scores` + sort; the top-10 must be identical.
2. Hybrid latency at N chunks (query embedding excluded): BM25 top-100 + faiss top-100 + weighted RRF.
   Vectors: real MiniLM embeddings of --real chunks; the remaining rows reuse them with small noise
   (flat-search latency does not depend on the values). HNSW recall@10 vs flat is measured on the
   real embeddings only (recall on random vectors means nothing).
3. Index build split: `llmkit rag index` on --build-docs documents: embedding time vs everything else,
   index size on disk; peak RSS of this process.
4. Embedding runtimes on Cranfield (title + abstract): passages/s for sentence-transformers (torch),
   ONNX fp32 and ONNX int8, interleaved over --rounds; indexes built with fp32 and int8 evaluated
   (nDCG@10 per precision); fresh-process `llmkit rag query` wall time per mode, median of 5
   (ONNX runtime, and sentence-transformers for comparison).
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
    from llmkit.rag.chunk.spans import recursive_spans

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
    ap.add_argument("--cranfield", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "cranfield"))
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the runtime throughput runs")
    ap.add_argument("--parts", default="bm25,runtime", help="bm25 (parts 1-3) and/or runtime (part 4)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if "bm25" in parts:
        bm25_parts(args)
    if "runtime" in parts:
        runtime_part(args)
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


def bm25_parts(args) -> None:

    import rank_bm25

    from llmkit.rag.index.bm25 import BM25Index, tokenize
    from llmkit.rag.retrieve.fusion import rrf

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

    from llmkit.rag.embed.embedder import load_embedder

    faiss.omp_set_num_threads(1)
    emb = load_embedder()
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
        rrf([("bm25", 1.0, b, None), ("dense", 1.0, idx[0].tolist(), None)], 60)[:10]
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
    from llmkit.rag.chunk.sections import ChunkOptions
    from llmkit.rag.index.build import IndexOptions, build

    tmp = tempfile.mkdtemp(prefix="ragbench-")
    try:
        with open(os.path.join(tmp, "docs.jsonl"), "w", encoding="utf-8") as f:
            per = max(1, len(texts[:n_real]) // args.build_docs)
            for i in range(args.build_docs):
                body = "\n\n".join(texts[i * per:(i + 1) * per])
                if body.strip():
                    f.write(json.dumps({"id": i, "text": body}) + "\n")
        rep = build(os.path.join(tmp, "idx"), [os.path.join(tmp, "docs.jsonl")],
                    IndexOptions(chunk=ChunkOptions(sizes=(400,), overlap=50)))
        size = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(os.path.join(tmp, "idx")) for n in ns)
        other = rep.total_s - rep.embed_s
        print(f"index build ({rep.chunks_indexed} chunks): embedding {rep.embed_s:.1f} s, everything else {other:.1f} s "
              f"({100 * other / max(rep.embed_s, 1e-9):.0f}% of embedding); on disk {size / 2**20:.1f} MB "
              f"({size / max(rep.chunks_indexed, 1) / 1024:.1f} kB/chunk)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def runtime_part(args) -> None:
    """Part 4: embedding runtimes and precisions on Cranfield; fresh-process query latency."""
    import subprocess

    from llmkit.rag.embed.embedder import load_embedder
    from llmkit.rag.embed.models import EmbedOptions
    from llmkit.rag.evaluate.datasets import import_cranfield, load_qrels, load_queries
    from llmkit.rag.evaluate.metrics import evaluate
    from llmkit.rag.index.build import IndexOptions, build
    from llmkit.rag.index.reader import Index
    from llmkit.rag.retrieve.pipeline import Pipeline, QueryOptions

    if not os.path.isdir(args.cranfield):
        print(f"part 4 skipped: no Cranfield collection at {args.cranfield} (pass --cranfield DIR)")
        return
    tmp = tempfile.mkdtemp(prefix="ragbench-rt-")
    try:
        import_cranfield(args.cranfield, tmp)
        docs = [json.loads(line) for line in open(os.path.join(tmp, "docs.jsonl"), encoding="utf-8")]
        texts = [d["text"] for d in docs if d["text"].strip()]
        runtimes = [("torch", "fp32"), ("onnx", "fp32"), ("onnx", "int8")]
        models = {rt: load_embedder(None, *rt) for rt in runtimes}  # exports (once) happen here, not timed
        rates: dict = {rt: [] for rt in runtimes}
        for _ in range(args.rounds):
            for rt in runtimes:
                t = time.perf_counter()
                models[rt].passages(texts)
                rates[rt].append(len(texts) / (time.perf_counter() - t))
        base = max(rates[("torch", "fp32")])
        print(f"embedding throughput, Cranfield title+abstract ({len(texts)} passages, best of {args.rounds} "
              "interleaved rounds, 2 threads):")
        for rt in runtimes:
            print(f"  {rt[0]:5s} {rt[1]}: {max(rates[rt]):6.1f} passages/s ({max(rates[rt]) / base:.2f}x torch); "
                  f"runs {', '.join(f'{r:.1f}' for r in rates[rt])}")
        queries, qrels = load_queries(os.path.join(tmp, "queries.jsonl")), load_qrels(os.path.join(tmp, "qrels.txt"))
        idx, chunk_rate = {}, {}
        for name, runtime, prec in (("torch", "torch", "fp32"), ("fp32", "onnx", "fp32"), ("int8", "onnx", "int8")):
            idx[name] = os.path.join(tmp, f"idx-{name}")
            rep = build(idx[name], [os.path.join(tmp, "docs.jsonl")],
                        IndexOptions(embed=EmbedOptions(precision=prec, runtime=runtime)))
            chunk_rate[name] = rep.chunks_indexed / max(rep.embed_s, 1e-9)
            print(f"  index build, {runtime} {prec}: {rep.chunks_indexed} chunks (800 characters) embedded in "
                  f"{rep.embed_s:.1f} s = {chunk_rate[name]:.1f} chunks/s ({chunk_rate[name] / chunk_rate['torch']:.2f}x torch)")
        print("Cranfield nDCG@10 per precision (225 queries):")
        for prec in ("fp32", "int8"):
            row = []
            for mode in ("bm25", "dense", "hybrid"):
                pipe = Pipeline(Index(idx[prec]), QueryOptions(mode=mode, k=100))
                row.append(f"{mode} {evaluate(mode, pipe.run, queries, qrels).ndcg10:.4f}")
            print(f"  {prec}: " + ", ".join(row))
        q = "what similarity laws must be obeyed when constructing aeroelastic models of heated high speed aircraft"
        env = {**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..")}
        cases = [(m, "onnx") for m in ("hybrid", "dense", "bm25")] + [("hybrid", "torch")]
        walls: dict = {c: [] for c in cases}
        for _ in range(5):
            for mode, rt in cases:
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "llmkit", "-q", "rag", "query", idx["fp32"], q, "--mode", mode,
                                "--runtime", rt, "-k", "5"], check=True, capture_output=True, env=env)
                walls[(mode, rt)].append(time.perf_counter() - t)
        print("fresh-process `llmkit rag query` wall time (median of 5, interleaved):")
        for mode, rt in cases:
            print(f"  --mode {mode:6s} --runtime {rt:5s}: {np.median(walls[(mode, rt)]):.2f} s "
                  f"(min {min(walls[(mode, rt)]):.2f}, max {max(walls[(mode, rt)]):.2f})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
