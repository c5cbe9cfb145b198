"""Unigram language-model training: a seed vocabulary, EM over piece probabilities, pruning.

Training (Kudo 2018, as in SentencePiece): start from a large seed vocabulary of frequent
substrings, run EM (forward-backward expected counts over each word's segmentation lattice),
then remove the pieces whose removal raises the corpus loss least, keeping every single
character; repeat until the vocabulary has the requested size. The lattice computations are
vectorized over all words at once with numpy: one batch per position inside a word.

The encoder (Viterbi segmentation) is `unigram.Unigram`; the lattice arrays are in `unigram_lattice`.

The loss increase for removing piece x is computed exactly for its occurrences in each word's
best (Viterbi) segmentation: the best path that avoids an edge x starting at position s must use
some other edge covering s, so it is the best "path through y" over edges y != x covering s.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from llmkit.errors import BadInput
from llmkit.tokenize.pieces import Progress, Trace, check_vocab_size
from llmkit.tokenize.unigram_lattice import Lattice, codepoints, covered_nodes, substring_hashes


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


def seed_pieces_fast(word_counts: dict[str, int], max_piece_length: int = 16, seed_size: int = 1_000_000) -> dict[str, int]:
    """seed_pieces(include_whole_words=True) with vectorized substring counting (hashes)."""
    words = list(word_counts)
    counts = np.fromiter((word_counts[w] for w in words), dtype=np.float64, count=len(words))
    cp, starts, ends = codepoints(words)
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
    for L, idx, h in substring_hashes(cp, end_of, max_piece_length):
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
            edges, nodes = covered_nodes(lat.es[lo:lo + chunk], lat.ee[lo:lo + chunk], lo, need)
            np.maximum.at(top1, nodes, through[edges])
        for lo in range(0, len(lat.es), chunk):
            edges, nodes = covered_nodes(lat.es[lo:lo + chunk], lat.ee[lo:lo + chunk], lo, need)
            hit = through[edges] == top1[nodes]
            # the first edge reaching the maximum owns it; every other edge competes for second place
            np.minimum.at(top1_edge, nodes[hit], edges[hit])
        for lo in range(0, len(lat.es), chunk):
            edges, nodes = covered_nodes(lat.es[lo:lo + chunk], lat.ee[lo:lo + chunk], lo, need)
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
    check_vocab_size(vocab_size, n_chars + len(specials))
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
