"""BPE training through the compiled merge loop (`training._bpe_train_kernels.bpe_run`).

The same merges as `bpe.BPEMerges` (HF BpeTrainer's order), from flat arrays instead of dicts of
tuples and a set of words per heap entry: `train(...)` returns the tokens and the merges as ids, or
None when the kernels are not available (the caller then runs the Python loop). The words come
either as lists of symbol ids (`words_from_lists`) or straight from the compiled word counter's
table (`words_from_table`), so a large corpus never has a Python object per distinct word.
"""

from __future__ import annotations

import array
from dataclasses import dataclass

from llmkit.tokenize import native
from llmkit.tokenize.pieces import Progress, Vocab

I32, I64 = "i", "q"
(ST_VOCAB, ST_PAIRS, ST_WN, ST_ENTRIES, ST_HEAP, ST_MERGES, ST_TEXT, ST_STAMP, ST_NEED, ST_SEQ,
 ST_PHASE, ST_J, ST_NW, ST_NEW, ST_ASK) = range(15)
CAP_P, CAP_PH, CAP_WN, CAP_E, CAP_TEXT, CAP_TT, CAP_V, CAP_W, CAP_M, CAP_MINF, CAP_N = range(11)
MORE, DONE, FULL_POOLS, FULL_TEXT, FULL_MERGES = 0, 1, 2, 3, 4
STEPS = 256  # merges per call: progress and Ctrl-C between calls
EXTRA = 1024  # room beyond the first estimate before a pool grows
TEXT_PER_TOKEN = 16  # room for the new tokens' text (code points per token) before it grows
FIRST_PAIRS = 1 << 16  # the pair arrays start with room for this many pairs plus one per FIRST_PAIR_SHARE symbols
FIRST_PAIR_SHARE = 64


@dataclass
class Words:
    """Distinct words as symbol ids: word i is sym[woff[i]:woff[i + 1]], seen cnt[i] times."""

    sym: array.array  # int32
    woff: array.array  # int64, W + 1
    cnt: array.array  # int64, W

    @property
    def n_symbols(self) -> int:
        return len(self.sym)


def words_from_lists(words: list[list[int]], counts: list[int]) -> Words:
    woff = array.array(I64, [0]) * (len(words) + 1)
    total = 0
    for i, w in enumerate(words):
        total += len(w)
        woff[i + 1] = total
    return Words(array.array(I32, [t for w in words for t in w]), woff, array.array(I64, counts))


def words_from_table(table, symbol_of_byte: list[int]) -> Words:
    """The compiled counter's words (`counting.WordTable`, byte-level BPE: one symbol per byte),
    mapped through `symbol_of_byte`; the table's arena is released on the way."""
    import numpy as np

    n = table.st[0]
    woff = np.frombuffer(table.woff, dtype=np.int64)[:n + 1]
    arena = np.frombuffer(table.arena, dtype=np.uint8)[:int(woff[-1]) if n else 0]
    out = Words(zeros(I32, len(arena)), array.array(I64), array.array(I64))
    np.take(np.asarray(symbol_of_byte, dtype=np.int32), arena, out=np.frombuffer(out.sym, dtype=np.int32))
    del arena
    table.release_arena()
    out.woff.frombytes(woff.tobytes())
    out.cnt.frombytes(np.frombuffer(table.wcount, dtype=np.int64)[:n].tobytes())
    return out


def pow2(n: int) -> int:
    """The smallest power of two >= n, at least 16 (hash table sizes).

    >>> pow2(5), pow2(100)
    (16, 128)
    """
    p = 16
    while p < n:
        p <<= 1
    return p


def zeros(code: str, n: int) -> array.array:
    """An array of n zeros of the typecode, made without a Python list."""
    return array.array(code, bytes(array.array(code).itemsize * n))


def minus_ones(code: str, n: int) -> array.array:
    """An array of n -1s of the typecode (empty slots of the kernels' tables)."""
    return array.array(code, [-1]) * n


