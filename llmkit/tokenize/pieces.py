"""Building blocks the subword algorithms share: the vocabulary a trainer grows, one merge of a
pair inside a word and the merge loop around it (BPE and WordPiece), and word-by-word encoding with
a cache (every encoder)."""

from __future__ import annotations

import heapq
from typing import Callable, Iterable

from llmkit.errors import OptionError

Progress = Callable[[int, int, str], None]  # (done, total, note)
Trace = Callable[[dict], None]  # one training step, as JSON-ready data


def check_vocab_size(vocab_size: int, needed: int, alphabet: bool = False) -> None:
    """Refuse a vocabulary too small for the alphabet and the special tokens; `alphabet`: the
    trainer can keep fewer characters (`limit_alphabet`), so the fix names that too."""
    if vocab_size < needed:
        fix = " or {limit_alphabet} N to keep the N most frequent characters" if alphabet else ""
        raise OptionError("vocab size {size} is smaller than the alphabet plus special tokens ({needed}). "
                          "Use {vocab_size} {needed} or more" + fix + ".", size=vocab_size, needed=needed)


class Vocab:
    """Tokens in id order while training; adding a known token returns its id.

    >>> v = Vocab(["<unk>"]); v.add("a"), v.add("<unk>"), v.tokens
    (1, 0, ['<unk>', 'a'])
    """

    def __init__(self, tokens: Iterable[str] = ()):
        self.tokens: list[str] = []
        self.ids: dict[str, int] = {}
        for t in tokens:
            self.add(t)

    def add(self, token: str) -> int:
        i = self.ids.get(token)
        if i is None:
            i = self.ids[token] = len(self.tokens)
            self.tokens.append(token)
        return i

    def __len__(self) -> int:
        return len(self.ids)


def merge_pair(w: list[int], a: int, b: int, new: int, count: int, pair_counts: dict) -> list[tuple[tuple[int, int], int]]:
    """Replace each (a, b) in word `w` by `new`, left to right, moving the word's `count` from the
    neighbouring pairs to the pairs they form with `new` (HF Word::merge); returns those new pairs
    with the position of their first token, in the order they arose.

    >>> from collections import defaultdict
    >>> w, pc = [1, 2, 3], defaultdict(int, {(1, 2): 5, (2, 3): 5})
    >>> merge_pair(w, 2, 3, 9, 5, pc), w, pc[(1, 9)]
    ([((1, 9), 0)], [1, 9], 5)
    """
    made = []
    i = 0
    n = len(w)
    while i < n - 1:
        if w[i] == a and w[i + 1] == b:
            if i > 0:
                left = w[i - 1]
                pair_counts[(left, a)] -= count
                p = (left, new)
                pair_counts[p] += count
                made.append((p, i - 1))
            w[i:i + 2] = (new,)
            n -= 1
            if i < n - 1:
                right = w[i + 1]
                pair_counts[(b, right)] -= count
                p = (new, right)
                pair_counts[p] += count
                made.append((p, i))
        i += 1
    return made


STOP = object()  # PairMerges.check: training ends here


class PairMerges:
    """The training loop BPE and WordPiece share: pop the best pair from a heap, skip an entry that
    is out of date, join the pair into a new token, merge it in the words that hold it and push the
    pairs that changed. Subclasses fill `heap` and say what "best" and "out of date" mean:
    `check(entry)` returns the pair to merge, None to skip the entry or STOP; `merge(pair, new,
    entry)` updates the words and the heap; `trace_step(step, entry)` describes a step for --trace."""

    def __init__(self, vocab: Vocab, words: list[list[int]], counts: list[int], prefix: str | None):
        self.vocab = vocab
        self.words = words
        self.counts = counts
        self.prefix = prefix
        self.heap: list = []
        self.merges: list[tuple[int, int]] = []

    def check(self, entry):
        raise NotImplementedError

    def merge(self, pair: tuple[int, int], new: int, entry) -> None:
        raise NotImplementedError

    def trace_step(self, step: int, entry) -> dict:
        raise NotImplementedError

    def joined(self, pair: tuple[int, int]) -> str:
        """The new token's text: the right part loses its continuation prefix."""
        a, b = (self.vocab.tokens[x] for x in pair)
        p = self.prefix
        return a + (b[len(p):] if p and b.startswith(p) else b)

    def run(self, vocab_size: int, progress: Progress | None = None, trace: Trace | None = None) -> None:
        """Merge until the vocabulary has `vocab_size` tokens, the heap is empty or check() says STOP."""
        total_steps = max(1, vocab_size - len(self.vocab))
        step = 0
        while len(self.vocab) < vocab_size and self.heap:
            entry = heapq.heappop(self.heap)
            pair = self.check(entry)
            if pair is STOP:
                break
            if pair is None:
                continue
            if trace is not None:
                trace(self.trace_step(step + 1, entry))
            new = self.vocab.add(self.joined(pair))
            self.merges.append(pair)
            self.merge(pair, new, entry)
            step += 1
            if progress is not None and step % 64 == 0:
                progress(step, total_steps, "merges")
        if progress is not None:
            progress(step, total_steps, "merges")


class WordEncoder:
    """Encoding text as the concatenation of its pre-tokens' ids, each pre-token encoded once and
    cached. Subclasses give `pre_tokenize(text)`, `encode_word(word)` and a `_cache` dict;
    `word_symbols(piece)` maps a pre-token to what encode_word reads (e.g. GPT-2's byte symbols)."""

    cache_limit: int | None = 500_000

    def word_symbols(self, piece: str) -> str:
        return piece

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        limit = self.cache_limit
        for piece in self.pre_tokenize(text):
            ids = cache.get(piece)
            if ids is None:
                ids = self.encode_word(self.word_symbols(piece))
                if limit is None or len(cache) < limit:
                    cache[piece] = ids
            out.extend(ids)
        return out


def kept_alphabet(char_counts: dict[str, int], limit: int) -> set[str]:
    """The `limit` characters with the highest counts (each occurrence weighted by its word's count),
    as HF's `limit_alphabet` keeps them; ties at the cut go to the lower code point (HF's unstable
    sort leaves them to chance).

    >>> sorted(kept_alphabet({"a": 5, "b": 1, "c": 3, "d": 1}, 3))
    ['a', 'b', 'c']
    """
    if limit < 1:
        raise OptionError("limit alphabet must be positive, got {value}. Pass {limit_alphabet} N with N > 0.",
                          value=limit)
    return set(sorted(char_counts, key=lambda ch: (-char_counts[ch], ord(ch)))[:limit])
