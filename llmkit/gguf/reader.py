"""Hardened GGUF reader: every count, length and offset is checked before anything is allocated.

Layout (little-endian): magic 'GGUF', u32 version (2 or 3), u64 tensor count, u64 metadata count,
then metadata (string key, u32 value type, value), tensor infos (name, u32 n_dims, u64 dims...,
u32 ggml type, u64 offset) and the tensor data, aligned to `general.alignment` (default 32).
Numeric arrays are read with one numpy call; nested arrays are refused (llama.cpp has none).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from llmkit.errors import BadFileFormat
from llmkit.gguf.types import ALIGNMENT, GGML_TYPES

MAX_KV = 1 << 20
MAX_TENSORS = 1 << 20
MAX_DIMS = 4
MAX_STRING = 1 << 26

# value type -> (struct code, size)
SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4),
           7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: ne[0] (row length) first
    type: int
    offset: int  # relative to the data section
    nbytes: int

    @property
    def n_rows(self) -> int:
        """Rows of ne[0] weights (all dimensions after the first)."""
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type, (f"type{self.type}",))[0]


@dataclass
class GGUFFile:
    path: str
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo] = field(default_factory=list)
    data_offset: int = 0
    file_size: int = 0
    kv_spans: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # key -> (start, end, value type)

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)


class _Cursor:
    def __init__(self, buf, size: int, path: str):
        self.buf, self.size, self.pos, self.path = buf, size, 0, path

    def fail(self, what: str):
        raise BadFileFormat(f"'{self.path}' is not a valid GGUF file: {what} (at byte {self.pos} of {self.size}).")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            self.fail(f"{what} needs {n} bytes but the file ends")

    def scalar(self, code: str, n: int, what: str):
        self.need(n, what)
        v = struct.unpack_from("<" + code, self.buf, self.pos)[0]
        self.pos += n
        return v

    def string(self, what: str) -> str:
        n = self.scalar("Q", 8, f"{what} length")
        if n > MAX_STRING:
            self.fail(f"{what} length {n} is absurd")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", "replace")

    def strings(self, count: int, key: str) -> list[str]:
        """A string array (a vocabulary: 10⁵ entries) read in one loop with the checks of `string`
        inlined, since a call and two formatted messages per element cost more than the reading."""
        buf, pos, size = self.buf, self.pos, self.size
        length = struct.Struct("<Q").unpack_from
        out = [""] * count
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"element {i} of '{key}' length")
            n = length(buf, pos)[0]
            pos += 8
            if n > MAX_STRING or pos + n > size:
                self.pos = pos
                self.fail(f"element {i} of '{key}' length {n} is absurd" if n > MAX_STRING else
                          f"element {i} of '{key}' needs {n} bytes but the file ends")
            raw = buf[pos:pos + n]
            pos += n
            try:
                out[i] = raw.decode("utf-8")
            except UnicodeDecodeError:
                out[i] = raw.decode("utf-8", "replace")
        self.pos = pos
        return out

    def value(self, vtype: int, key: str):
        if vtype in SCALARS:
            code, n = SCALARS[vtype]
            v = self.scalar(code, n, f"value of '{key}'")
            return bool(v) if vtype == 7 else v
        if vtype == STRING:
            return self.string(f"value of '{key}'")
        if vtype == ARRAY:
            etype = self.scalar("I", 4, f"array type of '{key}'")
            count = self.scalar("Q", 8, f"array length of '{key}'")
            if etype == ARRAY:
                self.fail(f"'{key}' is a nested array, which GGUF readers do not support")
            if etype in SCALARS:
                size = SCALARS[etype][1]
                if count > (self.size - self.pos) // size:
                    self.fail(f"array '{key}' declares {count} elements, more than the file holds")
                import numpy as np

                arr = np.frombuffer(self.buf, dtype=NUMPY[etype], count=count, offset=self.pos).copy()
                self.pos += count * size
                return arr.astype(bool) if etype == 7 else arr
            if etype == STRING:
                # each string takes at least its 8-byte length: a cheap bound before the loop
                if count > (self.size - self.pos) // 8:
                    self.fail(f"string array '{key}' declares {count} elements, more than the file holds")
                return self.strings(count, key)
            self.fail(f"array '{key}' has unknown element type {etype}")
        self.fail(f"metadata '{key}' has unknown value type {vtype}")


def read_gguf(path: str, tensors: bool = True) -> GGUFFile:
    """Parse a GGUF file's header, metadata and tensor table (no tensor data is read)."""
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")
    except OSError as e:
        raise BadFileFormat(f"cannot open '{path}': {e.strerror}. Check the path.") from None
    with f:
        if size < 24:
            raise BadFileFormat(f"'{path}' is not a GGUF file: only {size} bytes long.")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return _parse(buf, size, path, tensors)
        finally:
            buf.close()


