"""Reading tensor data out of a GGUF file: a tensor's raw bytes, a range of its rows, or chosen rows.

Decoding the bytes into numbers is `llmkit.gguf.dequant.to_f32` (with the quantization formats'
dequantizers); here only the file layout is read: offsets relative to the data section, `nbytes` per tensor.
"""

from __future__ import annotations

import numpy as np

from llmkit.errors import BadFileFormat
from llmkit.gguf.reader import TensorInfo


def read_tensor(f, info: TensorInfo, data_offset: int, into: np.ndarray | None = None) -> np.ndarray:
    """A tensor's raw bytes, read with one readinto (a plain read from the page cache beats faulting
    in an mmap page by page), into `into` (uint8, nbytes long) when given."""
    raw = np.empty(info.nbytes, np.uint8) if into is None else into
    f.seek(data_offset + info.offset)
    if f.readinto(memoryview(raw)) != info.nbytes:
        raise BadFileFormat(f"tensor '{info.name}' is cut short: the file ends inside its data.")
    return raw


def row_slab(info: TensorInfo, r0: int, n_rows: int) -> TensorInfo:
    """Rows [r0, r0 + n_rows) of a tensor described as a 2-D tensor of their own (same data section)."""
    row = info.nbytes // info.n_rows
    return TensorInfo(info.name, (info.shape[0], n_rows), info.type, info.offset + r0 * row, n_rows * row)


def read_rows(f, info: TensorInfo, data_offset: int, rows: np.ndarray) -> tuple[np.ndarray, TensorInfo]:
    """The raw bytes of the given rows of a tensor, and a TensorInfo describing them as a 2-D tensor."""
    row = info.nbytes // info.n_rows
    buf = np.empty(len(rows) * row, np.uint8)
    for k, r in enumerate(rows.tolist()):
        f.seek(data_offset + info.offset + r * row)
        f.readinto(memoryview(buf)[k * row:(k + 1) * row])
    return buf, TensorInfo(info.name, (info.shape[0], len(rows)), info.type, 0, len(buf))
