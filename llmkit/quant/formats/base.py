"""The format registry: a `Format` subclass per ggml type registers itself by name; its block size and
bytes per block come from ggml's type table (`llmkit.gguf.types`). Each format's dequantizer is
registered with the GGUF reader (`llmkit.gguf.dequant`), whose `to_f32` reads any stored type."""

from __future__ import annotations

import numpy as np

from llmkit.errors import BadInput
from llmkit.gguf.dequant import register
from llmkit.gguf.types import GGML_TYPES, TYPE_ID, block_size, type_size
from llmkit.quant.formats import jit, native
from llmkit.quant.formats.jit import DEFAULT, Kernels
from llmkit.quant.formats.numerics import F32

FORMATS: dict[str, "Format"] = {}
# the type modules by family package (a module is its type's name lower-cased; the plain floats share one)
FAMILIES = {"legacy": ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"),
            "kquants": ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k"),
            "iquants": ("iq4_nl", "iq4_xs", "iq3_xxs", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m"),
            "lowbit": ("tq1_0", "tq2_0", "mxfp4", "q1_0", "q2_0")}
MODULES = ("floats", *(f"{family}.{m}" for family, ms in FAMILIES.items() for m in ms))  # under llmkit.quant.formats
_PATHS = {m.rpartition(".")[2]: m for m in MODULES}


class Format:
    """A ggml tensor type: `quantize` rows of float32 into blocks, `dequantize` them back. A subclass
    names its type (`name`); type_id, block and type_size are read from ggml's table."""

    name = ""
    type_id = -1
    block = 1  # weights per block
    type_size = 4  # bytes per block
    uses_imatrix = False
    half_fields: tuple[tuple[int, int], ...] = ()  # byte ranges of each block holding fp16 values
    nan_reaches_scale = False  # True where a NaN/Inf weight always shows in an output scale (no search)
    jit_saves_ns = 0  # what the compiled kernel saves per weight (jit.SAVES_NS; 0: no kernel)
    jit_kernel = ""  # the compiled kernel (jit.py) of the path without an imatrix: the name, lower-cased
    weighted_compiled = False  # the imatrix path runs a compiled kernel too (GIL released: threads scale)
    weighted_kernel = ""  # that kernel where it sits beside jit_kernel's (K-quants; sets weighted_compiled)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            cls.type_id, cls.block, cls.type_size = TYPE_ID[cls.name], block_size(cls.name), type_size(cls.name)
            cls.jit_saves_ns = jit.SAVES_NS.get(cls.name, 0)
            cls.jit_kernel = cls.name.lower() if cls.jit_saves_ns else ""
            cls.weighted_compiled = cls.weighted_compiled or bool(cls.weighted_kernel)
            FORMATS[cls.name] = cls()

    def row_bytes(self, n_per_row: int) -> int:
        return n_per_row // self.block * self.type_size

    def quantize(self, rows: np.ndarray, imatrix: np.ndarray | None = None, kernels: Kernels = DEFAULT) -> np.ndarray:
        """rows: (n_rows, n_per_row) float32 -> (n_rows, row_bytes) uint8; `kernels`: the run's use of
        the compiled kernels (same bytes either way)."""
        n_rows, n = rows.shape
        if n % self.block:
            raise BadInput(f"{self.name} needs rows of a multiple of {self.block} weights, got {n}.")
        x = np.ascontiguousarray(rows, dtype=F32)
        if imatrix is not None and self.uses_imatrix:
            if self.weighted_kernel and self.compiled(kernels):
                kernels.note_if_cold("_kernels", self.weighted_kernel)
                out = jit.run_weighted(self.weighted_kernel, x, imatrix, self.type_size, self.block)
            else:
                out = self.quantize_weighted(x, np.ascontiguousarray(imatrix, dtype=F32))
        elif self.compiled(kernels):
            if native.has(self.jit_kernel):
                out = native.run(self.jit_kernel, x, self.type_size)
            else:
                kernels.note_if_cold("_kernels", self.jit_kernel)
                out = jit.run(self.jit_kernel, x, self.type_size, self.block)
        else:
            out = self.quantize_blocks(x.reshape(-1, self.block))
        return out.reshape(n_rows, self.row_bytes(n))

    def compiled(self, kernels: Kernels = DEFAULT, weighted: bool = False) -> bool:
        """Does a compiled kernel (numba, same bytes, GIL released) run this format's path without an
        imatrix (with one when `weighted`) in a run using `kernels`? The linked library's kernels
        (native.py) always do: they cost no start-up."""
        if not weighted and self.jit_kernel and native.has(self.jit_kernel):
            return True
        return bool(self.jit_kernel) and kernels.on() and (not weighted or self.weighted_compiled)

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

    def unpack_levels(self, b: np.ndarray) -> np.ndarray:
        """The unsigned level of every weight of (nb, type_size) blocks: (nb, block) integers."""
        raise NotImplementedError

    def pack_levels(self, out: np.ndarray, L: np.ndarray) -> None:
        """Write the levels L (nb, block) uint8 into the level bits of the blocks `out` (in place)."""
        raise NotImplementedError


class ColumnWeighted(Format):
    """With an imatrix, every row uses the same column weights, block by block (K-quants, IQ4)."""

    uses_imatrix = True

    def quantize_weighted(self, rows, imatrix):
        n_rows, n = rows.shape
        qw = np.broadcast_to(imatrix.reshape(1, n), (n_rows, n)).reshape(-1, self.block)
        return self.quantize_blocks(rows.reshape(-1, self.block), np.ascontiguousarray(qw))


def get_format(name: str) -> Format:
    key = name.upper()
    if key not in FORMATS:
        _load(key)
    try:
        return FORMATS[key]
    except KeyError:
        _load_all()
        raise BadInput(f"unknown tensor type {name!r}; llmkit quantizes to {', '.join(sorted(FORMATS))}.") from None


def by_id(type_id: int) -> Format | None:
    if type_id in GGML_TYPES:
        return get_format(GGML_TYPES[type_id][0]) if _module_of(GGML_TYPES[type_id][0]) in MODULES else None
    return None


def _module_of(name: str) -> str:
    """The module defining type `name` under llmkit.quant.formats (`kquants.q4_k`, `floats`), or ""."""
    return "floats" if name in ("F32", "F16", "BF16") else _PATHS.get(name.lower(), "")


def _load(name: str) -> None:
    """Import the module of type `name` (it registers its class in FORMATS): only the types a run uses
    are loaded."""
    import importlib

    module = _module_of(name)
    if module in MODULES:
        importlib.import_module(f"llmkit.quant.formats.{module}")


def _load_all() -> None:
    """Import every format module (each registers its class in FORMATS)."""
    for m in MODULES:
        if m != "floats":
            _load(m.rpartition(".")[2].upper())
    _load("F32")


def _decoder(type_id: int):
    """The gguf reader's lookup (llmkit.gguf.dequant.register): a type's dequantizer, or None."""
    fmt = by_id(type_id)
    return None if fmt is None else fmt.dequantize


register(_decoder)
