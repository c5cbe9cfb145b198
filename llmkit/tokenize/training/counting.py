"""Counting pre-tokenized words with the compiled kernels (`_train_kernels.count_words`): byte-level
BPE's and BERT's pre-tokenizers over whole blocks of lines, distinct words in first-seen order.

`count_compiled` returns None when the kernels cannot count for these settings; `train.count_words`
then keeps its Python loop, which gives the same counts in the same order. Under a memory bound
(`wordbound.Bound`) the table drops its rare words when it outgrows the bound, keeping the others
in first-seen order.
"""

from __future__ import annotations

import array
import ctypes
from collections import Counter
from typing import Iterable, Iterator

from llmkit.tokenize import native, pretok

BLOCK_CHARS = 1 << 20
MODES = {"bpe": 0, "wordpiece": 1}


def _addr(buf) -> int:
    if isinstance(buf, array.array):
        return buf.buffer_info()[0]
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


class WordTable:
    """Distinct words (UTF-8 bytes) and their counts, grown as the kernel asks."""

    def __init__(self, k: native.Kernels, mode: int, bound=None):
        self.k = k
        self.bound = bound
        self.mode = mode
        self.cls = native.class_table()
        self.bcls = native.bert_class_table() if mode == 1 else self.cls
        self.scap = 1 << 16
        self.slots = array.array("i", [-1]) * self.scap
        self.arena = bytearray(1 << 20)
        self.wcap = 1 << 14
        self.woff = array.array("q", bytes(8 * (self.wcap + 1)))
        self.wcount = array.array("q", bytes(8 * self.wcap))
        self.whash = array.array("q", bytes(8 * self.wcap))
        self.st = array.array("q", [0, len(self.arena), self.wcap])

    def add(self, data: bytes) -> None:
        """Count the words of one block of whole lines."""
        n = len(data)
        if not n:
            return
        buf = bytearray(n + 4)
        text = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
        addr = (ctypes.cast(ctypes.c_char_p(self.cls), ctypes.c_void_p).value,
                ctypes.cast(ctypes.c_char_p(self.bcls), ctypes.c_void_p).value)
        pos = 0
        while True:
            pos = self.k.count_words(text, n, pos, self.mode, 0, *addr, _addr(self.slots), self.scap, _addr(self.arena),
                                     _addr(self.woff), _addr(self.wcount), _addr(self.whash), _addr(self.st), _addr(buf))
            if pos == n:
                break
            self._grow(n - pos)
        nw = self.st[0]
        if self.bound is not None and self.bound.over(nw, self.woff[nw]):
            self.prune()

    def prune(self) -> None:
        """Drop the words seen at most t times (t from the bound), keeping the rest in order."""
        import numpy as np

        nw = self.st[0]
        woff = np.frombuffer(self.woff, dtype=np.int64)[:nw + 1]
        lens = np.diff(woff)
        cnt = np.frombuffer(self.wcount, dtype=np.int64)[:nw]
        t = self.bound.threshold(cnt, self.bound.word_costs(lens.astype(np.float64)))
        keep = cnt > t
        self.bound.note(t, int(nw - keep.sum()), int(cnt[~keep].sum()))
        arena = np.frombuffer(self.arena, dtype=np.uint8)[:int(woff[-1])][np.repeat(keep, lens)].tobytes()
        kept_off = np.concatenate([[0], np.cumsum(lens[keep])]).astype(np.int64).tobytes()
        kept_cnt, kept_hash = cnt[keep].tobytes(), np.frombuffer(self.whash, dtype=np.int64)[:nw][keep].tobytes()
        del woff, cnt, lens, keep
        m = len(kept_cnt) // 8
        self.arena[:len(arena)] = arena
        for a, data in ((self.woff, kept_off), (self.wcount, kept_cnt), (self.whash, kept_hash)):
            memoryview(a).cast("B")[:len(data)] = data
        self.st[0] = m
        self.slots = array.array("i", [-1]) * self.scap
        self.k.rehash_words(_addr(self.slots), self.scap, _addr(self.whash), m)

    def release_arena(self) -> None:
        """Free the words' bytes and the hash table (the counts stay)."""
        self.arena = bytearray(1)
        self.slots = array.array("i")
        self.whash = array.array("q")

    def _grow(self, rest: int) -> None:
        nw = self.st[0]
        if 2 * (nw + 1) > self.scap:
            self.scap *= 2
            self.slots = array.array("i", [-1]) * self.scap
            self.k.rehash_words(_addr(self.slots), self.scap, _addr(self.whash), nw)
        elif nw + 1 >= self.wcap:
            grow = self.wcap
            self.wcap *= 2
            for a in (self.woff, self.wcount, self.whash):
                a.extend(array.array("q", bytes(8 * grow)))
            self.st[2] = self.wcap
        else:
            self.arena.extend(bytes(max(len(self.arena), rest + 16)))
            self.st[1] = len(self.arena)

    def words(self) -> Iterator[tuple[bytes, int]]:
        """(word bytes, count) in first-seen order."""
        arena, woff, wcount = bytes(self.arena), self.woff, self.wcount
        for i in range(self.st[0]):
            yield arena[woff[i]:woff[i + 1]], wcount[i]


def blocks(lines: Iterable[str]) -> Iterator[str]:
    """Lines joined into blocks of about BLOCK_CHARS; a line without its newline ends a block, so
    every block is whole lines and a file's last line never runs into the next file's first."""
    batch: list[str] = []
    size = 0
    for line in lines:
        batch.append(line)
        size += len(line)
        if size >= BLOCK_CHARS or not line.endswith("\n"):
            yield "".join(batch)
            batch, size = [], 0
    if batch:
        yield "".join(batch)


def count_table(lines: Iterable[str], algorithm: str, splitter, work_bytes: int, bound=None) -> WordTable | None:
    """The words of the lines in the kernels' table, or None when the kernels do not serve this
    algorithm (Unigram) or are not available. Special tokens are cut out of a block before it is
    counted: BPE counts each piece on its own (as its Python loop does), WordPiece joins them with
    newlines."""
    mode = MODES.get(algorithm)
    if mode is None:
        return None
    k = native.kernels(work_bytes)
    if k is None:
        return None
    table = WordTable(k, mode, bound)
    for block in blocks(lines):
        if splitter is None or not splitter.search(block):
            table.add(block.encode("utf-8", "surrogatepass"))
        elif mode == 1:
            table.add("\n".join(splitter.split(block)).encode("utf-8", "surrogatepass"))
        else:
            for line in block.splitlines(keepends=True):
                for part in splitter.split(line):
                    table.add(part.encode("utf-8", "surrogatepass"))
    if bound is not None:
        bound.finish(table.st[0], sum(table.wcount[:table.st[0]]))
    return table


def count_compiled(lines: Iterable[str], algorithm: str, splitter, lowercase: bool, work_bytes: int,
                   bound=None) -> Counter | None:
    """The trainers' word counts through the kernels as a Counter in first-seen order, or None
    (see `count_table`)."""
    table = count_table(lines, algorithm, splitter, work_bytes, bound)
    if table is None:
        return None
    mode = table.mode
    out: Counter = Counter()
    if mode == 0:
        inverse = pretok._byte_translation()
        for w, c in table.words():
            out[w.decode("latin-1").translate(inverse)] += c
    else:
        for w, c in table.words():
            text = w.decode("utf-8", "surrogatepass")
            out[text.lower() if lowercase else text] += c
    return out
