"""The plain formats' compiled kernels as one linked library (`llmkit.native`): loaded with ctypes in
milliseconds, so a small file pays no numba start-up for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or for reading
F16. The library is built from `_cfuncs.py` (the loops of `_kernels.py`) by `build()`: by the
install script, or by the first run that starts numba anyway. Without it the formats take their
numba or numpy paths (same bytes)."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
_LOCK = threading.Lock()
_LOADED: object = None  # None: not looked for yet; False: not there
NAME = "quant-kernels"
C = ctypes
ARGTYPES = {**{k: [C.c_void_p, C.c_int64, C.c_void_p] for k in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")},
            "f16_to_f32": [C.c_void_p, C.c_void_p, C.c_int64, C.c_void_p]}


def _key() -> str:
    from llmkit import native as shared

    return shared.source_key([_HERE / "_cfuncs.py", _HERE / "_kernels.py"])


def library() -> dict | None:
    """{kernel: ctypes function} of the built library, or None (not built, or LLMKIT_NO_JIT=1)."""
    global _LOADED
    from llmkit import config

    if config.flag("LLMKIT_NO_JIT"):
        return None
    if _LOADED is None:
        with _LOCK:
            if _LOADED is None:
                from llmkit import native as shared

                loaded = shared.load(NAME, _key(), ARGTYPES)
                _LOADED = (loaded[1], loaded[0]) if loaded else False
    return _LOADED[0] if _LOADED else None


def has(kernel: str) -> bool:
    lib = library()
    return lib is not None and kernel in lib


def build() -> bool:
    """Compile the kernels with numba and link the library (seconds); False without numba or a linker."""
    global _LOADED
    from llmkit import native as shared

    try:
        from llmkit.quant.formats import _cfuncs
    except ImportError:
        return False
    ok = shared.link(NAME, _key(), _cfuncs.KERNELS)
    with _LOCK:
        _LOADED = None
    return ok


def run(kernel: str, x: np.ndarray, type_size: int) -> np.ndarray:
    """(n_blocks, 32) float32 -> (n_blocks, type_size) uint8 through the library's `kernel`."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 32)
    out = np.empty((len(x), type_size), np.uint8)
    library()[kernel](x.ctypes.data, len(x), out.ctypes.data)
    return out


_F16_TABLE = None


def f16_table() -> np.ndarray:
    """The float32 bits of every half (numpy's exact conversion, NaN payloads kept), as _kernels.F16_BITS."""
    global _F16_TABLE
    if _F16_TABLE is None:
        _F16_TABLE = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    return _F16_TABLE


def f16_rows(raw: np.ndarray, ne0: int, table: np.ndarray) -> tuple[np.ndarray, int]:
    """F16 tensor bytes as float32 rows (n_rows, ne0) through `table` (the float32 bits of every half),
    with the count of Inf/NaN values among them."""
    h = np.ascontiguousarray(raw).view("<u2").reshape(-1)
    out = np.empty(len(h), np.uint32)
    bad = library()["f16_to_f32"](h.ctypes.data, table.ctypes.data, len(h), out.ctypes.data)
    return out.view(np.float32).reshape(-1, ne0), int(bad)
