"""Hand-packed GGUF bytes: a valid one-tensor file and a corpus of malformed ones, which the GGUF reader
(tests/test_gguf_reader.py) and `quant` (tests/test_quant.py) must each refuse in one sentence."""

import struct


def s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return s(key) + struct.pack("<II", 4, v)


def kv_str(key, v):
    return s(key) + struct.pack("<I", 8) + s(v)


def header(n_tensors, n_kv, version=3, magic=b"GGUF"):
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def tensor(name, dims, ttype=0, offset=0):
    return s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ttype, offset)


def good_file(n_floats=8, extra_kv=b"", n_extra=0):
    meta = kv_str("general.architecture", "llama") + extra_kv
    body = header(1, 1 + n_extra) + meta + tensor("w", [n_floats])
    pad = (-len(body)) % 32
    return body + b"\0" * pad + b"\0" * (4 * n_floats)


def arr(key, etype, count, payload=b""):
    return s(key) + struct.pack("<IIQ", 9, etype, count) + payload


MALFORMED = {
    "empty": b"",
    "short": b"GGUF\x03\x00",
    "wrong magic": header(0, 0, magic=b"GGML") + b"\0" * 16,
    "version 1": header(0, 0, version=1) + b"\0" * 8,
    "version 99": header(0, 0, version=99) + b"\0" * 8,
    "absurd tensor count": header(1 << 60, 0),
    "absurd kv count": header(0, 1 << 60),
    "kv count past end": header(0, 5) + kv_u32("a", 1),
    "key length huge": header(0, 1) + struct.pack("<Q", 1 << 62) + b"x",
    "key truncated": header(0, 1) + struct.pack("<Q", 100) + b"abc",
    "unknown value type": header(0, 1) + s("k") + struct.pack("<I", 77) + b"\0" * 8,
    "string value huge": header(0, 1) + s("k") + struct.pack("<IQ", 8, 1 << 63),
    "array 2^63 (the 49-byte file)": header(0, 1) + arr("k", 8, 1 << 63),
    "numeric array past end": header(0, 1) + arr("k", 4, 1000, b"\0" * 16),
    "nested array": header(0, 1) + arr("k", 9, 2, struct.pack("<IQ", 4, 1)),
    "unknown array element type": header(0, 1) + arr("k", 55, 2),
    "string array element truncated": header(0, 1) + arr("k", 8, 2, s("ok") + struct.pack("<Q", 50) + b"ab"),
    "duplicate key": header(0, 2) + kv_u32("a", 1) + kv_u32("a", 2),
    "scalar truncated": header(0, 1) + s("k") + struct.pack("<I", 10) + b"\0\0",
    "tensor with 0 dims": header(1, 0) + tensor("w", []),
    "tensor with 5 dims": header(1, 0) + tensor("w", [1, 1, 1, 1, 1]),
    "zero dimension": header(1, 0) + tensor("w", [0, 4]),
    "dimension product overflows": header(1, 0) + tensor("w", [1 << 40, 1 << 40, 1 << 40]),
    "unknown tensor type": header(1, 0) + tensor("w", [32], ttype=99),
    "row not a multiple of the block": header(1, 0) + tensor("w", [33], ttype=2),
    "offset past end": header(1, 0) + tensor("w", [8], offset=1 << 40),
    "unaligned offset": header(2, 0) + tensor("a", [8]) + tensor("b", [8], offset=33) + b"\0" * 200,
    "overlapping tensors": header(2, 0) + tensor("a", [16]) + tensor("b", [16], offset=32) + b"\0" * 400,
    "duplicate tensor names": header(2, 0) + tensor("a", [8]) + tensor("a", [8], offset=32) + b"\0" * 400,
    "alignment not a power of two": header(0, 1) + kv_u32("general.alignment", 24),
    "alignment zero": header(0, 1) + kv_u32("general.alignment", 0),
    "tensor data truncated": good_file()[:-8],
    "tensor table truncated": header(1, 0) + tensor("w", [8])[:-5],
}
