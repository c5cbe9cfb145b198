"""Unigram language-model training: a seed vocabulary, EM over piece probabilities, pruning.

Training (Kudo 2018, as in SentencePiece): start from a large seed vocabulary of frequent
substrings, run EM (forward-backward expected counts over each word's segmentation lattice),
then remove the pieces whose removal raises the corpus loss least, keeping every single
character; repeat until the vocabulary has the requested size. The seed is kept as arrays (a piece
is a position and a length in the joined words), and the lattice computations are vectorized over
all words at once with numpy: one batch per position inside a word.

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
from llmkit.tokenize.unigram.unigram_lattice import Lattice, codepoints, covered_nodes, substring_hashes


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


@dataclass
class Seed:
    """The seed vocabulary as arrays, no piece strings: piece i is `joined[pos[i]:pos[i] + length[i]]`
    (characters first, in hash order, then the ranked substrings), with its corpus frequency `freq[i]`.
    `by_length[L - 1]` keeps, for every in-word position where a substring of length L starts, which
    distinct substring it is, so the lattice's edges need no second search."""

    joined: str
    pos: np.ndarray
    length: np.ndarray
    freq: np.ndarray
    by_length: list  # per L: (start positions int32, distinct-substring index int32, piece id per index)

    def __len__(self) -> int:
        return len(self.pos)

    def piece(self, i: int) -> str:
        return self.joined[int(self.pos[i]):int(self.pos[i]) + int(self.length[i])]

    def take_edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start node, end node, piece id) of every occurrence of a seed piece, by length then position;
        `by_length` is emptied on the way (the edges replace it, so the two never coexist whole)."""
        hits = [int(np.count_nonzero(pid_of[inv] >= 0)) for _, inv, pid_of in self.by_length]
        es, ee, ep = (np.empty(sum(hits), dtype=np.int32) for _ in range(3))
        at = 0
        for L, n in enumerate(hits, start=1):
            idx, inv, pid_of = self.by_length[L - 1]
            self.by_length[L - 1] = None
            pid = pid_of[inv]
            hit = pid >= 0
            es[at:at + n] = idx[hit]
            ee[at:at + n] = es[at:at + n] + np.int32(L)
            ep[at:at + n] = pid[hit]
            at += n
            del idx, inv, pid_of, pid, hit
        self.by_length = []
        return es, ee, ep


def build_seed(words: list[str], counts: np.ndarray, max_piece_length: int = 16, seed_size: int = 1_000_000) -> Seed:
    """seed_pieces(include_whole_words=True) as arrays, substrings counted by hash.

    >>> s = build_seed(["hug", "pug"], np.array([10.0, 5.0]), seed_size=2)
    >>> [(s.piece(i), int(s.freq[i])) for i in range(len(s)) if s.length[i] > 1]
    [('ug', 15), ('hug', 10)]
    """
    cp, starts, ends = codepoints(words)
    end_of = np.repeat(ends, ends - starts + 1)
    weight = np.repeat(counts, ends - starts + 1)
    joined = "\x00".join(words)
    by_length = []
    chars_pos = np.zeros(0, dtype=np.int64)
    chars_freq = np.zeros(0)
    # running top-`seed_size` candidates (score, length, first position, frequency, distinct index):
    # memory stays bounded by the seed size instead of growing with every distinct substring
    score = np.zeros(0)
    Ls = np.zeros(0, dtype=np.int32)
    pos = np.zeros(0, dtype=np.int64)
    freq = np.zeros(0)
    uid = np.zeros(0, dtype=np.int32)
    for L, idx, h in substring_hashes(cp, end_of, max_piece_length):
        _, first, inv = np.unique(h, return_index=True, return_inverse=True)
        f = np.bincount(inv, weights=weight[idx])
        p = idx[first]
        by_length.append((idx.astype(np.int32), inv.astype(np.int32), len(first)))
        del first, inv
        if L == 1:
            chars_pos, chars_freq = p, f
            continue
        score = np.concatenate([score, f * L])
        Ls = np.concatenate([Ls, np.full(len(p), L, dtype=np.int32)])
        pos = np.concatenate([pos, p])
        freq = np.concatenate([freq, f])
        uid = np.concatenate([uid, np.arange(len(p), dtype=np.int32)])
        if len(score) > seed_size:
            keep = np.sort(np.argpartition(-score, seed_size - 1)[:seed_size])
            score, Ls, pos, freq, uid = score[keep], Ls[keep], pos[keep], freq[keep], uid[keep]
    top = np.argsort(-score, kind="stable")[:seed_size]
    n_chars = len(chars_pos)
    top_len, top_uid = Ls[top], uid[top]
    for L in range(1, len(by_length) + 1):
        idx, inv, n = by_length[L - 1]
        if L == 1:
            pid_of = np.arange(n, dtype=np.int32)
        else:
            pid_of = np.full(n, -1, dtype=np.int32)
            mine = np.flatnonzero(top_len == L)
            pid_of[top_uid[mine]] = (n_chars + mine).astype(np.int32)
        by_length[L - 1] = (idx, inv, pid_of)
    return Seed(joined=joined, pos=np.concatenate([chars_pos, pos[top]]),
                length=np.concatenate([np.ones(n_chars, dtype=np.int32), Ls[top]]),
                freq=np.concatenate([chars_freq, freq[top]]).astype(np.int64).astype(np.float64),
                by_length=by_length)


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

    def __init__(self, word_counts: dict[str, int], seed: "dict[str, int] | Seed", max_piece_length: int = 16):
        items = [(w, c) for w, c in word_counts.items() if w]
        if not items:
            raise BadInput("the corpus has no words to train on. Pass a non-empty text corpus.")
        self.words = [w for w, _ in items]
        self.counts = np.array([c for _, c in items], dtype=np.float64)
        lens = np.array([len(w) for w in self.words], dtype=np.int64)
        if isinstance(seed, Seed):
            self._seed = seed
            freq = seed.freq
            self.required = seed.length == 1
            self.lattice = Lattice(lens, self.counts, *seed.take_edges())
        else:
            self._seed = None
            self._pieces = list(seed)
            self.n_pieces = len(self._pieces)
            freq = np.array([seed[p] for p in self._pieces], dtype=np.float64)
            self.required = np.array([len(p) == 1 for p in self._pieces])
            self.lattice = Lattice.from_pieces(self.words, self.counts, self.piece_id, max_piece_length)
        self.logp = np.log(freq) - math.log(freq.sum())
        self.n_pieces = len(freq)
        self.alive = np.ones(self.n_pieces, dtype=bool)

    def piece(self, i: int) -> str:
        return self._seed.piece(i) if self._seed is not None else self._pieces[i]

    @property
    def piece_id(self) -> dict[str, int]:
        """{piece: id} of every seed piece (built on first use: a million strings for a real seed)."""
        if getattr(self, "_piece_id", None) is None:
            self._piece_id = {self.piece(i): i for i in range(self.n_pieces)}
        return self._piece_id

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
        expected = np.bincount(lat.ep, weights=post, minlength=self.n_pieces)
        # M-step with SentencePiece's Bayesian (digamma) estimate; rare pieces drop out
        keep = self.alive & ((expected >= 0.5) | self.required)
        if (~keep & self.alive).any():
            self.alive = keep
            lat.keep(self.alive)
        used = self.alive & (expected >= 0.5)
        total = expected[used].sum()
        logp = np.full(self.n_pieces, -np.inf)
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
        losses = np.bincount(lat.ep[path], weights=np.where(np.isinf(delta), 0.0, delta), minlength=self.n_pieces)
        inf_pieces = np.unique(lat.ep[path][np.isinf(delta)])
        losses[inf_pieces] = np.inf
        losses[self.required] = np.inf
        return losses

    def prune(self, target: int) -> np.ndarray:
        """Remove pieces with the smallest loss increase until `target` remain; returns their ids."""
        n_alive = int(self.alive.sum())
        if n_alive <= target:
            return np.zeros(0, dtype=np.int64)
        losses = self.removal_losses()
        cand = np.flatnonzero(self.alive & ~self.required)
        # smallest loss first; among equal losses the least probable piece goes first
        order = cand[np.lexsort((self.logp[cand], losses[cand]))]
        removed = order[: n_alive - target]
        self.alive[removed] = False
        self.lattice.keep(self.alive)
        return removed


def _unmap_large_frees() -> None:
    """Give the lattice's large temporaries back to the kernel when they are freed. glibc raises its
    mmap threshold after each large free, so later arrays of tens of MB come from the heap and stay
    resident after use; a fixed threshold keeps them mmapped. Process-wide, memory only; skipped where
    there is no glibc."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 256 << 10)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


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
    _unmap_large_frees()
    specials = list(dict.fromkeys(special_tokens))
    if unk_token is not None and unk_token not in specials:
        specials.insert(0, unk_token)
    if min_frequency > 1:
        word_counts = {w: c for w, c in word_counts.items() if c >= min_frequency}
    words = [w for w in word_counts if w]
    seed = build_seed(words, np.array([word_counts[w] for w in words], dtype=np.float64), max_piece_length, seed_size)
    n_chars = int((seed.length == 1).sum())
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
                   "vocab": int(tr.alive.sum()), "removed": len(removed),
                   "removed_sample": [tr.piece(i) for i in removed[:10].tolist()]})
        if progress is not None:
            progress(min(step, rounds), rounds, f"{int(tr.alive.sum())} pieces")
    for _ in range(em_iterations):
        tr.em_step()
    alive = np.flatnonzero(tr.alive)
    ranked = sorted(alive.tolist(), key=lambda i: (-tr.logp[i], tr.piece(i)))
    # 12 decimals keep every score within 15 significant digits, which JSON parsers (serde_json's
    # fast path included) read back to exactly the same double: HF then breaks Viterbi ties as we do.
    pieces = [(s, 0.0) for s in specials] + [(tr.piece(i), round(float(tr.logp[i]), 12)) for i in ranked]
    unk_id = specials.index(unk_token) if unk_token is not None else None
    return UnigramTrainResult(pieces=pieces, unk_id=unk_id, special_tokens=specials)
