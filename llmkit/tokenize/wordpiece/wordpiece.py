"""WordPiece: merge the pair with the highest likelihood score, encode by greedy longest match.

score(a, b) = freq(ab) / (freq(a) * freq(b)) — a pair is merged when its parts are more often
together than their own frequencies predict. (HF's WordPieceTrainer ranks by raw pair count like
BPE; this is the score the WordPiece papers and the HF course describe.) Word-internal pieces carry
the '##' continuation prefix.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from llmkit.errors import BadInput
from llmkit.tokenize import pretok
from llmkit.tokenize.pieces import (PairMerges, Progress, Trace, Vocab, WordEncoder, check_vocab_size, kept_alphabet,
                                    merge_pair)


@dataclass
class WordPieceTrainResult:
    vocab: list[str]
    special_tokens: list[str] = field(default_factory=list)


def train_wordpiece(
    word_counts: dict[str, int],
    vocab_size: int,
    min_frequency: int = 0,
    special_tokens: Iterable[str] = (),
    prefix: str = "##",
    progress: Progress | None = None,
    trace: Trace | None = None,
    trace_top: int = 5,
    work_bytes: int = 0,
    limit_alphabet: int | None = None,
) -> WordPieceTrainResult:
    """Learn a WordPiece vocabulary from {word: count}; the compiled loop (`wordpiece_native`) runs
    it when the kernels are available and no trace is asked for (`work_bytes`: see native.kernels).
    With `limit_alphabet` only the most frequent characters are kept (`kept_alphabet`) and the
    others are left out of the words, as HF's trainer does.

    Ties in score go to the pair seen first in the corpus (word order, then position in the word),
    the rule of the HF course's reference implementation; the result is deterministic.

    >>> train_wordpiece({"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}, 10).vocab
    ['b', 'h', 'p', '##g', '##n', '##s', '##u', '##gs', 'hu', 'hugs']
    """
    specials = list(dict.fromkeys(special_tokens))
    kept = None
    if limit_alphabet is not None:
        chars: dict[str, int] = defaultdict(int)
        for w, c in word_counts.items():
            for ch in w:
                chars[ch] += c
        kept = kept_alphabet(chars, limit_alphabet)
    firsts, rests = set(), set()
    for w in word_counts:
        if w:
            firsts.add(w[0])
            rests.update(w[1:])
    if kept is not None:
        firsts &= kept
        rests &= kept
    vocab = Vocab(specials + sorted(firsts, key=ord) + [prefix + c for c in sorted(rests, key=ord)])
    check_vocab_size(vocab_size, len(vocab), alphabet=True)
    words: list[list[int]] = []
    counts: list[int] = []
    for w, c in word_counts.items():
        if kept is not None:
            # a left-out character is skipped and its neighbours become a pair; the prefix still
            # follows the position in the whole word (HF's BpeTrainer::tokenize_words)
            ids = [vocab.ids[ch if i == 0 else prefix + ch] for i, ch in enumerate(w) if ch in kept]
        else:
            ids = [vocab.ids[w[0]]] + [vocab.ids[prefix + ch] for ch in w[1:]] if w else []
        if ids:
            words.append(ids)
            counts.append(c)
    if trace is None:
        from llmkit.tokenize.wordpiece import wordpiece_native

        tokens = wordpiece_native.train(vocab, words, counts, vocab_size, prefix, min_frequency, progress, work_bytes)
        if tokens is not None:
            return WordPieceTrainResult(vocab=tokens, special_tokens=specials)
    WordPieceMerges(vocab, words, counts, prefix, min_frequency, trace_top).run(vocab_size, progress, trace)
    return WordPieceTrainResult(vocab=vocab.tokens, special_tokens=specials)


class WordPieceMerges(PairMerges):
    """The highest score first, ties to the pair seen first. Merging a pair lowers its parts'
    frequencies, which raises the score of every other pair holding them: those are pushed again,
    and an entry whose score is out of date goes back with the current one."""

    def __init__(self, vocab, words, counts, prefix: str, min_frequency: int, trace_top: int):
        super().__init__(vocab, words, counts, prefix)
        self.min_frequency = min_frequency
        self.trace_top = trace_top
        self.freq: dict[int, int] = defaultdict(int)
        self.pair_counts: dict[tuple[int, int], int] = defaultdict(int)
        # pair -> words containing it, as lists (duplicates allowed, removed when used): a list costs
        # a third of a set, and pairs are the largest structure of the run
        self.where: dict[tuple[int, int], list[int]] = defaultdict(list)
        self.pairs_of: dict[int, set[tuple[int, int]]] = defaultdict(set)
        self.first_seen: dict[tuple[int, int], tuple[int, int]] = {}
        for i, w in enumerate(words):
            c = counts[i]
            for t in w:
                self.freq[t] += c
            for j, p in enumerate(zip(w, w[1:])):
                self.pair_counts[p] += c
                if not self.where[p] or self.where[p][-1] != i:
                    self.where[p].append(i)
                if p not in self.first_seen:
                    self.first_seen[p] = (i, j)
        for p in self.pair_counts:
            self.pairs_of[p[0]].add(p)
            self.pairs_of[p[1]].add(p)
        self.heap = [(-self.score(p), self.first_seen[p], p[0], p[1]) for p in self.pair_counts]
        heapq.heapify(self.heap)

    def score(self, p: tuple[int, int]) -> float:
        c = self.pair_counts[p]
        return c / (self.freq[p[0]] * self.freq[p[1]]) if c > 0 else 0.0

    def check(self, entry):
        negs, order, a, b = entry
        p = (a, b)
        c = self.pair_counts[p]
        if c <= 0 or c < self.min_frequency:
            return None
        s = self.score(p)
        if s != -negs:
            heapq.heappush(self.heap, (-s, order, a, b))  # stale entry: re-queue with the current score
            return None
        return p

    def trace_step(self, step: int, entry) -> dict:
        a, b = entry[2], entry[3]
        p = (a, b)
        s = self.score(p)
        cand = [(s, a, b)]
        for e in heapq.nsmallest(self.trace_top * 4, self.heap):
            q = (e[2], e[3])
            if self.pair_counts[q] > 0 and self.score(q) == -e[0] and q != p and (-e[0], q[0], q[1]) not in cand:
                cand.append((-e[0], q[0], q[1]))
        tok = self.vocab.tokens
        return {"step": step, "merge": [tok[a], tok[b]], "score": s, "pair_count": self.pair_counts[p],
                "top_scores": [[tok[x], tok[y], sc] for sc, x, y in cand[:self.trace_top]]}

    def merge(self, pair, new, entry) -> None:
        a, b = pair
        touched: set[tuple[int, int]] = set()
        for wi in sorted(set(self.where.pop(pair, ()))):
            w = self.words[wi]
            wc = self.counts[wi]
            n_before = len(w)
            for q, i in merge_pair(w, a, b, new, wc, self.pair_counts):
                self.where[q].append(wi)
                if q not in self.first_seen:
                    self.first_seen[q] = (wi, i)
                self.pairs_of[q[0]].add(q)
                self.pairs_of[q[1]].add(q)
                touched.add(q)
            merged = (n_before - len(w)) * wc
            self.freq[a] -= merged
            self.freq[b] -= merged
            self.freq[new] += merged
        self.pair_counts[pair] = 0
        # scores rise for every pair that shares a part whose frequency just fell
        for t in (a, b):
            if self.freq[t] > 0:
                live = {q for q in self.pairs_of[t] if self.pair_counts[q] > 0}
                self.pairs_of[t] = live
                touched |= live
        for q in touched:
            if self.pair_counts[q] > 0:
                heapq.heappush(self.heap, (-self.score(q), self.first_seen[q], q[0], q[1]))


class WordPiece(WordEncoder):
    """Greedy longest-match-first WordPiece encoder with BERT normalization and pre-tokenization."""

    algorithm = "wordpiece"

    def __init__(
        self,
        vocab: dict[str, int],
        unk_token: str = "[UNK]",
        prefix: str = "##",
        max_input_chars_per_word: int = 100,
        lowercase: bool = False,
        bert_normalizer: bool = True,
    ):
        self.vocab = vocab
        self.unk_token = unk_token
        self.prefix = prefix
        self.max_chars = max_input_chars_per_word
        self.lowercase = lowercase
        self.bert_normalizer = bert_normalizer
        self.id_to_token = {i: t for t, i in vocab.items()}
        self.max_len = max((len(t) for t in vocab), default=1)
        self._cache: dict[str, list[int]] = {}

    def pre_tokenize(self, text: str) -> list[str]:
        if self.bert_normalizer:
            text = pretok.bert_normalize(text, self.lowercase)
        elif self.lowercase:
            text = text.lower()
        return pretok.split_bert(text)

    def encode_word(self, word: str) -> list[int]:
        """Greedy longest match from the left; the whole word becomes [UNK] if any part fails.

        >>> WordPiece({"b": 0, "##u": 1, "##gs": 2, "[UNK]": 3}).encode_word("bugs")
        [0, 1, 2]
        """
        vocab = self.vocab
        if len(word) > self.max_chars:
            return [self._unk()]
        out = []
        start = 0
        n = len(word)
        while start < n:
            end = min(n, start + self.max_len)
            found = None
            while end > start:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                i = vocab.get(piece)
                if i is not None:
                    found = i
                    break
                end -= 1
            if found is None:
                return [self._unk()]
            out.append(found)
            start = end
        return out

    def _unk(self) -> int:
        i = self.vocab.get(self.unk_token)
        if i is None:
            raise BadInput(f"a word cannot be covered and the vocabulary has no '{self.unk_token}' token.")
        return i

    def decode(self, ids: list[int]) -> str:
        """Join pieces: '##' pieces attach to the previous one, others get a space."""
        parts: list[str] = []
        for i in ids:
            t = self.id_to_token[i]
            if t.startswith(self.prefix) and parts:
                parts[-1] += t[len(self.prefix):]
            else:
                parts.append(t)
        return " ".join(parts)
