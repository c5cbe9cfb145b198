"""The format registry and float32 helpers shared by the quantizers."""

from __future__ import annotations

import numpy as np

from llmkit.errors import BadInput

F32 = np.float32
FORMATS: dict[str, "Format"] = {}


class Format:
    """A ggml tensor type: `quantize` rows of float32 into blocks, `dequantize` them back."""

    name = ""
    type_id = -1
    block = 1  # weights per block
    type_size = 4  # bytes per block
    uses_imatrix = False
    half_fields: tuple[tuple[int, int], ...] = ()  # byte ranges of each block holding fp16 values

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            FORMATS[cls.name] = cls()

    def row_bytes(self, n_per_row: int) -> int:
        return n_per_row // self.block * self.type_size

    def quantize(self, rows: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
        """rows: (n_rows, n_per_row) float32 -> (n_rows, row_bytes) uint8."""
        n_rows, n = rows.shape
        if n % self.block:
            raise BadInput(f"{self.name} needs rows of a multiple of {self.block} weights, got {n}.")
        x = np.ascontiguousarray(rows, dtype=F32)
        if imatrix is not None and self.uses_imatrix:
            out = self.quantize_weighted(x, np.ascontiguousarray(imatrix, dtype=F32))
        else:
            out = self.quantize_blocks(x.reshape(-1, self.block))
        return out.reshape(n_rows, self.row_bytes(n))

    def check(self, out: np.ndarray, name: str) -> None:
        """ggml_validate_row_data: every fp16 field (block scales, F16 values) must be finite.
        A scale beyond fp16's range (65504) becomes infinite; llama.cpp refuses such data too."""
        b = out.reshape(-1, self.type_size)
        for lo, hi in self.half_fields:
            h = np.ascontiguousarray(b[:, lo:hi]).view("<u2")
            if ((h & 0x7C00) == 0x7C00).any():
                what = "a value" if self.block == 1 else "a block scale"
                raise BadInput(f"tensor '{name}': quantizing to {self.name} gives {what} beyond fp16's range "
                               f"(|x| > 65504); llama.cpp refuses this too. Use F32/BF16 for this model or rescale it.")

    def quantize_blocks(self, x: np.ndarray) -> np.ndarray:  # (n_blocks, block) -> (n_blocks, type_size)
        raise NotImplementedError

    def quantize_weighted(self, rows: np.ndarray, imatrix: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def dequantize(self, data: np.ndarray, n: int) -> np.ndarray:
        """uint8 bytes of n weights -> float32 (n,)."""
        blocks = np.frombuffer(memoryview(data), dtype=np.uint8).reshape(-1, self.type_size)
        return self.dequantize_blocks(blocks).reshape(-1)[:n]

    def dequantize_blocks(self, b: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class SuperBlockFormat(Format):
    """K-quants: 256-weight super-blocks; with an imatrix, every row uses the same column weights."""

    block = 256
    uses_imatrix = True

    def quantize_weighted(self, rows, imatrix):
        n_rows, n = rows.shape
        qw = np.broadcast_to(imatrix.reshape(1, n), (n_rows, n)).reshape(-1, 256)
        return self.quantize_blocks(rows.reshape(-1, 256), np.ascontiguousarray(qw))


def get_format(name: str) -> Format:
    _load_all()
    try:
        return FORMATS[name.upper()]
    except KeyError:
        raise BadInput(f"unknown tensor type {name!r}; llmkit quantizes to {', '.join(sorted(FORMATS))}.") from None


def by_id(type_id: int) -> Format | None:
    _load_all()
    return next((f for f in FORMATS.values() if f.type_id == type_id), None)


def _load_all() -> None:
    """Import every format module once (each registers its class in FORMATS)."""
    import importlib

    for m in ("floats", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"):
        importlib.import_module(f"llmkit.quant.{m}")


# -- float32 helpers with ggml's exact semantics ---------------------------------------------------

def fp16(x) -> np.ndarray:
    """float32 -> IEEE half (round to nearest even, like GGML_FP32_TO_FP16)."""
    return np.asarray(x, dtype=F32).astype(np.float16)


def fp16_bytes(x) -> np.ndarray:
    """(n,) float32 -> (n, 2) uint8, little-endian half floats."""
    return fp16(x).reshape(-1).view(np.uint8).reshape(-1, 2)


def half_to_f32(b: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 -> (n,) float32."""
    return np.ascontiguousarray(b).view(np.float16).reshape(-1).astype(F32)


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: float32 + 1.5*2^23 trick = round half to even."""
    return np.rint(v).astype(np.int32)


def colsum(a: np.ndarray) -> np.ndarray:
    """In-order float32 sum over axis 0 of an (n, B) array: ((a0 + a1) + a2) + ..."""
    s = a[0].copy()
    for i in range(1, a.shape[0]):
        s += a[i]
    return s


def seq_sum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis in order, in float32, like a C `for` loop `s += a[i]` (numpy's
    sum is pairwise and rounds differently): n - 1 vector additions over the transposed array."""
    return colsum(np.ascontiguousarray(np.moveaxis(np.asarray(a, dtype=F32), -1, 0)))


def safe_inv(d: np.ndarray) -> np.ndarray:
    """1/d in float32, 0 where d == 0 (ggml: `d ? 1.0f/d : 0.0f`)."""
    out = np.zeros_like(d, dtype=F32)
    np.divide(F32(1), d, out=out, where=d != 0)
    return out


def abs_max_signed(x: np.ndarray) -> np.ndarray:
    """Per row, ggml's `max`: the first value with the largest magnitude, or +0.0 when every value
    is zero (the C loop starts from max = 0 and only moves on a strictly larger |v|).

    From the row min and max (fast on the transposed copy); only rows where min == -max need
    the position of the first extreme."""
    mn, mx = row_min_max(x)
    out = np.where(mx >= -mn, mx, mn).astype(F32)
    tie = (mx == -mn) & (mx > 0)
    if tie.any():
        rows = np.flatnonzero(tie)
        sub = x[rows]
        out[rows] = sub[np.arange(len(rows)), np.abs(sub).argmax(axis=1)]
    out[(mx == 0) & (mn == 0)] = F32(0.0)  # also turns -0.0 into +0.0
    return out


def row_min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row minimum and maximum (through the transposed copy, see abs_max_signed)."""
    t = np.ascontiguousarray(x.T)
    return t.min(axis=0), t.max(axis=0)


def row_abs_max(x: np.ndarray) -> np.ndarray:
    return np.abs(np.ascontiguousarray(x.T)).max(axis=0)


def pack_nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (lo.astype(np.uint8) & 0x0F) | ((hi.astype(np.uint8) & 0x0F) << 4)


def high_bits_u32(q: np.ndarray) -> np.ndarray:
    """(n, 32) 5-bit values -> (n, 4) uint8: bit 4 of value j stored at bit j of a uint32."""
    return np.packbits((q >= 16) & (q < 32), axis=1, bitorder="little")
