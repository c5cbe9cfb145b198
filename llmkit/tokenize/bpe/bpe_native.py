"""Byte-level BPE encoding through the compiled kernels: the model's tables as flat arrays, a word
cache and scratch per thread, whole batches of lines per call.

`NativeBPE.for_model(bpe)` returns None when the model is not one the kernels reproduce exactly
(not byte-level, a pre-tokenizer pattern they do not know, a continuing-subword prefix, byte
fallback) or the kernels are unavailable; callers then keep the Python encoder. Same ids either way
(the tests compare both with HF tokenizers).
"""

from __future__ import annotations

import array
import ctypes
import gc
import threading
from contextlib import contextmanager
from itertools import accumulate

from llmkit.errors import BadInput
from llmkit.tokenize import native, pretok

# the pre-tokenizer regexes the kernels implement, by kernel number (see _bpe_kernels)
_CONTRACTIONS_HF = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_CONTRACTIONS_ASCII = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3_TAIL = r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_TAIL = r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
KINDS = {
    pretok.GPT2_PATTERN: 0,
    _CONTRACTIONS_ASCII + _LLAMA3_TAIL: 1,
    _CONTRACTIONS_ASCII + _QWEN2_TAIL: 2,
    _CONTRACTIONS_HF + _LLAMA3_TAIL: 3,
    _CONTRACTIONS_HF + _QWEN2_TAIL: 4,
}
CACHE_SLOTS = 1 << 20
CACHE_KEY_BYTES = 1 << 24  # the kernel keeps key offsets in 24 bits
CACHE_IDS = 1 << 22
MIN_SCRATCH = 1 << 12


def _pow2(n: int) -> int:
    p = 16
    while p < n:
        p <<= 1
    return p


def _addr(buf) -> int:
    """Address of a writable buffer (array.array, bytearray or ctypes array)."""
    if isinstance(buf, array.array):
        return buf.buffer_info()[0]
    if isinstance(buf, ctypes.Array):
        return ctypes.addressof(buf)
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)) if len(buf) else 0


_GC_LOCK = threading.Lock()
_GC_HOLDS = [0, True]  # threads inside _no_gc, and whether the collector was on before the first


@contextmanager
def _no_gc():
    """The cyclic collector off while a batch's lists are made: they hold only ints, so no cycle can
    form, and the collections that half a million new lists set off cost several times their making."""
    with _GC_LOCK:
        if _GC_HOLDS[0] == 0:
            _GC_HOLDS[1] = gc.isenabled()
            gc.disable()
        _GC_HOLDS[0] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_HOLDS[0] -= 1
            if _GC_HOLDS[0] == 0 and _GC_HOLDS[1]:
                gc.enable()


def _zeros(code: str, n: int) -> array.array:
    return array.array(code, bytes(array.array(code).itemsize * n))


class _State:
    """One thread's word cache and scratch (the kernels write into them)."""

    def __init__(self):
        # calloc'd: a short input touches only the pages of the words it caches
        self.chash = (ctypes.c_int64 * CACHE_SLOTS)()
        self.cmeta = (ctypes.c_int64 * CACHE_SLOTS)()
        self.karena = (ctypes.c_uint8 * CACHE_KEY_BYTES)()
        self.varena = (ctypes.c_int32 * CACHE_IDS)()
        self.st = _zeros("q", 4)
        self.grow(MIN_SCRATCH)
        self.cache_args = (_addr(self.chash), _addr(self.cmeta), CACHE_SLOTS, _addr(self.karena), CACHE_KEY_BYTES,
                           _addr(self.varena), CACHE_IDS, _addr(self.st))

    def grow(self, n: int) -> None:
        self.scap = _pow2(max(n, MIN_SCRATCH))
        # ctypes arrays come from calloc: a long word's tens of MB are mapped, not zeroed and copied
        # up front, and the kernel touches only what it uses
        self.scratch = (ctypes.c_int32 * (4 * self.scap))()
        self.heap = (ctypes.c_int64 * (6 * self.scap))()  # the merge queue's heap and FIFO


