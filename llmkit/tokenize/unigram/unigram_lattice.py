"""Unigram training's lattices, vectorized with numpy: every in-word substring hashed at once,
and all words' segmentation lattices as flat edge arrays with batched forward/backward passes
(one batch per position inside a word; log-sum-exp for EM, max for Viterbi)."""

from __future__ import annotations

import numpy as np

_BASE = np.uint64(0x9E3779B97F4A7C15)


def codepoints(words: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All words joined with a separator, as code points; plus each word's start and end offset."""
    lens = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    joined = "\x00".join(words) + "\x00"
    cp = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    starts = np.concatenate([[0], np.cumsum(lens + 1)[:-1]]).astype(np.int64)
    return cp, starts, starts + lens


def substring_hashes(cp: np.ndarray, word_end_of_pos: np.ndarray, max_len: int):
    """Yield (L, start positions, 64-bit hashes) of every in-word substring of length L."""
    n = len(cp)
    h = np.zeros(n, dtype=np.uint64)
    idx = np.arange(n, dtype=np.int64)
    with np.errstate(over="ignore"):
        for L in range(1, max_len + 1):
            valid = idx + L <= word_end_of_pos[idx]
            if not valid.any():
                break
            idx = idx[valid]
            h = h[valid] * _BASE + cp[idx + L - 1] + np.uint64(1)
            yield L, idx, h


def _string_hashes(strings: list[str]) -> np.ndarray:
    """The same 64-bit hash for whole strings (pieces)."""
    cp, starts, ends = codepoints(strings)
    end_of = np.repeat(ends, ends - starts + 1)
    out = np.zeros(len(strings), dtype=np.uint64)
    lens = ends - starts
    for L, idx, h in substring_hashes(cp, end_of, int(lens.max()) if len(lens) else 0):
        pos = np.searchsorted(starts, idx)
        hit = (pos < len(starts)) & (starts[np.minimum(pos, len(starts) - 1)] == idx) & (lens[np.minimum(pos, len(starts) - 1)] == L)
        out[pos[hit]] = h[hit]
    return out


class Lattice:
    """All words' segmentation lattices as flat numpy arrays (nodes = positions between chars; word w's
    nodes are off[w] .. off[w] + len(w), the code-point offsets of the words joined with one separator)."""

    def __init__(self, lens: np.ndarray, counts: np.ndarray, es: np.ndarray, ee: np.ndarray, ep: np.ndarray):
        """From the edges (start node, end node, piece id), in the order the expected counts add them up."""
        self.counts = counts
        self.off = np.concatenate([[0], np.cumsum(lens + 1)[:-1]]).astype(np.int64)
        self.ends = self.off + lens
        self.n_nodes = int(self.ends[-1]) + 1 if len(lens) else 0
        # int32 edge arrays: the edges (every seed piece at every position) are the largest structure
        self.es, self.ee, self.ep = es, ee, ep
        node_word_all = np.repeat(np.arange(len(lens), dtype=np.int32), lens + 1)
        self.ew = node_word_all[self.es]
        del node_word_all
        self.node_word = np.repeat(np.arange(len(lens)), lens + 1)
        self._index()

    @classmethod
    def from_pieces(cls, words: list[str], counts: np.ndarray, piece_id: dict[str, int],
                    max_piece_length: int) -> "Lattice":
        """The lattice of `words` over the pieces of `piece_id` (every occurrence found by hash)."""
        lens = np.array([len(w) for w in words], dtype=np.int64)
        pieces = sorted(piece_id, key=piece_id.get)
        ph = _string_hashes(pieces)
        order = np.argsort(ph)
        ph_sorted = ph[order]
        pid_sorted = np.array([piece_id[pieces[i]] for i in order.tolist()], dtype=np.int64)
        cp, starts, ends = codepoints(words)
        end_of = np.repeat(ends, ends - starts + 1)
        es, ee, ep = [], [], []
        for L, idx, h in substring_hashes(cp, end_of, max_piece_length):
            k = np.searchsorted(ph_sorted, h)
            k = np.minimum(k, len(ph_sorted) - 1)
            hit = ph_sorted[k] == h
            start = idx[hit].astype(np.int32)
            es.append(start)
            ee.append(start + np.int32(L))
            ep.append(pid_sorted[k[hit]].astype(np.int32))
        return cls(lens, counts, *(np.concatenate(a) if a else np.zeros(0, dtype=np.int32) for a in (es, ee, ep)))

    def keep(self, alive: np.ndarray) -> None:
        """Drop the edges of pieces that are no longer in the vocabulary (the orders stay sorted)."""
        m = alive[self.ep]
        new_id = np.cumsum(m, dtype=np.int32) - np.int32(1)
        self.es, self.ee, self.ep, self.ew = self.es[m], self.ee[m], self.ep[m], self.ew[m]
        self.fwd = new_id[self.fwd[m[self.fwd]]]
        self.bwd = new_id[self.bwd[m[self.bwd]]]
        del m, new_id
        self._batch()

    def _index(self) -> None:
        """The forward order (by local end, then end node, then start: ties keep the longest last
        piece) and the backward order (by local start descending, then start node, then end)."""
        off = self.off.astype(np.int32)[self.ew]
        local_end = self.ee - off
        local_start = self.es - off
        del off
        # no two edges share both nodes, so one integer key per edge sorts them as the tuple would
        span, n = (self.ee - self.es).astype(np.int64), np.int64(self.n_nodes)
        top = np.int64(int(span.max()) + 1 if len(span) else 1)
        key = (local_end.astype(np.int64) * n + self.ee) * top + (top - span)
        del local_end
        self.fwd = np.argsort(key).astype(np.int32)
        key = ((local_start.max(initial=0) - local_start).astype(np.int64) * n + self.es) * top + span
        del span, local_start
        self.bwd = np.argsort(key).astype(np.int32)
        del key
        self._batch()

    def _batch(self) -> None:
        off = self.off.astype(np.int32)
        fwd_end = self.ee[self.fwd]
        self.fwd_batches = _batches(fwd_end - off[self.ew[self.fwd]], fwd_end)
        del fwd_end
        bwd_start = self.es[self.bwd]
        self.bwd_batches = _batches(off[self.ew[self.bwd]] - bwd_start, bwd_start)

    def forward(self, logp: np.ndarray, mode: str = "sum"):
        """alpha over nodes (log-sum-exp or max); with mode='max' also the best incoming edge."""
        alpha = np.full(self.n_nodes, -np.inf)
        alpha[self.off] = 0.0
        back = np.full(self.n_nodes, -1, dtype=np.int64) if mode == "max" else None
        order = self.fwd
        for lo, hi, starts, targets in self.fwd_batches:
            idx = order[lo:hi]
            vals = alpha[self.es[idx]] + logp[self.ep[idx]]
            alpha[targets] = _group_reduce(vals, starts, mode)
            if back is not None:
                back[targets] = idx[_group_first_max(vals, starts, alpha[targets])]
        return alpha, back

    def backward(self, logp: np.ndarray, mode: str = "sum") -> np.ndarray:
        beta = np.full(self.n_nodes, -np.inf)
        beta[self.ends] = 0.0
        order = self.bwd
        for lo, hi, starts, targets in self.bwd_batches:
            idx = order[lo:hi]
            vals = beta[self.ee[idx]] + logp[self.ep[idx]]
            beta[targets] = _group_reduce(vals, starts, mode)
        return beta

    def viterbi_paths(self, back: np.ndarray) -> np.ndarray:
        """Edge ids on every word's best path (all words together)."""
        cur = self.ends.copy()
        cur = cur[cur != self.off]
        out = []
        while len(cur):
            e = back[cur]
            out.append(e)
            cur = self.es[e]
            cur = cur[cur != self.off[self.node_word[cur]]]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _batches(keys: np.ndarray, groups: np.ndarray):
    """Split sorted edges into batches of equal key; inside each, groups of equal target node."""
    out = []
    if len(keys) == 0:
        return out
    cut = np.flatnonzero(np.diff(keys)) + 1
    bounds = np.concatenate([[0], cut, [len(keys)]])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        g = groups[lo:hi]
        starts = np.concatenate([[0], np.flatnonzero(np.diff(g)) + 1])
        out.append((int(lo), int(hi), starts, g[starts]))
    return out


def _group_reduce(vals: np.ndarray, starts: np.ndarray, mode: str) -> np.ndarray:
    m = np.maximum.reduceat(vals, starts)
    if mode == "max":
        return m
    counts = np.diff(np.append(starts, len(vals)))
    safe = np.where(np.isfinite(m), m, 0.0)
    s = np.add.reduceat(np.exp(vals - np.repeat(safe, counts)), starts)
    with np.errstate(divide="ignore"):
        return safe + np.log(s)


def _group_first_max(vals: np.ndarray, starts: np.ndarray, m: np.ndarray) -> np.ndarray:
    counts = np.diff(np.append(starts, len(vals)))
    pos = np.arange(len(vals))
    cand = np.where(vals == np.repeat(m, counts), pos, len(vals))
    return np.minimum.reduceat(cand, starts)


def covered_nodes(es: np.ndarray, ee: np.ndarray, base: int, need: np.ndarray):
    """(edge id, node) for every node an edge covers (es <= node < ee), kept where need[node]."""
    lens = ee - es
    edges = np.repeat(np.arange(base, base + len(es)), lens)
    firsts = np.repeat(es, lens)
    step = np.arange(len(edges)) - np.repeat(np.cumsum(lens) - lens, lens)
    nodes = firsts + step
    m = need[nodes]
    return edges[m], nodes[m]
