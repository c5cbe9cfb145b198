"""Fusion of ranked lists: weighted Reciprocal Rank Fusion and convex combinations of normalised
scores (Bruch et al., "An Analysis of Fusion Functions for Hybrid Retrieval", 2023).

A list is (name, weight, ids, scores): ids best first, scores as the retriever gave them (BM25
scores, cosine similarities). Every function returns [(id, fused score)] best first; ties go to the
better best rank, then the lower id, so results are deterministic.

- rrf:    sum_i w_i / (k + rank_i(d)), ranks 1-based; a document missing from a list gets nothing.
- cc:     sum_i w_i * norm_i(s_i(d)); a document missing from list i gets that list's lowest
          normalised value (it ranked below everything the list returned).
  norms:  minmax (over the list), z (mean/std of the list), dbsf (distribution-based: mean +- 3 std
          mapped to [0, 1], clipped), tmm (theoretical min-max: BM25's minimum is 0, cosine's -1).
"""

from __future__ import annotations

import numpy as np

from llmkit.errors import BadInput
from llmkit.errors import OptionError

METHODS = ("rrf", "cc")
NORMS = ("minmax", "z", "dbsf", "tmm")
THEORETICAL_MIN = {"bm25": 0.0, "dense": -1.0, "graph": 0.0}


def normalize(scores: np.ndarray, how: str, name: str = "") -> np.ndarray:
    """Scores of one list normalised by `how`.

    >>> normalize(np.array([3.0, 2.0, 1.0]), "minmax").tolist()
    [1.0, 0.5, 0.0]
    >>> normalize(np.array([0.8, 0.2]), "tmm", "dense").round(4).tolist()
    [1.0, 0.6667]
    """
    s = np.asarray(scores, np.float64)
    if len(s) == 0:
        return s
    if how == "minmax":
        lo, hi = s.min(), s.max()
        return (s - lo) / (hi - lo) if hi > lo else np.ones_like(s)
    if how == "z":
        sd = s.std()
        return (s - s.mean()) / sd if sd > 0 else np.zeros_like(s)
    if how == "dbsf":
        mu, sd = s.mean(), s.std()
        if sd == 0:
            return np.ones_like(s)
        return np.clip((s - (mu - 3 * sd)) / (6 * sd), 0.0, 1.0)
    if how == "tmm":
        lo, hi = THEORETICAL_MIN.get(name, 0.0), s.max()
        return (s - lo) / (hi - lo) if hi > lo else np.ones_like(s)
    raise BadInput(f"unknown score normalisation {how!r}; use {', '.join(NORMS)}.")


def _order(score: dict, best: dict) -> list[tuple[int, float]]:
    return sorted(score.items(), key=lambda x: (-x[1], best[x[0]], x[0]))


def rrf(lists, k: int = 60) -> list[tuple[int, float]]:
    """Weighted RRF of (name, weight, ids, scores) lists.

    >>> rrf([("a", 1.0, [7, 3], None), ("b", 1.0, [3, 9], None)], k=60)[0][0]
    3
    """
    if k < 0:
        raise OptionError("{rrf_k} must be >= 0, got {k}.", k=k)
    score: dict[int, float] = {}
    best: dict[int, int] = {}
    for _, w, ids, _ in lists:
        for r, d in enumerate(ids, 1):
            score[d] = score.get(d, 0.0) + w / (k + r)
            best[d] = min(best.get(d, r), r)
    return _order(score, best)


def convex(lists, norm: str = "minmax") -> list[tuple[int, float]]:
    """Weighted sum of normalised scores (weights as given; a convex combination when they sum to 1).

    >>> convex([("bm25", 0.4, [1, 2], [10.0, 5.0]), ("dense", 0.6, [2, 3], [0.9, 0.1])])[0]
    (2, 0.6)
    """
    score: dict[int, float] = {}
    best: dict[int, int] = {}
    floor = 0.0
    parts = []
    for name, w, ids, scores in lists:
        if scores is None or len(scores) != len(ids):
            raise BadInput(f"score fusion needs the scores of the {name} list.")
        ns = normalize(np.asarray(scores), norm, name)
        low = float(ns.min()) if len(ns) else 0.0
        parts.append((w, ids, ns, low))
        floor += w * low  # what a document missing from every list would get
    for w, ids, ns, low in parts:
        for r, (d, v) in enumerate(zip(ids, ns.tolist()), 1):
            # start every document at the all-missing floor, then replace this list's floor by its value
            score[d] = score.get(d, floor) + w * (v - low)
            best[d] = min(best.get(d, r), r)
    return _order(score, best)


def fuse(lists, method: str = "rrf", k: int = 60, norm: str = "minmax") -> list[tuple[int, float]]:
    """Fuse lists by `method` (rrf or cc)."""
    if method == "rrf":
        return rrf(lists, k)
    if method == "cc":
        return convex(lists, norm)
    raise BadInput(f"unknown fusion {method!r}; use rrf or cc.")
