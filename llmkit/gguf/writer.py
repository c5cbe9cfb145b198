"""Writing GGUF: llmkit's own small artifacts (imatrix and Hessian files: scalars, string arrays, F32
tensors), and the header of a file derived from another (a quantized model: the input's metadata
entries copied verbatim, new entries appended, the tensor table laid out again)."""

from __future__ import annotations

import struct

import numpy as np

from llmkit.gguf.reader import GGUFFile
from llmkit.gguf.types import TYPE_ID, n_dims, tensor_bytes
from llmkit.io import atomic_write_bytes

_SCALAR = {"u32": (4, "I"), "i32": (5, "i"), "f32": (6, "f"), "u64": (10, "Q")}


def _str(s: str | bytes) -> bytes:
    b = s if isinstance(s, bytes) else s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv_entry(key: str, kind: str, value) -> bytes:
    """One metadata entry; kind: 'u32' | 'i32' | 'f32' | 'u64' | 'str' (str or raw bytes) | 'str[]'."""
    if kind == "str":
        return _str(key) + struct.pack("<I", 8) + _str(value)
    if kind == "str[]":
        return _str(key) + struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_str(v) for v in value)
    code, fmt = _SCALAR[kind]
    return _str(key) + struct.pack("<I" + fmt, code, value)


def tensor_entry(name: str, dims, type_id: int, offset: int) -> bytes:
    """One tensor-table entry: name, dimension count, dims (ne[0] first), ggml type, data offset."""
    return _str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<iQ", type_id, offset)


def write_gguf(path: str, kvs: list[tuple[str, str, object]], tensors: list[tuple[str, np.ndarray]], align: int = 32) -> None:
    """kvs: (key, 'u32'|'i32'|'f32'|'u64'|'str'|'str[]', value); tensors: (name, float32 array in GGUF dim order)."""
    arrays = [(name, np.ascontiguousarray(arr, dtype="<f4")) for name, arr in tensors]
    head, _ = f32_layout(kvs, [(name, a.shape) for name, a in arrays], align)
    blobs = [a.tobytes() + b"\0" * (-a.nbytes % align) for _, a in arrays]
    atomic_write_bytes(path, head + b"".join(blobs))


def f32_layout(kvs: list[tuple[str, str, object]], tensors: list[tuple[str, tuple]], align: int = 32) -> tuple[bytes, list[int]]:
    """The header (padded to `align`) of a GGUF file of F32 tensors [(name, shape in numpy order)], and
    each tensor's byte offset in the file: a writer can then fill the data in any order."""
    out = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(kvs))]
    out += [kv_entry(key, kind, value) for key, kind, value in kvs]
    offset, offsets = 0, []
    for name, shape in tensors:
        out.append(tensor_entry(name, tuple(shape)[::-1], 0, offset))  # GGUF lists ne[0] (the fastest dimension) first
        offsets.append(offset)
        size = 4 * int(np.prod(shape, dtype=np.int64))
        offset += size + (-size % align)
    head = b"".join(out)
    head += b"\0" * (-len(head) % align)
    return head, [len(head) + o for o in offsets]


def derived_header(g: GGUFFile, tensors: list[tuple[str, tuple, str]], align: int, drop: tuple[str, ...] = (),
                   put: list[tuple[str, str, object]] = (), strings: dict[str, str] | None = None) -> bytes:
    """The header of a file made from `g` (GGUF v3): g's metadata entries verbatim and in order, minus
    the keys in `drop` and in `put`, then the `put` entries [(key, kind, value)] in order (gguf_set_val:
    a key set again moves to the end), then the `strings` entries whose key g lacks; the tensor table
    of `tensors` [(name, shape, type name)] with each tensor's data padded to `align`; padding to `align`."""
    with open(g.path, "rb") as f:
        raw = f.read(max(e for _, e, _ in g.kv_spans.values()) if g.kv_spans else 0)
    replaced = set(drop) | {k for k, _, _ in put}
    kvs = [raw[s:e] for key, (s, e, _) in g.kv_spans.items() if key not in replaced]
    kvs += [kv_entry(k, kind, v) for k, kind, v in put]
    kvs += [kv_entry(k, "str", v) for k, v in (strings or {}).items() if k not in g.kv_spans and k not in replaced]
    infos, offset = [], 0
    for name, shape, type_name in tensors:
        infos.append(tensor_entry(name, shape[:n_dims(shape)], TYPE_ID[type_name], offset))
        size = tensor_bytes(type_name, shape)
        offset += size + (-size % align)
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
    return out + b"\0" * (-len(out) % align)
