"""A tensor's raw bytes as float32 rows (`to_f32`, `load_f32`): reading a GGUF's numbers.

F32 is viewed as it is; every other type is decoded by the decoder its ggml type id finds in a
registry that the packages knowing the types fill (`register`): `llmkit.quant.formats` registers its
formats (F16, BF16 and every quantized type it implements). This module imports none of them at
import time, so gguf stays below quant: `PROVIDERS` names them, and they are imported on the first
lookup, before which nothing has registered.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from llmkit.errors import BadInput
from llmkit.gguf.tensors import read_tensor

Decoder = Callable[[np.ndarray, int], np.ndarray]  # (raw bytes, number of values) -> float32 values
PROVIDERS = ("llmkit.quant.formats",)  # packages that register decoders when imported
_FINDERS: list[Callable[[int], Decoder | None]] = []


def register(find: Callable[[int], Decoder | None]) -> None:
    """Add a lookup ggml type id -> its decoder (or None when the provider does not know the type)."""
    _FINDERS.append(find)


def decoder(type_id: int) -> Decoder | None:
    """The decoder of ggml type `type_id`, or None when no provider reads it."""
    if not _FINDERS:
        import importlib

        for name in PROVIDERS:
            importlib.import_module(name)
    for find in _FINDERS:
        decode = find(type_id)
        if decode is not None:
            return decode
    return None


def to_f32(raw: np.ndarray, info) -> np.ndarray:
    """Raw tensor bytes (of a gguf TensorInfo) as float32 rows (n_rows, ne0), dequantizing when needed."""
    ne0 = info.shape[0]
    n = int(np.prod(info.shape, dtype=np.int64))
    if info.type == 0:
        x = raw.view("<f4")
    else:
        decode = decoder(info.type)
        if decode is None:
            raise BadInput(f"tensor '{info.name}' has type {info.type_name}, which llmkit cannot read.")
        x = decode(raw, n)
    return x.reshape(-1, ne0)


def load_f32(f, info, data_offset: int) -> np.ndarray:
    """A tensor of an open GGUF file as float32 rows."""
    return to_f32(read_tensor(f, info, data_offset), info)