class NativeBPE:
    """The compiled encoder of one byte-level BPE model."""

    def __init__(self, model, kind: int, k: native.Kernels):
        self.k = k
        self.kind = kind
        self.ignore_merges = bool(model.ignore_merges)
        table = pretok.bytes_to_unicode()
        self.byte_id = array.array("i", [model.vocab.get(table[b], -1) for b in range(256)])
        ranked = sorted((r, a, b, new) for (a, b), (r, new) in model._ranks.items())
        n_merges = len(model.merges)
        self.new_of = array.array("i", [-1]) * max(1, n_merges)
        for r, _, _, new in ranked:
            self.new_of[r] = new
        pa = array.array("i", [x[1] for x in ranked])
        pb = array.array("i", [x[2] for x in ranked])
        pr = array.array("i", [x[0] for x in ranked])
        self.pcap = _pow2(2 * len(ranked) + 2)
        self.pkey = _zeros("q", self.pcap)
        self.prank = _zeros("i", self.pcap)
        k.build_pairs(_addr(pa), _addr(pb), _addr(pr), len(ranked), _addr(self.pkey), _addr(self.prank), self.pcap)
        self._vocab_table(model)
        self.classes = native.class_table()
        self.classes_addr = ctypes.cast(ctypes.c_char_p(self.classes), ctypes.c_void_p).value
        self._local = threading.local()

    @staticmethod
    def kind_of(model) -> int | None:
        """The kernels' number for this model's pre-tokenizer, or None when they cannot reproduce it."""
        if not model.byte_level or model.add_prefix_space or model.continuing_subword_prefix or model.byte_fallback:
            return None
        patterns = getattr(model, "patterns", [model.pattern])
        return KINDS.get(patterns[0]) if len(patterns) == 1 else None

    def _vocab_table(self, model) -> None:
        """Each token's raw bytes in id order, hashed, for ignore_merges (a pre-token that is a token)."""
        n = (max(model.id_to_token) + 1) if (self.ignore_merges and model.id_to_token) else 0
        inverse = {ord(c): chr(b) for b, c in pretok.bytes_to_unicode().items()}
        parts = []
        for i in range(n):
            t = model.id_to_token.get(i, "")
            try:
                parts.append(t.translate(inverse).encode("latin-1"))
            except UnicodeEncodeError:
                parts.append(pretok.from_byte_symbols(t))
        self.tok_bytes = bytearray(b"".join(parts)) or bytearray(1)
        self.tok_off = array.array("q", [0]) + array.array("q", accumulate(map(len, parts)))
        self.n_tok = n
        self.vcap = _pow2(2 * n + 2)
        self.vslot = _zeros("i", self.vcap)
        if n:
            self.k.build_vocab(_addr(self.tok_bytes), _addr(self.tok_off), n, _addr(self.vslot), self.vcap)

    def _state(self) -> _State:
        s = getattr(self._local, "state", None)
        if s is None:
            s = self._local.state = _State()
        return s

    def encode_joined(self, data: bytes, offsets: array.array) -> tuple[array.array, array.array]:
        """Ids of the lines data[offsets[i]:offsets[i+1]]: (all ids, each line's end in them)."""
        n_lines = len(offsets) - 1
        out = _zeros("i", max(1, len(data)))
        lend = _zeros("q", max(1, n_lines))
        if n_lines <= 0:
            return out[:0], lend[:0]
        st = self._state()
        text = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value if data else _addr(bytearray(1))
        flags = self.kind | (self.ignore_merges << 8)
        first = 0
        while True:
            r = self.k.encode_lines(
                text, _addr(offsets), n_lines, first,
                self.classes_addr, _addr(self.byte_id), _addr(self.pkey), _addr(self.prank), self.pcap,
                _addr(self.new_of), len(self.new_of),
                _addr(self.tok_bytes), _addr(self.tok_off), self.n_tok, _addr(self.vslot), self.vcap, flags,
                *st.cache_args, _addr(st.scratch), _addr(st.heap), _addr(out), _addr(lend), st.scap)
            if r == n_lines:
                return out[:lend[n_lines - 1]], lend
            if r < 0:
                raise BadInput(f"line {-r} has a byte whose token is not in the vocabulary; this byte-level "
                               "tokenizer lacks part of the 256-byte alphabet.")
            st.grow(st.st[3])
            first = r

    def encode_parts(self, parts: list[bytes]) -> list[list[int]]:
        """Ids of each byte string (UTF-8 text)."""
        offsets = array.array("q", [0])
        offsets.extend(accumulate(map(len, parts)))
        ids, lend = self.encode_joined(b"".join(parts), offsets)
        view = memoryview(ids)  # each line's list straight from the array, no list of all the ids between
        out = []
        start = 0
        with _no_gc():
            for end in lend.tolist():
                out.append(view[start:end].tolist())
                start = end
        return out

    def format(self, ids: array.array, lend: array.array) -> bytes:
        """Each line's ids as text, space-separated, one line each (what `tokenize encode` prints)."""
        n_lines = len(lend)
        if n_lines == 0:
            return b""
        buf = bytearray(11 * len(ids) + n_lines)
        n = self.k.format_ids(_addr(ids), _addr(lend), n_lines, _addr(buf), len(buf))
        return bytes(memoryview(buf)[:n])