def _parse(buf, size: int, path: str, want_tensors: bool) -> GGUFFile:
    c = _Cursor(buf, size, path)
    if bytes(buf[:4]) != b"GGUF":
        raise BadFileFormat(f"'{path}' is not a GGUF file (wrong magic {bytes(buf[:4])!r}). Pass a .gguf model.")
    c.pos = 4
    version = c.scalar("I", 4, "version")
    if version not in (2, 3):
        raise BadFileFormat(f"'{path}' has GGUF version {version}; llmkit reads versions 2 and 3.")
    n_tensors = c.scalar("Q", 8, "tensor count")
    n_kv = c.scalar("Q", 8, "metadata count")
    if n_tensors > MAX_TENSORS or n_tensors > size // 24:
        c.fail(f"tensor count {n_tensors} is absurd")
    if n_kv > MAX_KV or n_kv > size // 13:
        c.fail(f"metadata count {n_kv} is absurd")
    meta: dict[str, Any] = {}
    spans: dict[str, tuple[int, int, int]] = {}
    for _ in range(n_kv):
        start = c.pos
        key = c.string("metadata key")
        vtype = c.scalar("I", 4, f"type of '{key}'")
        if key in meta:
            c.fail(f"duplicate metadata key '{key}'")
        meta[key] = c.value(vtype, key)
        spans[key] = (start, c.pos, vtype)  # the raw bytes: writers copy entries verbatim
    g = GGUFFile(path=path, version=version, metadata=meta, file_size=size, kv_spans=spans)
    if not want_tensors:
        return g
    infos = [_tensor_info(c) for _ in range(n_tensors)]
    g.tensors, g.data_offset = infos, _check_layout(c, infos, meta.get("general.alignment", ALIGNMENT))
    return g


def _tensor_info(c: _Cursor) -> TensorInfo:
    """The next tensor's entry: name, dimensions (bounded, no overflow), known type, whole blocks."""
    name = c.string("tensor name")
    nd = c.scalar("I", 4, f"dimension count of '{name}'")
    if nd < 1 or nd > MAX_DIMS:
        c.fail(f"tensor '{name}' has {nd} dimensions (1..{MAX_DIMS} allowed)")
    c.need(8 * nd, f"dimensions of '{name}'")
    dims = struct.unpack_from(f"<{nd}Q", c.buf, c.pos)
    c.pos += 8 * nd
    n = 1
    for d in dims:
        if d == 0 or d > 1 << 40:
            c.fail(f"tensor '{name}' has dimension {d}")
        n *= d
        if n > 1 << 42:
            c.fail(f"tensor '{name}' has {n}+ elements, which overflows")
    ttype = c.scalar("I", 4, f"type of '{name}'")
    off = c.scalar("Q", 8, f"offset of '{name}'")
    if ttype not in GGML_TYPES:
        c.fail(f"tensor '{name}' has unknown type {ttype}")
    _, bs, ts = GGML_TYPES[ttype]
    if dims[0] % bs:
        c.fail(f"tensor '{name}' row length {dims[0]} is not a multiple of its block size {bs}")
    return TensorInfo(name, tuple(int(d) for d in dims), ttype, off, n // bs * ts)


def _check_layout(c: _Cursor, infos: list[TensorInfo], align) -> int:
    """The data section's offset, once the tensors are known to be aligned, inside the file, apart and
    uniquely named."""
    if not isinstance(align, int) or align < 1 or align > 1 << 16 or align & (align - 1):
        c.fail(f"general.alignment {align!r} is not a power of two")
    data = (c.pos + align - 1) // align * align
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in infos)
    for (a0, a1, an), nxt in zip(spans, spans[1:] + [None]):
        if a0 % align:
            c.fail(f"tensor '{an}' offset {a0} is not aligned to {align}")
        if data + a1 > c.size:
            c.fail(f"tensor '{an}' data ends at byte {data + a1}, past the end of the file")
        if nxt is not None and nxt[0] < a1:
            c.fail(f"tensors '{an}' and '{nxt[2]}' overlap")
    names = [t.name for t in infos]
    if len(set(names)) != len(names):
        c.fail("duplicate tensor names")
    return data
