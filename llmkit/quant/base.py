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
    nan_reaches_scale = False  # True where a NaN/Inf weight always shows in an output scale (no search)
    jit_kernel = ""  # the compiled kernel (jit.py) of the path without an imatrix, when there is one
    jit_saves_ns = 0  # what the kernel saves per weight (decides whether a run loads numba: jit.decide_for_run)

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
        elif self.compiled():
            from llmkit.quant import jit

            out = jit.run(self.jit_kernel, x, self.type_size, self.block)
        else:
            out = self.quantize_blocks(x.reshape(-1, self.block))
        return out.reshape(n_rows, self.row_bytes(n))

    def compiled(self) -> bool:
        """Does a compiled kernel (numba, same bytes) run this format's path without an imatrix?"""
        if not self.jit_kernel:
            return False
        from llmkit.quant import jit

        return jit.run_allows() and jit.enabled()

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

    for m in ("floats", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4"):
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
    """In-order float32 sum over axis 0 of an (n, B) array: ((a0 + a1) + a2) + ...

    numpy reduces a non-innermost axis row by row into the output (pairwise summation is only used
    along the innermost axis), which is exactly this order; tests/test_quant.py checks it on data
    where the two orders give different sums, so a numpy that changes it fails loudly."""
    return np.add.reduce(a, axis=0)


def seq_sum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis in order, in float32, like a C `for` loop `s += a[i]` (numpy's
    sum is pairwise and rounds differently): n - 1 vector additions over the transposed array."""
    return colsum(np.ascontiguousarray(np.moveaxis(np.asarray(a, dtype=F32), -1, 0)))


def safe_inv(d: np.ndarray) -> np.ndarray:
    """1/d in float32, 0 where d == 0 (ggml: `d ? 1.0f/d : 0.0f`)."""
    out = np.zeros_like(d, dtype=F32)
    np.divide(F32(1), d, out=out, where=d != 0)
    return out


def blocks_t(x: np.ndarray) -> np.ndarray:
    """(n_blocks, block) -> its transposed float32 copy (block, n_blocks): "weight j of every block" is
    then one contiguous row, so per-block reductions and per-block scales become fast row operations."""
    x = np.asarray(x, dtype=F32)
    if len(x) <= 512:
        return np.ascontiguousarray(x.T)
    t = np.empty((x.shape[1], len(x)), F32)
    for i in range(0, len(x), 256):  # in 256-block slabs: ~30 % faster than one strided copy (measured)
        t[:, i:i + 256] = x[i:i + 256].T
    return t


def first_min_t(xt: np.ndarray) -> np.ndarray:
    """Per column of (n, B) the minimum as C's `if (v < min) min = v` finds it: the reduction gives the
    value; only where it is zero can the loop's answer differ (the sign of the first zero)."""
    return _first_extreme_t(xt, xt.min(axis=0), np.argmin)


def first_max_t(xt: np.ndarray) -> np.ndarray:
    """Per column the maximum as C's `if (v > max) max = v` finds it (see first_min_t)."""
    return _first_extreme_t(xt, xt.max(axis=0), np.argmax)


def _first_extreme_t(xt, v, arg):
    z = np.flatnonzero(v == 0)
    if len(z):
        sub = xt[:, z]
        v[z] = sub[arg(sub, axis=0), np.arange(len(z))]
    return v


def abs_max_signed_t(xt: np.ndarray) -> np.ndarray:
    """Per column of (n, B) ggml's `max`: the first value with the largest magnitude, or +0.0 when every
    value is zero (the C loop starts from max = 0 and only moves on a strictly larger |v|). From the
    column min and max; only columns where min == -max need the position of the first extreme."""
    mn, mx = xt.min(axis=0), xt.max(axis=0)
    out = np.where(mx >= -mn, mx, mn)
    tie = np.flatnonzero((mx == -mn) & (mx > 0))
    if len(tie):
        sub = xt[:, tie]
        out[tie] = sub[np.abs(sub).argmax(axis=0), np.arange(len(tie))]
    out[(mx == 0) & (mn == 0)] = F32(0.0)  # also turns -0.0 into +0.0
    return out


def abs_max_signed(x: np.ndarray) -> np.ndarray:
    """abs_max_signed_t per row of (n_rows, n)."""
    return abs_max_signed_t(blocks_t(x))


def abs_max_t(xt: np.ndarray) -> np.ndarray:
    """Per column the largest |v| (+0.0 for all-zero columns, as C's `amax = MAX(amax, fabsf(v))` from 0)."""
    out = np.maximum(xt.max(axis=0), -xt.min(axis=0))
    out[out == 0] = F32(0.0)
    return out


def put_rows(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src where src is a transposed (strided) view: copied 1024 rows at a time, which is
    ~45 % faster than one strided copy into the block layout (measured)."""
    for i in range(0, len(dst), 1024):
        dst[i:i + 1024] = src[i:i + 1024]


def nibbles_t(qt: np.ndarray) -> np.ndarray:
    """(32, B) uint8 levels -> (B, 16) bytes: the low 4 bits of weight j in the low nibble of byte j,
    those of weight j+16 in the high nibble."""
    return ((qt[:16] & 0x0F) | (qt[16:] << 4)).T


def high_bits_t(qt: np.ndarray) -> np.ndarray:
    """(32, B) 5-bit levels -> (B, 4) bytes: bit 4 of weight j at bit j of a little-endian uint32."""
    bits = (qt >> 4).reshape(4, 8, -1) << np.arange(8, dtype=np.uint8)[:, None]  # byte k gets weights 8k..8k+7
    return np.add.reduce(bits, axis=1, dtype=np.uint8).T  # distinct bits: the sum is an OR (packbits: 6x slower)
