"""WordPiece training through the compiled merge loop (`training._train_kernels.wp_run`).

The same vocabulary as `wordpiece.WordPieceMerges`, from flat arrays instead of dicts of tuples:
`train(...)` returns the token list, or None when the kernels are not available (the caller then
runs the Python loop). A pool that fills up is grown between merges and the loop goes on.
"""

from __future__ import annotations

import array

from llmkit.tokenize import native
from llmkit.tokenize.bpe.bpe_train_native import Words, minus_ones, pow2, words_and_texts, words_from_lists, zeros
from llmkit.tokenize.pieces import Progress, Vocab, kept_alphabet

I32, I64, F64 = "i", "q", "d"
ST_VOCAB, ST_PAIRS, ST_WN, ST_ON, ST_HEAP, ST_MERGES, ST_TEXT = range(7)
CAP_P, CAP_PH, CAP_WN, CAP_ON, CAP_TEXT, CAP_TT, CAP_V, CAP_W, CAP_PREFIX, CAP_MINF, CAP_N = range(11)
MORE, DONE, FULL_PAIRS, FULL_TEXT = 0, 1, 2, 3
STEPS = 256  # merges per call: progress and Ctrl-C between calls
EXTRA_PAIRS = 1024  # room for pairs beyond one per symbol before the pools grow
TEXT_PER_TOKEN = 16  # room for the new tokens' text (code points per token) before it grows
FIRST_PAIR_SHARE = 4  # the pair arrays start with room for one pair per this many symbols


class _Buffers:
    """Every array of the loop, in the kernels' argument order."""

    PAIR = (("pa", I32, 0), ("pb", I32, 0), ("pc", I64, 0), ("fsw", I32, 0), ("fsi", I32, 0), ("psc", F64, 0),
            ("hpos", I32, -1), ("pflag", I32, 0), ("whead", I32, -1), ("heap", I32, 0), ("tlist", I32, 0),
            ("tstamp", I32, 0))

    def __init__(self, vocab: Vocab, words: Words, vocab_size: int, prefix: str, min_frequency: int, pair_room: int):
        n_sym = words.n_symbols
        W, V = len(words.cnt), max(vocab_size, len(vocab))
        total = words_and_texts(self, words, vocab, V, TEXT_PER_TOKEN)
        self.freq = zeros(I64, V)
        cap_p, cap_wn = pair_room + EXTRA_PAIRS, n_sym + EXTRA_PAIRS
        for name, code, fill in self.PAIR:
            setattr(self, name, minus_ones(code, cap_p) if fill == -1 else zeros(code, cap_p))
        self.pkey = minus_ones(I64, pow2(2 * cap_p))
        self.pidx = zeros(I32, len(self.pkey))
        self.wn_word, self.wn_next = zeros(I32, cap_wn), zeros(I32, cap_wn)
        self.ohead = minus_ones(I32, V)
        self.on_pair, self.on_next = zeros(I32, 2 * cap_p), zeros(I32, 2 * cap_p)
        self.wlist, self.wstamp = zeros(I32, W), zeros(I32, W)
        self.merges = zeros(I32, 3 * V)
        self.st = zeros(I64, 9)
        self.st[ST_VOCAB] = len(vocab)
        self.st[ST_TEXT] = total
        self.caps = zeros(I64, 11)
        c = self.caps
        c[CAP_P], c[CAP_PH], c[CAP_WN], c[CAP_ON] = cap_p, len(self.pkey), cap_wn, 2 * cap_p
        c[CAP_TEXT], c[CAP_TT], c[CAP_V], c[CAP_W] = len(self.tcp), len(self.ttab), V, W
        c[CAP_PREFIX], c[CAP_MINF], c[CAP_N] = len(prefix), min_frequency, len(self.sym)
        self.prefix = array.array(I32, [ord(ch) for ch in prefix] or [0])

    def args(self) -> list[int]:
        names = ["sym", "woff", "wlen", "wcnt", "tcp", "toff", "ttab", "freq", "pa", "pb", "pc", "fsw", "fsi", "psc",
                 "hpos", "pflag", "pkey", "pidx", "whead", "wn_word", "wn_next", "ohead", "on_pair", "on_next", "heap",
                 "wlist", "wstamp", "tlist", "tstamp", "merges", "st", "caps", "prefix"]
        return [getattr(self, n).buffer_info()[0] for n in names]

    def grow_pairs(self) -> None:
        """Twice the room in the pools that are at least half full (the fullest one at least): the
        pairs with their table (rebuilt by the kernel), the pair-to-words list, the token-to-pairs list."""
        c, st = self.caps, self.st
        fill = {"pairs": st[ST_PAIRS] / c[CAP_P], "wn": st[ST_WN] / c[CAP_WN], "on": st[ST_ON] / c[CAP_ON]}
        grow = {k for k, f in fill.items() if f >= 0.5} | {max(fill, key=fill.get)}
        if "pairs" in grow:
            old = c[CAP_P]
            for name, code, fill_value in self.PAIR:
                getattr(self, name).extend(minus_ones(code, old) if fill_value == -1 else zeros(code, old))
            c[CAP_P] = 2 * old
            self.pkey = minus_ones(I64, pow2(4 * old))
            self.pidx = zeros(I32, len(self.pkey))
            c[CAP_PH] = len(self.pkey)
        if "wn" in grow:
            for name in ("wn_word", "wn_next"):
                getattr(self, name).extend(zeros(I32, c[CAP_WN]))
            c[CAP_WN] = 2 * c[CAP_WN]
        if "on" in grow:
            for name in ("on_pair", "on_next"):
                getattr(self, name).extend(zeros(I32, c[CAP_ON]))
            c[CAP_ON] = 2 * c[CAP_ON]

    def grow_text(self) -> None:
        self.tcp.extend(zeros(I32, len(self.tcp)))
        self.caps[CAP_TEXT] = len(self.tcp)

    def tokens(self) -> list[str]:
        text = self.tcp.tobytes().decode("utf-32-le", "surrogatepass")
        off = self.toff
        return [text[off[i]:off[i + 1]] for i in range(self.st[ST_VOCAB])]


