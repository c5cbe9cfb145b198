"""Byte-pair encoding: training (count words, merge the most frequent pair) and encoding by merge rank.

Training follows HF `tokenizers`' BpeTrainer exactly, so both produce the same merges in the same
order: the alphabet is sorted by code point, each step merges the pair with the highest count and,
among equal counts, the smallest pair of token ids; pair counts are updated incrementally.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from llmkit.errors import BadInput
from llmkit.tokenize import pretok
from llmkit.tokenize.pieces import (STOP, PairMerges, Progress, Trace, Vocab, WordEncoder, check_vocab_size,
                                    merge_pair)


@dataclass
class BPETrainResult:
    vocab: list[str]
    merges: list[tuple[str, str]]
    special_tokens: list[str] = field(default_factory=list)


def alphabet_of(word_counts: dict[str, int], initial_alphabet: Iterable[str] = (), limit_alphabet: int | None = None) -> list[str]:
    """Characters of the corpus sorted by code point, optionally keeping only the most frequent.

    >>> alphabet_of({"hug": 2, "bun": 1})
    ['b', 'g', 'h', 'n', 'u']
    """
    counts: Counter = Counter()
    for word, c in word_counts.items():
        for ch in word:
            counts[ch] += c
    for ch in initial_alphabet:
        counts[ch] = 1 << 62
    kept = list(counts.items())
    if limit_alphabet is not None and len(kept) > limit_alphabet:
        kept.sort(key=lambda kv: kv[1])
        kept = kept[len(kept) - limit_alphabet:]
    return sorted((ch for ch, _ in kept), key=ord)


def train_bpe(
    word_counts: dict[str, int],
    vocab_size: int,
    min_frequency: int = 0,
    special_tokens: Iterable[str] = (),
    initial_alphabet: Iterable[str] = (),
    limit_alphabet: int | None = None,
    continuing_subword_prefix: str | None = None,
    progress: Progress | None = None,
    trace: Trace | None = None,
    trace_top: int = 5,
    work_bytes: int = 0,
) -> BPETrainResult:
    """Learn merges from {word: count} until the vocabulary has `vocab_size` entries; the compiled
    loop (`bpe_train_native`) runs it when the kernels are available, no trace is asked for and
    there is no continuing-subword prefix (`work_bytes`: see native.kernels).

    >>> r = train_bpe({"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}, 10)
    >>> r.merges
    [('u', 'g'), ('u', 'n'), ('h', 'ug')]
    """
    specials = list(dict.fromkeys(special_tokens))
    vocab = Vocab(specials)
    for ch in alphabet_of(word_counts, initial_alphabet, limit_alphabet):
        vocab.add(ch)
    check_vocab_size(vocab_size, len(vocab))
    prefix = continuing_subword_prefix
    words: list[list[int]] = []  # words as lists of symbol ids
    counts: list[int] = []
    for word, c in word_counts.items():
        ids = []
        for j, ch in enumerate(word):
            if ch not in vocab.ids:
                continue  # removed by limit_alphabet
            ids.append(vocab.add(ch if (j == 0 or not prefix) else prefix + ch))
        words.append(ids)
        counts.append(c)
    if trace is None and not prefix:
        from llmkit.tokenize.bpe import bpe_train_native

        done = bpe_train_native.train(vocab, bpe_train_native.words_from_lists(words, counts), vocab_size,
                                      min_frequency, progress, work_bytes)
        if done is not None:
            tokens, merges = done
            return BPETrainResult(vocab=tokens, merges=[(tokens[a], tokens[b]) for a, b in merges],
                                  special_tokens=specials)
    m = BPEMerges(vocab, words, counts, prefix, min_frequency, trace_top)
    m.run(vocab_size, progress, trace)
    tokens = vocab.tokens
    return BPETrainResult(vocab=tokens, merges=[(tokens[a], tokens[b]) for a, b in m.merges], special_tokens=specials)


class BPEMerges(PairMerges):
    """HF BpeTrainer's order: the highest count first, then the smallest pair of ids. A heap entry
    carries the words where its pair was counted, as HF's does; an entry whose count is out of date
    goes back with the current count, and training stops below `min_frequency`."""

    def __init__(self, vocab, words, counts, prefix, min_frequency: int, trace_top: int):
        super().__init__(vocab, words, counts, prefix)
        self.min_frequency = min_frequency
        self.trace_top = trace_top
        self.pair_counts: dict[tuple[int, int], int] = defaultdict(int)
        where: dict[tuple[int, int], set[int]] = defaultdict(set)
        for i, w in enumerate(words):
            c = counts[i]
            for pair in zip(w, w[1:]):
                self.pair_counts[pair] += c
                where[pair].add(i)
        self.seq = 0  # keeps heap tuples comparable without comparing the sets
        for pair, pos in where.items():
            c = self.pair_counts[pair]
            if c > 0:
                self.heap.append((-c, pair[0], pair[1], self.seq, pos))
                self.seq += 1
        heapq.heapify(self.heap)

    def _push(self, count: int, pair: tuple[int, int], pos: set[int]) -> None:
        heapq.heappush(self.heap, (-count, pair[0], pair[1], self.seq, pos))
        self.seq += 1

    def check(self, entry):
        negc, a, b, _, pos = entry
        cur = self.pair_counts[(a, b)]
        if -negc != cur:
            if cur > 0:
                self._push(cur, (a, b), pos)
            return None
        if cur < 1 or cur < self.min_frequency:
            return STOP
        return (a, b)

    def trace_step(self, step: int, entry) -> dict:
        negc, a, b = entry[:3]
        tok = self.vocab.tokens
        pc = self.pair_counts
        top = [(e[0], e[1], e[2]) for e in heapq.nsmallest(self.trace_top * 4, self.heap) if -e[0] == pc[(e[1], e[2])]]
        return {"step": step, "merge": [tok[a], tok[b]], "count": -negc,
                "top_pairs": [[tok[x], tok[y], -n] for (n, x, y) in [(negc, a, b)] + top][:self.trace_top]}

    def merge(self, pair, new, entry) -> None:
        a, b = pair
        new_where: dict[tuple[int, int], set[int]] = defaultdict(set)
        for wi in entry[4]:
            for p, _ in merge_pair(self.words[wi], a, b, new, self.counts[wi], self.pair_counts):
                new_where[p].add(wi)
        for p, ws in new_where.items():
            c = self.pair_counts[p]
            if c > 0:
                self._push(c, p, ws)


NATIVE_MIN_CHARS = 256


class BPE(WordEncoder):
    """A BPE model: vocabulary, ranked merges and a pre-tokenizer (byte-level GPT-2 style by default)."""

    algorithm = "bpe"

    def __init__(
        self,
        vocab: dict[str, int],
        merges: list[tuple[str, str]],
        byte_level: bool = True,
        pattern: str = pretok.GPT2_PATTERN,
        add_prefix_space: bool = False,
        unk_token: str | None = None,
        continuing_subword_prefix: str | None = None,
        byte_fallback: bool = False,
        split: str = "whitespace",
        ignore_merges: bool = False,
    ):
        self.split = split  # non-byte-level pre-tokenizer: "whitespace", "whitespace_punct" or "none"
        self.ignore_merges = ignore_merges
        self.vocab = vocab
        self.merges = merges
        self.byte_level = byte_level
        self.pattern = pattern
        self.add_prefix_space = add_prefix_space
        self.unk_token = unk_token
        self.continuing_subword_prefix = continuing_subword_prefix
        self.byte_fallback = byte_fallback
        self.id_to_token = {i: t for t, i in vocab.items()}
        # rank and result id per pair of ids
        self._ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, (x, y) in enumerate(merges):
            ix, iy = vocab.get(x), vocab.get(y)
            tb = y[len(continuing_subword_prefix):] if continuing_subword_prefix and y.startswith(continuing_subword_prefix) else y
            new = vocab.get(x + tb)
            if ix is None or iy is None or new is None:
                continue
            if (ix, iy) not in self._ranks:
                self._ranks[(ix, iy)] = (rank, new)
        self._cache: dict[str, list[int]] = {}
        self.cache_limit = 500_000 if byte_level else None
        self._native = None  # the compiled encoder once built; False when this model cannot have one

    # -- encoding ---------------------------------------------------------------------------
    def native(self, work_bytes: int = 0):
        """The compiled encoder (`bpe_native.NativeBPE`) of this model, or None (see `native.kernels`)."""
        if self._native is None:
            from llmkit.tokenize import native
            from llmkit.tokenize.bpe.bpe_native import NativeBPE

            kind = NativeBPE.kind_of(self)
            if kind is None:
                self._native = False
                return None
            k = native.kernels(work_bytes)
            if k is None:
                return None
            self._native = NativeBPE(self, kind, k)
        return self._native or None

    def encode(self, text: str) -> list[int]:
        # a short text is quicker in Python than through a call into the kernels
        nb = self.native(len(text)) if len(text) >= NATIVE_MIN_CHARS else None
        if nb is None:
            return super().encode(text)
        return nb.encode_parts([text.encode("utf-8", "surrogatepass")])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text; one call into the compiled kernels when they serve this model."""
        nb = self.native(sum(map(len, texts)))
        if nb is None:
            return [super(BPE, self).encode(t) for t in texts]
        return nb.encode_parts([t.encode("utf-8", "surrogatepass") for t in texts])

    def pre_tokenize(self, text: str) -> list[str]:
        if self.byte_level:
            return pretok.split_gpt2(text, self.pattern, self.add_prefix_space)
        if self.split == "none":
            return [text] if text else []
        if self.split == "whitespace_punct":
            return pretok.compile_pattern(r"\w+|[^\w\s]+").findall(text)
        return text.split()

    def _symbols(self, word: str) -> list[int]:
        vocab = self.vocab
        out = []
        prefix = self.continuing_subword_prefix
        for j, ch in enumerate(word):
            s = ch if (j == 0 or not prefix) else prefix + ch
            i = vocab.get(s)
            if i is not None:
                out.append(i)
            elif self.byte_fallback:
                out.extend(vocab[f"<0x{b:02X}>"] for b in ch.encode("utf-8"))
            elif self.unk_token is not None and self.unk_token in vocab:
                out.append(vocab[self.unk_token])
            else:
                raise BadInput(f"character {ch!r} is not in the vocabulary and the tokenizer has no unknown token.")
        return out

    def encode_word(self, word: str) -> list[int]:
        """Apply merges by rank to one pre-token (already byte-mapped when byte-level)."""
        if self.ignore_merges:  # HF option (Llama 3): a pre-token that is a token is kept whole
            whole = self.vocab.get(word)
            if whole is not None:
                return [whole]
        ids = self._symbols(word)
        ranks = self._ranks
        while len(ids) > 1:
            best = None
            for pair in zip(ids, ids[1:]):
                r = ranks.get(pair)
                if r is not None and (best is None or r[0] < best[0]):
                    best = (r[0], r[1], pair)
            if best is None:
                break
            _, new, (a, b) = best
            out = []
            i = 0
            n = len(ids)
            while i < n:
                if i < n - 1 and ids[i] == a and ids[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            ids = out
        return ids

    def word_symbols(self, piece: str) -> str:
        return pretok.to_byte_symbols(piece) if self.byte_level else piece

    def decode(self, ids: list[int]) -> str:
        toks = [self.id_to_token[i] for i in ids]
        if self.byte_level:
            raw = pretok.from_byte_symbols("".join(toks))
            try:
                return raw.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                return raw.decode("utf-8", "replace")
        if self.byte_fallback:
            buf = bytearray()
            for t in toks:
                if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                    buf.append(int(t[3:5], 16))
                else:
                    buf += t.encode("utf-8")
            return buf.decode("utf-8", "replace")
        return " ".join(toks)