def words_and_texts(buf, words: Words, vocab: Vocab, n_tokens: int, text_per_token: int) -> int:
    """Set the arrays both compiled trainers start from: the words' symbols, offsets, counts and lengths,
    the tokens' text as code points with room for n_tokens of text_per_token, an empty token hash table;
    the text's length."""
    import numpy as np

    buf.sym, buf.woff, buf.wcnt = words.sym, words.woff, words.cnt
    buf.wlen = array.array(I32)
    buf.wlen.frombytes(np.diff(np.frombuffer(buf.woff, dtype=np.int64)).astype(np.int32).tobytes())
    texts = [[ord(c) for c in t] for t in vocab.tokens]
    buf.tcp = array.array(I32, [c for t in texts for c in t])
    buf.tcp.extend(zeros(I32, text_per_token * n_tokens + 16))
    buf.toff = zeros(I64, n_tokens + 1)
    total = 0
    for i, t in enumerate(texts):
        total += len(t)
        buf.toff[i + 1] = total
    buf.ttab = minus_ones(I32, pow2(2 * n_tokens + 2))
    return total


class _Buffers:
    """Every array of the loop, in the kernel's argument order."""

    PAIR = (("pa", I32, 0), ("pb", I32, 0), ("pc", I64, 0), ("nwhead", I32, -1), ("tlist", I32, 0))
    ENTRY = (("ecount", I64, 0), ("epair", I32, 0), ("eseq", I64, 0), ("ehead", I32, -1), ("heap", I32, 0))

    def __init__(self, vocab: Vocab, words: Words, vocab_size: int, min_frequency: int, pair_room: int):
        W, V = len(words.cnt), max(vocab_size, len(vocab))
        total = words_and_texts(self, words, vocab, V, TEXT_PER_TOKEN)
        self._init_tokens(len(vocab))
        cap_p, cap_wn = pair_room + EXTRA, words.n_symbols + EXTRA
        for name, code, fill in self.PAIR + self.ENTRY:
            setattr(self, name, minus_ones(code, cap_p) if fill == -1 else zeros(code, cap_p))
        self.pkey = minus_ones(I64, pow2(2 * cap_p))
        self.pidx = zeros(I32, len(self.pkey))
        self.wn_word, self.wn_next = zeros(I32, cap_wn), zeros(I32, cap_wn)
        self.wlist, self.wstamp = zeros(I32, W), zeros(I32, W)
        self.merges = zeros(I32, 3 * V)
        self.st = zeros(I64, 15)
        self.st[ST_VOCAB] = len(vocab)
        self.st[ST_TEXT] = total
        self.caps = c = zeros(I64, 11)
        c[CAP_P], c[CAP_PH], c[CAP_WN], c[CAP_E] = cap_p, len(self.pkey), cap_wn, cap_p
        c[CAP_TEXT], c[CAP_TT], c[CAP_V], c[CAP_W] = len(self.tcp), len(self.ttab), V, W
        c[CAP_M], c[CAP_MINF], c[CAP_N] = V, min_frequency, len(self.sym)

    def _init_tokens(self, n: int) -> None:
        """The initial tokens in the text table (the kernel finds a merge's token there by its text)."""
        texts = {}
        for t in range(n):
            texts[tuple(self.tcp[self.toff[t]:self.toff[t + 1]])] = t
        mask = len(self.ttab) - 1
        for key, t in texts.items():
            h = -3750763034362895579
            for c in key:
                h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
            h = h - (1 << 64) if h >= 1 << 63 else h
            s = h & mask
            while self.ttab[s] != -1:
                s = (s + 1) & mask
            self.ttab[s] = t

    def args(self) -> list[int]:
        names = ["sym", "woff", "wlen", "wcnt", "tcp", "toff", "ttab", "pa", "pb", "pc", "nwhead", "pkey", "pidx",
                 "ecount", "epair", "eseq", "ehead", "heap", "wn_word", "wn_next", "wlist", "wstamp", "tlist",
                 "merges", "st", "caps"]
        return [getattr(self, n).buffer_info()[0] for n in names]

    def grow_pools(self, k) -> None:
        """Double each pool whose free room is less than the kernel asked for (st[ST_ASK]) until it is not."""
        c, st = self.caps, self.st
        ask = st[ST_ASK] + 1
        while c[CAP_P] - st[ST_PAIRS] <= ask:
            self._grow_pairs(k)
        while c[CAP_WN] - st[ST_WN] <= ask:
            for name in ("wn_word", "wn_next"):
                getattr(self, name).extend(zeros(I32, c[CAP_WN]))
            c[CAP_WN] = 2 * c[CAP_WN]
        while c[CAP_E] - st[ST_ENTRIES] <= ask:
            old = c[CAP_E]
            for name, code, fill_value in self.ENTRY:
                getattr(self, name).extend(minus_ones(code, old) if fill_value == -1 else zeros(code, old))
            c[CAP_E] = 2 * old

    def _grow_pairs(self, k) -> None:
        """Twice the pairs, their table rebuilt by the kernel."""
        c, st = self.caps, self.st
        old = c[CAP_P]
        for name, code, fill_value in self.PAIR:
            getattr(self, name).extend(minus_ones(code, old) if fill_value == -1 else zeros(code, old))
        c[CAP_P] = 2 * old
        self.pkey = minus_ones(I64, pow2(4 * old))
        self.pidx = zeros(I32, len(self.pkey))
        c[CAP_PH] = len(self.pkey)
        k.rehash_pairs(self.pa.buffer_info()[0], self.pb.buffer_info()[0], st[ST_PAIRS],
                       self.pkey.buffer_info()[0], self.pidx.buffer_info()[0], c[CAP_PH])

    def grow(self, name: str, cap: int) -> None:
        a = getattr(self, name)
        a.extend(zeros(a.typecode, len(a)))
        self.caps[cap] = len(a) if name == "tcp" else len(a) // 3

    def tokens(self) -> list[str]:
        text = self.tcp.tobytes().decode("utf-32-le", "surrogatepass")
        off = self.toff
        return [text[off[i]:off[i + 1]] for i in range(self.st[ST_VOCAB])]


