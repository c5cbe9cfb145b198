"""ggml's own C library (libggml-base, shipped inside llama-cpp-python) through ctypes, for the two
things llmkit takes from it rather than re-typing: the constant lattice grids of the i-quants (read
back by decoding crafted blocks with ggml's dequantizer, so no table is copied into llmkit's source)
and, for tests, ggml's quantizer itself (`ggml_quantize_chunk`) as the reference.

The library is found next to the installed `llama_cpp` package without importing it (importing
llama_cpp loads the model runtime and takes a second).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os

import numpy as np

from llmkit.errors import BadInput, MissingDependency

_LIB = None


class _TypeTraits(ctypes.Structure):
    """ggml.h's struct ggml_type_traits."""

    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def library() -> ctypes.CDLL:
    """libggml-base from llama-cpp-python's install (loaded once)."""
    global _LIB
    if _LIB is None:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.submodule_search_locations:
            raise MissingDependency("llama-cpp-python", "llama")
        libdir = os.path.join(list(spec.submodule_search_locations)[0], "lib")
        for cand in sorted(glob.glob(os.path.join(libdir, "libggml-base*"))):
            try:
                lib = ctypes.CDLL(cand)
                lib.ggml_get_type_traits  # noqa: B018 - the symbol must be there
            except (OSError, AttributeError):
                continue
            lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
            lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
            lib.ggml_quantize_chunk.restype = ctypes.c_size_t
            lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
            _LIB = lib
            break
        else:
            raise BadInput(f"no usable libggml-base in {libdir}. Reinstall llama-cpp-python "
                           "(pip install --force-reinstall llama-cpp-python).")
    return _LIB


def dequantize(type_id: int, blocks: np.ndarray, n: int) -> np.ndarray:
    """ggml's to_float for `n` weights of type `type_id` stored in the uint8 array `blocks`."""
    lib = library()
    traits = lib.ggml_get_type_traits(type_id).contents
    if not traits.to_float:
        raise BadInput(f"this ggml library cannot decode type {type_id}. Update llama-cpp-python.")
    src = np.ascontiguousarray(blocks, dtype=np.uint8)
    out = np.empty(n, np.float32)
    _TO_FLOAT(traits.to_float)(src.ctypes.data, out.ctypes.data, n)
    return out


def quantize(type_id: int, rows: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """ggml_quantize_chunk: (n_rows, n_per_row) float32 -> (n_rows, row_bytes) uint8, llama.cpp's bytes."""
    lib = library()
    x = np.ascontiguousarray(rows, dtype=np.float32)
    n_rows, n = x.shape
    traits = lib.ggml_get_type_traits(type_id).contents
    out = np.zeros((n_rows, n // traits.blck_size * traits.type_size), np.uint8)
    qw = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    lib.ggml_quantize_chunk(type_id, x.ctypes.data, out.ctypes.data, 0, n_rows, n,
                            None if qw is None else qw.ctypes.data)
    return out