def train(vocab: Vocab, words: list[list[int]], counts: list[int], vocab_size: int, prefix: str, min_frequency: int,
          progress: Progress | None, work_bytes: int) -> list[str] | None:
    """The trained vocabulary (tokens in id order), or None without the kernels."""
    if not words or native.kernels(work_bytes) is None:
        return None
    return train_words(vocab, words_from_lists(words, counts), vocab_size, prefix, min_frequency, progress, work_bytes)


def words_from_table(table, specials: list[str], prefix: str, limit_alphabet: int | None = None) -> tuple[Vocab, Words]:
    """The initial vocabulary (specials, first characters, prefixed other characters, each sorted by
    code point) and the words as its ids, straight from the compiled counter's table (UTF-8 words);
    with `limit_alphabet`, only the characters `pieces.kept_alphabet` keeps (see `_drop_rare_chars`)."""
    import numpy as np

    n = table.st[0]
    woff = np.frombuffer(table.woff, dtype=np.int64)[:n + 1]
    raw = bytes(memoryview(table.arena)[:int(woff[-1])])
    table.release_arena()
    lead = (np.frombuffer(raw, dtype=np.uint8) & 0xC0) != 0x80
    cp_before = np.concatenate([[0], np.cumsum(lead)])  # characters before each byte offset
    coff = cp_before[woff]
    del lead, cp_before
    cps = np.frombuffer(raw.decode("utf-8", "surrogatepass").encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    del raw
    first = np.zeros(len(cps), dtype=bool)
    first[coff[:-1]] = True
    cnt = np.frombuffer(table.wcount, dtype=np.int64)[:n]
    if limit_alphabet is not None:
        cps, first, coff, cnt = _drop_rare_chars(cps, first, coff, cnt, limit_alphabet)
    firsts, rests = np.unique(cps[first]), np.unique(cps[~first])
    vocab = Vocab(specials + [chr(c) for c in firsts.tolist()] + [prefix + chr(c) for c in rests.tolist()])
    lut_first = np.array([vocab.ids[chr(c)] for c in firsts.tolist()], dtype=np.int32)
    lut_rest = np.array([vocab.ids[prefix + chr(c)] for c in rests.tolist()], dtype=np.int32)
    out = Words(zeros(I32, len(cps)), array.array(I64), array.array(I64))
    sym = np.frombuffer(out.sym, dtype=np.int32)
    sym[first] = lut_first[np.searchsorted(firsts, cps[first])]
    sym[~first] = lut_rest[np.searchsorted(rests, cps[~first])]
    out.woff.frombytes(coff.astype(np.int64).tobytes())
    out.cnt.frombytes(cnt.tobytes())
    return vocab, out


CHARS_PER_CHUNK = 1 << 22  # characters weighted at a time when counting the alphabet


def _drop_rare_chars(cps, first, coff, cnt, limit: int):
    """The words (code points `cps`, `first`-character flags, offsets `coff`, counts `cnt`) without
    the characters `kept_alphabet` leaves out, and without the words left empty: a first flag stays
    with its character, so a word whose first character went keeps only prefixed pieces (as HF).

    >>> import numpy as np
    >>> cps = np.array([ord(c) for c in "abéb"], dtype=np.uint32)
    >>> r = _drop_rare_chars(cps, np.array([1, 0, 1, 0], bool), np.array([0, 2, 4]), np.array([3, 1]), 2)
    >>> "".join(map(chr, r[0])), r[1].tolist(), r[2].tolist(), r[3].tolist()
    ('abb', [True, False, False], [0, 2, 3], [3, 1])
    """
    import numpy as np


    lens = np.diff(coff)
    total = np.zeros(0x110000, dtype=np.int64)
    a = 0
    while a < len(cnt):  # in chunks of words, so the per-character weights stay small
        b = min(len(cnt), int(np.searchsorted(coff, coff[a] + CHARS_PER_CHUNK, side="right")))
        b = max(b, a + 1)
        weights = np.repeat(cnt[a:b], lens[a:b]).astype(np.float64)
        total += np.bincount(cps[coff[a]:coff[b]], weights=weights, minlength=0x110000).astype(np.int64)
        a = b
    seen = np.flatnonzero(total)
    kept = kept_alphabet({chr(c): int(total[c]) for c in seen.tolist()}, limit)
    keep_cp = np.zeros(0x110000, dtype=bool)
    keep_cp[[ord(ch) for ch in kept]] = True
    keep = keep_cp[cps]
    kept_before = np.concatenate([[0], np.cumsum(keep)])
    new_lens = np.diff(kept_before[coff])
    full = new_lens > 0
    new_coff = np.concatenate([[0], np.cumsum(new_lens[full])])
    return cps[keep], first[keep], new_coff, cnt[full]


def train_words(vocab: Vocab, words: Words, vocab_size: int, prefix: str, min_frequency: int,
                progress: Progress | None, work_bytes: int) -> list[str] | None:
    """`train` on words as flat arrays (`words_from_table`)."""
    k = native.kernels(work_bytes)
    if k is None or not len(words.cnt):
        return None
    n_sym = words.n_symbols
    # distinct pairs are usually far fewer than symbols: start with a quarter, and start again with
    # twice the room when the corpus's pairs do not fit (counting them is the cheap part)
    room = max(1, n_sym // FIRST_PAIR_SHARE)
    while True:
        b = _Buffers(vocab, words, vocab_size, prefix, min_frequency, room)
        r = k.wp_run(*b.args(), -1)
        if r == MORE:
            break
        if r != FULL_PAIRS or room >= n_sym:
            return None  # cannot happen: with one pair per symbol the initial pairs always fit
        room = min(n_sym, 2 * room)
    total = max(1, vocab_size - len(vocab))
    while True:
        r = k.wp_run(*b.args(), STEPS)
        if r == FULL_PAIRS:
            b.grow_pairs()
            k.rehash_pairs(b.pa.buffer_info()[0], b.pb.buffer_info()[0], b.st[ST_PAIRS], b.pkey.buffer_info()[0],
                           b.pidx.buffer_info()[0], b.caps[CAP_PH])
        elif r == FULL_TEXT:
            b.grow_text()
        if progress is not None:
            progress(min(total, b.st[ST_VOCAB] - len(vocab)), total, "merges")
        if r == DONE:
            return b.tokens()