def train(vocab: Vocab, words: Words, vocab_size: int, min_frequency: int, progress: Progress | None,
          work_bytes: int) -> tuple[list[str], list[tuple[int, int]]] | None:
    """(tokens in id order, merges as pairs of ids), or None without the kernels."""
    k = native.kernels(work_bytes)
    if k is None:
        return None
    n_sym = max(1, words.n_symbols)
    room = min(n_sym, FIRST_PAIRS + n_sym // FIRST_PAIR_SHARE)
    while True:  # distinct pairs are usually far fewer than symbols; start again larger when they do not fit
        b = _Buffers(vocab, words, vocab_size, min_frequency, room)
        r = k.bpe_run(*b.args(), -1)
        if r == MORE:
            break
        if r != FULL_POOLS or room >= n_sym:
            return None  # cannot happen: with one pair per symbol the initial pairs always fit
        room = min(n_sym, 2 * room)
    total = max(1, vocab_size - len(vocab))
    start = len(vocab)
    while True:
        r = k.bpe_run(*b.args(), STEPS)
        if r == FULL_POOLS:
            b.grow_pools(k)
        elif r == FULL_TEXT:
            b.grow("tcp", CAP_TEXT)
        elif r == FULL_MERGES:
            b.grow("merges", CAP_M)
        if progress is not None:
            progress(min(total, b.st[ST_VOCAB] - start), total, "merges")
        if r == DONE:
            m = b.merges
            return b.tokens(), [(m[3 * i], m[3 * i + 1]) for i in range(b.st[ST_MERGES])]
