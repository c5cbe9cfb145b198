"""ggml's type table, the one place block sizes live (ggml_type_traits): the GGUF reader, the
quantization formats and the type rules all read it.

    >>> block_size("Q4_K"), type_size("Q4_K"), tensor_bytes("Q4_K", (512, 3))
    (256, 144, 864)
"""

from __future__ import annotations

import math

ALIGNMENT = 32  # GGUF's default general.alignment

# ggml type -> (name, block size, bytes per block)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}
TYPE_ID = {v[0]: k for k, v in GGML_TYPES.items()}  # name -> ggml type


def block_size(name: str) -> int:
    """Weights per block of the named type (1 for plain number types)."""
    return GGML_TYPES[TYPE_ID[name]][1]


def type_size(name: str) -> int:
    """Bytes per block of the named type."""
    return GGML_TYPES[TYPE_ID[name]][2]


def tensor_bytes(name: str, shape) -> int:
    """Bytes of a tensor of this type and shape (unpadded)."""
    _, bs, ts = GGML_TYPES[TYPE_ID[name]]
    return math.prod(int(d) for d in shape) // bs * ts


def n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: trailing dimensions of 1 do not count (at least 1)."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n
