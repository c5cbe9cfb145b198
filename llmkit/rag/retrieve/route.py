"""Routing: pick the collection(s) whose best-matching chunk matches a query best.

Per collection, the top BM25 score and the top dense cosine, each divided by its maximum over
collections, averaged; collections within 85% of the best are searched. (Summing fused scores would
favour big collections merely for having more chunks.)
"""

from __future__ import annotations

import numpy as np


def route(index, mode: str, query: str, allowed, embedder=None, query_vector=None) -> tuple[np.ndarray, str]:
    """(mask of the chosen collections' rows, a note saying why). `embedder` and `query_vector()`
    give the dense evidence (modes dense and hybrid)."""
    ix = index
    n_c = len(ix.collections)
    evidence = []
    if mode in ("bm25", "hybrid"):
        s = ix.bm25.scores(ix.tok(query))
        if allowed is not None:
            s = np.where(allowed, s, 0.0)
        best = np.zeros(n_c)
        np.maximum.at(best, ix.collection, s)
        evidence.append(("bm25", best))
    if mode in ("dense", "hybrid"):
        if embedder.unknown_share(query) <= 0.5:
            rows, sims = ix.dense_list(query_vector(), 50, allowed)  # the scores are the inner products
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
        return np.ones(ix.n, bool), "routing: no evidence, searching all collections"
    score /= used
    chosen = [int(i) for i in np.flatnonzero(score >= 0.85 * score.max())]
    order = np.argsort(-score)
    detail = "; ".join(f"{ix.collections[i]} {score[i]:.2f} (" + ", ".join(f"{name} {best[i]:.2f}" for name, best in evidence)
                       + ")" for i in order)
    return np.isin(ix.collection, chosen), f"routing: {detail} -> {', '.join(ix.collections[i] for i in chosen)}"
