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


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv_entry(key: str, kind: str, value) -> bytes:
    """One metadata entry; kind: 'u32' | 'i32' | 'f32' | 'u64' | 'str' | 'str[]'."""
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
    out = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(kvs))]
    out += [kv_entry(key, kind, value) for key, kind, value in kvs]
    offset, blobs = 0, []
    for name, arr in tensors:
        a = np.ascontiguousarray(arr, dtype="<f4")
        out.append(tensor_entry(name, a.shape[::-1], 0, offset))  # GGUF lists ne[0] (the fastest dimension) first
        data = a.tobytes()
        blobs.append(data + b"\0" * (-len(data) % align))
        offset += len(blobs[-1])
    head = b"".join(out)
    atomic_write_bytes(path, head + b"\0" * (-len(head) % align) + b"".join(blobs))


def derived_header(g: GGUFFile, tensors: list[tuple[str, tuple, str]], align: int, drop: tuple[str, ...] = (),
                   u32: dict[str, int] | None = None, strings: dict[str, str] | None = None) -> bytes:
    """The header of a file made from `g` (GGUF v3): g's metadata entries verbatim and in order, minus
    the keys in `drop`, then the `u32` entries, then the `strings` entries whose key g lacks; the
    tensor table of `tensors` [(name, shape, type name)] with each tensor's data padded to `align`;
    padding to `align`."""
    with open(g.path, "rb") as f:
        raw = f.read(max(e for _, e, _ in g.kv_spans.values()) if g.kv_spans else 0)
    kvs = [raw[s:e] for key, (s, e, _) in g.kv_spans.items() if key not in drop]
    kvs += [kv_entry(k, "u32", v) for k, v in (u32 or {}).items()]
    kvs += [kv_entry(k, "str", v) for k, v in (strings or {}).items() if k not in g.kv_spans]
    infos, offset = [], 0
    for name, shape, type_name in tensors:
        infos.append(tensor_entry(name, shape[:n_dims(shape)], TYPE_ID[type_name], offset))
        size = tensor_bytes(type_name, shape)
        offset += size + (-size % align)
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
    return out + b"\0" * (-len(out) % align)
