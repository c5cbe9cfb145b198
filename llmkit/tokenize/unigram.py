"""Unigram language-model tokenizer: EM over piece probabilities, pruning, Viterbi encoding.

Training (Kudo 2018, as in SentencePiece): start from a large seed vocabulary of frequent
substrings, run EM (forward-backward expected counts over each word's segmentation lattice),
then remove the pieces whose removal raises the corpus loss least, keeping every single
character; repeat until the vocabulary has the requested size. The lattice computations are
vectorized over all words at once with numpy: one batch per position inside a word.

The loss increase for removing piece x is computed exactly for its occurrences in each word's
best (Viterbi) segmentation: the best path that avoids an edge x starting at position s must use
some other edge covering s, so it is the best "path through y" over edges y != x covering s.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from llmkit.errors import BadInput
from llmkit.tokenize import pretok

Progress = Callable[[int, int, str], None]
Trace = Callable[[dict], None]
UNK_PENALTY = 10.0  # SentencePiece / HF: an unknown character scores min_score - 10


@dataclass
class UnigramTrainResult:
    pieces: list[tuple[str, float]]  # (piece, log probability); specials first with score 0
    unk_id: int | None
    special_tokens: list[str] = field(default_factory=list)


def seed_pieces(word_counts: dict[str, int], max_piece_length: int = 16, seed_size: int = 1_000_000,
                include_whole_words: bool = True) -> dict[str, int]:
    """Frequent substrings with their corpus frequencies: every character plus the top
    `seed_size` longer substrings ranked by frequency x length (characters they cover).

    With include_whole_words=False only strict substrings qualify (the HF course's toy seed).

    >>> s = seed_pieces({"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}, include_whole_words=False)
    >>> sum(s.values()), s["hug"], "hugs" in s
    (210, 15, False)
    """
    chars: dict[str, int] = defaultdict(int)
    subs: dict[str, int] = defaultdict(int)
    strict: set[str] = set()
    for w, c in word_counts.items():
        n = len(w)
        for i in range(n):
            chars[w[i]] += c
            for j in range(i + 2, min(n, i + max_piece_length) + 1):
                s = w[i:j]
                subs[s] += c
                if not include_whole_words and (i > 0 or j < n):
                    strict.add(s)
    if not include_whole_words:
        subs = {s: f for s, f in subs.items() if s in strict}
    ranked = sorted(subs.items(), key=lambda kv: (-kv[1] * len(kv[0]), kv[0]))[:seed_size]
    out = dict(chars)
    out.update(ranked)
    return out


_BASE = np.uint64(0x9E3779B97F4A7C15)


def _codepoints(words: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All words joined with a separator, as code points; plus each word's start and end offset."""
    lens = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    joined = "\x00".join(words) + "\x00"
    cp = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    starts = np.concatenate([[0], np.cumsum(lens + 1)[:-1]]).astype(np.int64)
    return cp, starts, starts + lens


def _substring_hashes(cp: np.ndarray, word_end_of_pos: np.ndarray, max_len: int):
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
    cp, starts, ends = _codepoints(strings)
    end_of = np.repeat(ends, ends - starts + 1)
    out = np.zeros(len(strings), dtype=np.uint64)
    lens = ends - starts
    for L, idx, h in _substring_hashes(cp, end_of, int(lens.max()) if len(lens) else 0):
        pos = np.searchsorted(starts, idx)
        hit = (pos < len(starts)) & (starts[np.minimum(pos, len(starts) - 1)] == idx) & (lens[np.minimum(pos, len(starts) - 1)] == L)
        out[pos[hit]] = h[hit]
    return out


def seed_pieces_fast(word_counts: dict[str, int], max_piece_length: int = 16, seed_size: int = 1_000_000) -> dict[str, int]:
    """seed_pieces(include_whole_words=True) with vectorized substring counting (hashes)."""
    words = list(word_counts)
    counts = np.fromiter((word_counts[w] for w in words), dtype=np.float64, count=len(words))
    cp, starts, ends = _codepoints(words)
    end_of = np.repeat(ends, ends - starts + 1)
    weight = np.repeat(counts, ends - starts + 1)
    joined = "\x00".join(words)
    out: dict[str, int] = {}
    # running top-`seed_size` candidates (score, length, first position, frequency): memory stays
    # bounded by the seed size instead of growing with every distinct substring of every length
    score = np.zeros(0)
    Ls = np.zeros(0, dtype=np.int32)
    pos = np.zeros(0, dtype=np.int64)
    freq = np.zeros(0)
    for L, idx, h in _substring_hashes(cp, end_of, max_piece_length):
        uniq, first, inv = np.unique(h, return_index=True, return_inverse=True)
        f = np.bincount(inv, weights=weight[idx])
        p = idx[first]
        del uniq, first, inv
        if L == 1:
            for pp, ff in zip(p.tolist(), f.tolist()):
                out[joined[pp]] = int(ff)
            continue
        score = np.concatenate([score, f * L])
        Ls = np.concatenate([Ls, np.full(len(p), L, dtype=np.int32)])
        pos = np.concatenate([pos, p])
        freq = np.concatenate([freq, f])
        if len(score) > seed_size:
            keep = np.sort(np.argpartition(-score, seed_size - 1)[:seed_size])
            score, Ls, pos, freq = score[keep], Ls[keep], pos[keep], freq[keep]
    if len(score):
        top = np.argsort(-score, kind="stable")[:seed_size]
        for i in top.tolist():
            p, L = int(pos[i]), int(Ls[i])
            out[joined[p:p + L]] = int(freq[i])
    return out


class Lattice:
    """All words' segmentation lattices as flat numpy arrays (nodes = positions between chars)."""

    def __init__(self, words: list[str], counts: np.ndarray, piece_id: dict[str, int], max_piece_length: int):
        lens = np.array([len(w) for w in words], dtype=np.int64)
        self.counts = counts
        self.off = np.concatenate([[0], np.cumsum(lens + 1)[:-1]]).astype(np.int64)
        self.ends = self.off + lens
        self.n_nodes = int(self.ends[-1]) + 1 if len(words) else 0
        pieces = sorted(piece_id, key=piece_id.get)
        ph = _string_hashes(pieces)
        order = np.argsort(ph)
        ph_sorted = ph[order]
        pid_sorted = np.array([piece_id[pieces[i]] for i in order.tolist()], dtype=np.int64)
        cp, starts, ends = _codepoints(words)
        end_of = np.repeat(ends, ends - starts + 1)
        es, ee, ep = [], [], []
        for L, idx, h in _substring_hashes(cp, end_of, max_piece_length):
            k = np.searchsorted(ph_sorted, h)
            k = np.minimum(k, len(ph_sorted) - 1)
            hit = ph_sorted[k] == h
            start = idx[hit].astype(np.int32)
            es.append(start)
            ee.append(start + np.int32(L))
            ep.append(pid_sorted[k[hit]].astype(np.int32))
            del k, hit
        # int32 edge arrays: a 1M-piece seed on 10 MB of text has tens of millions of edges
        self.es = np.concatenate(es) if es else np.zeros(0, dtype=np.int32)
        del es
        self.ee = np.concatenate(ee) if ee else np.zeros(0, dtype=np.int32)
        del ee
        self.ep = np.concatenate(ep) if ep else np.zeros(0, dtype=np.int32)
        del ep
        node_word_all = np.repeat(np.arange(len(words), dtype=np.int32), lens + 1)
        self.ew = node_word_all[self.es]
        del node_word_all
        self.node_word = np.repeat(np.arange(len(words)), lens + 1)
        self._index()

    def keep(self, alive: np.ndarray) -> None:
        """Drop the edges of pieces that are no longer in the vocabulary."""
        m = alive[self.ep]
        self.es, self.ee, self.ep, self.ew = self.es[m], self.ee[m], self.ep[m], self.ew[m]
        self._index()

    def _index(self) -> None:
        off = self.off.astype(np.int32)[self.ew]
        local_end = self.ee - off
        local_start = self.es - off
        del off
        # forward order: by local end, then end node, then start (ties keep the longest last piece)
        self.fwd = np.lexsort((self.es, self.ee, local_end)).astype(np.int32)
        self.fwd_batches = _batches(local_end[self.fwd], self.ee[self.fwd])
        self.bwd = np.lexsort((self.ee, self.es, -local_start)).astype(np.int32)
        self.bwd_batches = _batches(-local_start[self.bwd], self.es[self.bwd])

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


def digamma(x: np.ndarray) -> np.ndarray:
    """Digamma for x > 0 (recurrence up to 6, then the asymptotic series), as SentencePiece's M-step uses."""
    x = np.asarray(x, dtype=np.float64).copy()
    result = np.zeros_like(x)
    while True:
        small = x < 6
        if not small.any():
            break
        result[small] -= 1.0 / x[small]
        x[small] += 1.0
    f = 1.0 / (x * x)
    t = f * (-1 / 12.0 + f * (1 / 120.0 + f * (-1 / 252.0 + f * (1 / 240.0 + f * (-1 / 132.0)))))
    return result + np.log(x) - 0.5 / x + t


class UnigramTrainer:
    """State of one training run; methods are the steps the course describes."""

    def __init__(self, word_counts: dict[str, int], seed: dict[str, int], max_piece_length: int = 16):
        items = [(w, c) for w, c in word_counts.items() if w]
        if not items:
            raise BadInput("the corpus has no words to train on. Pass a non-empty text corpus.")
        self.words = [w for w, _ in items]
        self.counts = np.array([c for _, c in items], dtype=np.float64)
        self.pieces = list(seed)
        self.piece_id = {p: i for i, p in enumerate(self.pieces)}
        freq = np.array([seed[p] for p in self.pieces], dtype=np.float64)
        self.logp = np.log(freq) - math.log(freq.sum())
        self.required = np.array([len(p) == 1 for p in self.pieces])
        self.alive = np.ones(len(self.pieces), dtype=bool)
        self.lattice = Lattice(self.words, self.counts, self.piece_id, max_piece_length)

    def _logp(self) -> np.ndarray:
        return np.where(self.alive, self.logp, -np.inf)

    def viterbi_loss(self) -> float:
        """Sum over words of count x (-log P(best segmentation)) — the course's loss."""
        alpha, _ = self.lattice.forward(self._logp(), "max")
        return float(-(self.counts * alpha[self.lattice.ends]).sum())

    def em_step(self) -> float:
        """One EM iteration; returns the negative log marginal likelihood per word occurrence."""
        lat = self.lattice
        logp = self._logp()
        alpha, _ = lat.forward(logp, "sum")
        beta = lat.backward(logp, "sum")
        z = alpha[lat.ends]
        post = np.exp(alpha[lat.es] + logp[lat.ep] + beta[lat.ee] - z[lat.ew]) * self.counts[lat.ew]
        expected = np.bincount(lat.ep, weights=post, minlength=len(self.pieces))
        # M-step with SentencePiece's Bayesian (digamma) estimate; rare pieces drop out
        keep = self.alive & ((expected >= 0.5) | self.required)
        if (~keep & self.alive).any():
            self.alive = keep
            lat.keep(self.alive)
        used = self.alive & (expected >= 0.5)
        total = expected[used].sum()
        logp = np.full(len(self.pieces), -np.inf)
        logp[used] = digamma(expected[used]) - digamma(np.array([total]))[0]
        # characters the model no longer needs stay as fallbacks just below the rarest piece
        spare = np.flatnonzero(self.alive & ~used)
        floor = logp[used].min() if used.any() else 0.0
        logp[spare] = floor - 1e-4 * (1 + np.arange(len(spare)))
        self.logp = logp
        return float(-(self.counts * z).sum() / self.counts.sum())

    def removal_losses(self) -> np.ndarray:
        """Loss increase (Viterbi loss) from removing each piece; inf for required pieces."""
        lat = self.lattice
        logp = self._logp()
        alpha, back = lat.forward(logp, "max")
        beta = lat.backward(logp, "max")
        best = alpha[lat.ends]
        path = lat.viterbi_paths(back)
        through = alpha[lat.es] + logp[lat.ep] + beta[lat.ee]  # best complete path using edge y
        need = np.zeros(lat.n_nodes, dtype=bool)
        need[lat.es[path]] = True
        top1 = np.full(lat.n_nodes, -np.inf)
        top1_edge = np.full(lat.n_nodes, np.iinfo(np.int64).max, dtype=np.int64)
        top2 = np.full(lat.n_nodes, -np.inf)
        chunk = 1 << 20
        for lo in range(0, len(lat.es), chunk):
            edges, nodes = _covered(lat.es[lo:lo + chunk], lat.ee[lo:lo + chunk], lo, need)
            np.maximum.at(top1, nodes, through[edges])
        for lo in range(0, len(lat.es), chunk):
            edges, nodes = _covered(lat.es[lo:lo + chunk], lat.ee[lo:lo + chunk], lo, need)
            hit = through[edges] == top1[nodes]
            # the first edge reaching the maximum owns it; every other edge competes for second place
            np.minimum.at(top1_edge, nodes[hit], edges[hit])
        for lo in range(0, len(lat.es), chunk):
            edges, nodes = _covered(lat.es[lo:lo + chunk], lat.ee[lo:lo + chunk], lo, need)
            other = edges != top1_edge[nodes]
            np.maximum.at(top2, nodes[other], through[edges[other]])
        s = lat.es[path]
        alt = np.where(top1_edge[s] == path, top2[s], top1[s])
        w = lat.ew[path]
        with np.errstate(invalid="ignore"):
            delta = self.counts[w] * (best[w] - alt)
        delta = np.where(np.isfinite(delta), delta, np.inf)
        losses = np.bincount(lat.ep[path], weights=np.where(np.isinf(delta), 0.0, delta), minlength=len(self.pieces))
        inf_pieces = np.unique(lat.ep[path][np.isinf(delta)])
        losses[inf_pieces] = np.inf
        losses[self.required] = np.inf
        return losses

    def prune(self, target: int) -> list[str]:
        """Remove pieces with the smallest loss increase until `target` remain; returns the removed."""
        n_alive = int(self.alive.sum())
        if n_alive <= target:
            return []
        losses = self.removal_losses()
        cand = np.flatnonzero(self.alive & ~self.required)
        # smallest loss first; among equal losses the least probable piece goes first
        order = cand[np.lexsort((self.logp[cand], losses[cand]))]
        removed = order[: n_alive - target]
        self.alive[removed] = False
        self.lattice.keep(self.alive)
        return [self.pieces[i] for i in removed]


def train_unigram(
    word_counts: dict[str, int],
    vocab_size: int,
    special_tokens: Iterable[str] = ("<unk>",),
    unk_token: str | None = "<unk>",
    max_piece_length: int = 16,
    seed_size: int = 1_000_000,
    shrinking_factor: float = 0.75,
    em_iterations: int = 2,
    min_frequency: int = 0,
    progress: Progress | None = None,
    trace: Trace | None = None,
) -> UnigramTrainResult:
    """Train a Unigram model from {word: count} (words already carry the '▁' space marks)."""
    specials = list(dict.fromkeys(special_tokens))
    if unk_token is not None and unk_token not in specials:
        specials.insert(0, unk_token)
    if min_frequency > 1:
        word_counts = {w: c for w, c in word_counts.items() if c >= min_frequency}
    seed = seed_pieces_fast(word_counts, max_piece_length, seed_size)
    n_chars = sum(1 for p in seed if len(p) == 1)
    target = vocab_size - len(specials)
    if target < n_chars:
        raise BadInput(
            f"vocab size {vocab_size} is smaller than the alphabet plus special tokens ({n_chars + len(specials)}). "
            f"Use --vocab-size {n_chars + len(specials)} or more."
        )
    tr = UnigramTrainer(word_counts, seed, max_piece_length)
    rounds = max(1, math.ceil(math.log(max(1.0, len(seed) / max(target, 1))) / -math.log(shrinking_factor)))
    step = 0
    while True:
        for _ in range(em_iterations):
            objective = tr.em_step()
        n_alive = int(tr.alive.sum())
        if n_alive <= target:
            break
        goal = max(target, int(n_alive * shrinking_factor))
        removed = tr.prune(goal)
        step += 1
        if trace is not None:
            trace({"step": step, "em_loss": objective, "viterbi_loss": tr.viterbi_loss(),
                   "vocab": int(tr.alive.sum()), "removed": len(removed), "removed_sample": removed[:10]})
        if progress is not None:
            progress(min(step, rounds), rounds, f"{int(tr.alive.sum())} pieces")
    for _ in range(em_iterations):
        tr.em_step()
    alive = np.flatnonzero(tr.alive)
    ranked = sorted(alive, key=lambda i: (-tr.logp[i], tr.pieces[i]))
    # 12 decimals keep every score within 15 significant digits, which JSON parsers (serde_json's
    # fast path included) read back to exactly the same double: HF then breaks Viterbi ties as we do.
    pieces = [(s, 0.0) for s in specials] + [(tr.pieces[i], round(float(tr.logp[i]), 12)) for i in ranked]
    unk_id = specials.index(unk_token) if unk_token is not None else None
    return UnigramTrainResult(pieces=pieces, unk_id=unk_id, special_tokens=specials)


class Unigram:
    """Viterbi encoder over (piece, log-probability) pairs with SentencePiece-style '▁' spaces."""

    algorithm = "unigram"

    def __init__(self, pieces: list[tuple[str, float]], unk_id: int | None = None, prepend_space: bool = True,
                 byte_fallback: bool = False):
        self.pieces = pieces
        self.vocab = {}
        for i, (p, _) in enumerate(pieces):
            self.vocab.setdefault(p, i)
        self.scores = [s for _, s in pieces]
        self.unk_id = unk_id
        self.prepend_space = prepend_space
        self.byte_fallback = byte_fallback
        self.id_to_token = {i: p for i, (p, _) in enumerate(pieces)}
        self.max_len = max((len(p) for p, _ in pieces), default=1)
        min_score = min((s for s in self.scores), default=0.0)
        self.unk_score = min_score - UNK_PENALTY
        self._cache: dict[str, list[int]] = {}

    def pre_tokenize(self, text: str) -> list[str]:
        return pretok.split_metaspace(text, self.prepend_space)

    def encode_word(self, word: str) -> list[int]:
        """Best segmentation of one word (ties keep the longest final piece, like HF)."""
        n = len(word)
        best = [-math.inf] * (n + 1)
        back: list[tuple[int, int]] = [(-1, -1)] * (n + 1)
        best[0] = 0.0
        vocab, scores, maxlen = self.vocab, self.scores, self.max_len
        for i in range(n):
            if best[i] == -math.inf:
                continue
            bi = best[i]
            single = False
            for j in range(i + 1, min(n, i + maxlen) + 1):
                pid = vocab.get(word[i:j])
                if pid is None:
                    continue
                if j == i + 1:
                    single = True
                s = bi + scores[pid]
                if s > best[j]:
                    best[j] = s
                    back[j] = (i, pid)
            if not single:
                s = bi + self.unk_score
                if s > best[i + 1]:
                    best[i + 1] = s
                    back[i + 1] = (i, -1)
        out: list[int] = []
        j = n
        while j > 0:
            i, pid = back[j]
            if pid == -1:
                if self.byte_fallback:
                    out.extend(reversed([self.vocab[f"<0x{b:02X}>"] for b in word[i:j].encode("utf-8")]))
                elif self.unk_id is None:
                    raise BadInput(f"character {word[i:j]!r} is not in the vocabulary and the tokenizer has no unknown token.")
                elif not out or out[-1] != self.unk_id:  # fuse consecutive unknowns
                    out.append(self.unk_id)
            else:
                out.append(pid)
            j = i
        out.reverse()
        return out

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        for w in self.pre_tokenize(text):
            ids = cache.get(w)
            if ids is None:
                ids = self.encode_word(w)
                if len(cache) < 500_000:
                    cache[w] = ids
            out.extend(ids)
        return out

    def decode(self, ids: list[int]) -> str:
        buf = bytearray()
        for i in ids:
            t = self.id_to_token[i]
            if self.byte_fallback and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                buf.append(int(t[3:5], 16))
            else:
                buf += t.encode("utf-8", "surrogatepass")
        text = buf.decode("utf-8", "replace").replace(pretok.SPACE_MARK, " ")
        return text[1:] if self.prepend_space and text.startswith(" ") else text


def _covered(es: np.ndarray, ee: np.ndarray, base: int, need: np.ndarray):
    """(edge id, node) for every node an edge covers (es <= node < ee), kept where need[node]."""
    lens = ee - es
    edges = np.repeat(np.arange(base, base + len(es)), lens)
    firsts = np.repeat(es, lens)
    step = np.arange(len(edges)) - np.repeat(np.cumsum(lens) - lens, lens)
    nodes = firsts + step
    m = need[nodes]
    return edges[m], nodes[m]
