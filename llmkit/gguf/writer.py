"""A small GGUF writer for llmkit's own artifacts (imatrix files): scalars, string arrays, F32 tensors."""

from __future__ import annotations

import struct

import numpy as np

from llmkit.io import atomic_write_bytes

_SCALAR = {"u32": (4, "I"), "i32": (5, "i"), "f32": (6, "f"), "u64": (10, "Q")}


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def write_gguf(path: str, kvs: list[tuple[str, str, object]], tensors: list[tuple[str, np.ndarray]], align: int = 32) -> None:
    """kvs: (key, 'u32'|'i32'|'f32'|'u64'|'str'|'str[]', value); tensors: (name, float32 array in GGUF dim order)."""
    out = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(kvs))]
    for key, kind, value in kvs:
        out.append(_str(key))
        if kind == "str":
            out.append(struct.pack("<I", 8) + _str(value))
        elif kind == "str[]":
            out.append(struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_str(v) for v in value))
        else:
            code, fmt = _SCALAR[kind]
            out.append(struct.pack("<I" + fmt, code, value))
    offset, blobs = 0, []
    for name, arr in tensors:
        a = np.ascontiguousarray(arr, dtype="<f4")
        dims = list(a.shape[::-1])  # GGUF lists ne[0] (the fastest dimension) first
        out.append(_str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
                   + struct.pack("<iQ", 0, offset))
        data = a.tobytes()
        blobs.append(data + b"\0" * (-len(data) % align))
        offset += len(blobs[-1])
    head = b"".join(out)
    atomic_write_bytes(path, head + b"\0" * (-len(head) % align) + b"".join(blobs))
