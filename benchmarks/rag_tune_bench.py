"""How well does `rag tune` choose? (not a test)

    python benchmarks/rag_tune_bench.py cran/                      # a dir with docs.jsonl, queries.jsonl, qrels.txt
    python benchmarks/rag_tune_bench.py cran/ --index cran-idx     # reuse an index of that docs.jsonl

For one judged collection, in one run:
1. every configuration of the tuner's search space scored on the real judged queries and on
   pseudo-queries made from the corpus (inverse cloze), and the rank correlation between the two
   (Spearman and Kendall over configurations): does pseudo-query nDCG predict real nDCG?
2. `rag tune` without labels (pseudo-queries): the real nDCG@10 of its choice vs the built-in
   default (RRF 1:1) and the best single retriever;
3. `rag tune` with labels: choice on one half of the judged queries, real nDCG@10 on the other half,
   vs default and best single retriever on that half (and the reverse split, averaged).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def spearman(a, b) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def kendall(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    n = len(a)
    s = 0.0
    for i in range(n):
        s += np.sum(np.sign(a[i] - a[i + 1:]) * np.sign(b[i] - b[i + 1:]))
    return float(2 * s / (n * (n - 1)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("collection")
    ap.add_argument("--index")
    ap.add_argument("-n", type=int, default=400, help="pseudo-queries")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mismatch", type=float, default=0.7, help="pseudo-queries: share of query words removed from "
                    "the target")
    ap.add_argument("--cache", help="vector cache file shared with rag_quality.py (WORK/cache/vectors.npz)")
    args = ap.parse_args()
    cache = None
    if args.cache:
        from benchmarks.rag_quality import VectorCache, cached_embeddings

        cache = VectorCache(args.cache)
        cached_embeddings(cache)

    from llmkit.rag.evaluate import queries as Q
    from llmkit.rag.evaluate import tune as T
    from llmkit.rag.evaluate.datasets import load_qrels, load_queries
    from llmkit.rag.index.build import IndexOptions, build
    from llmkit.rag.index.reader import Index

    idx = args.index
    if not idx:
        idx = os.path.join(tempfile.mkdtemp(prefix="tunebench-"), "idx")
        t = time.perf_counter()
        build(idx, [os.path.join(args.collection, "docs.jsonl")], IndexOptions())  # no auto-tune: build() only
        print(f"indexed {args.collection} in {time.perf_counter() - t:.0f} s")
    index = Index(idx)
    emb = index.embedder()
    judged = Q.judged_queries(index, load_queries(os.path.join(args.collection, "queries.jsonl")),
                              load_qrels(os.path.join(args.collection, "qrels.txt")))
    pseudo = Q.pseudo_queries(index, args.n, args.seed, mismatch=args.mismatch)
    configs = T.grid(parents=index.unit is None, graph=index.has_graph)
    real, fake = {}, {}
    for name, qs, store in (("judged", judged, real), ("pseudo", pseudo, fake)):
        t = time.perf_counter()
        lists = T.collect(index, emb, qs, graph=index.has_graph)
        groups = index.parent_rows()
        unit, gunit, ranked_by = T.units_of(index, name)
        for c in configs:
            store[c] = T.score_config(c, lists, qs, gunit if c.parents else unit, groups, ranked_by)
        print(f"{name}: {len(qs)} queries, {len(configs)} configurations scored in {time.perf_counter() - t:.0f} s")
    if cache is not None:
        cache.save()
    r = [real[c].mean() for c in configs]
    f = [fake[c].mean() for c in configs]
    print(f"rank correlation of pseudo vs real nDCG@10 over {len(configs)} configurations: "
          f"Spearman {spearman(f, r):.3f}, Kendall {kendall(f, r):.3f}")
    singles = [c for c in configs if c.w_dense in (0.0, 1.0) and not c.expand and not c.parents and not c.w_graph]
    best_single = max(singles, key=lambda c: real[c].mean())
    best = max(configs, key=lambda c: real[c].mean())
    print(f"real nDCG@10: default RRF 1:1 {real[T.DEFAULT].mean():.4f}; best single ({best_single.label()}) "
          f"{real[best_single].mean():.4f}; best of the grid ({best.label()}) {real[best].mean():.4f}")
    # 2. without labels
    rng = np.random.default_rng(args.seed + 1)
    perm = rng.permutation(len(pseudo))
    half = len(pseudo) // 2
    chosen, kept = T.choose(fake, configs, np.sort(perm[:half]), np.sort(perm[half:]), strict=True)
    print(f"tune on pseudo-queries -> {chosen.label()}{' (kept default)' if kept else ''}: real nDCG@10 "
          f"{real[chosen].mean():.4f} ({real[chosen].mean() - real[best_single].mean():+.4f} vs best single, "
          f"{real[chosen].mean() - real[T.DEFAULT].mean():+.4f} vs default)")
    # 3. with labels, two-fold
    perm = np.random.default_rng(args.seed + 2).permutation(len(judged))
    halves = [np.sort(perm[:len(perm) // 2]), np.sort(perm[len(perm) // 2:])]
    gains = []
    for a, b in ((0, 1), (1, 0)):
        inner = np.random.default_rng(args.seed + 3).permutation(halves[a])
        ch, kept = T.choose(real, configs, np.sort(inner[:len(inner) // 2]), np.sort(inner[len(inner) // 2:]))
        bs = max(singles, key=lambda c: real[c][halves[a]].mean())
        got = real[ch][halves[b]].mean()
        gains.append((got, real[T.DEFAULT][halves[b]].mean(), real[bs][halves[b]].mean()))
        print(f"tune on judged half {a} -> {ch.label()}{' (kept default)' if kept else ''}: held-out nDCG@10 "
              f"{got:.4f} vs default {gains[-1][1]:.4f}, best single ({bs.label()}) {gains[-1][2]:.4f}")
    g = np.mean(gains, axis=0)
    print(f"two-fold mean: tuned {g[0]:.4f}, default {g[1]:.4f}, best single {g[2]:.4f} "
          f"({g[0] - g[2]:+.4f} vs best single)")


if __name__ == "__main__":
    main()
