"""The quantization formats: llama.cpp's tensor types, byte-identical to ggml-quants.c.

One module per type (the block layout and what is specific to it), in a sub-package per family:

- `legacy/`: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (`block32.py`: what the 4/5-bit ones share);
- `kquants/`: Q2_K ... Q6_K (`kquant.py`: the super-blocks);
- `iquants/`: IQ4_NL, IQ4_XS (`iq4.py`) and the lattice i-quants IQ1_*, IQ2_*, IQ3_* (`lattice.py`, the
  families `iq1.py`, `iq2.py`, `iq3.py`, the grids `iq2grid.py`, `iq3grid.py`, their numba kernels);
- `lowbit/`: TQ1_0, TQ2_0 (`ternary.py`), Q1_0, Q2_0, MXFP4 (and its numba kernel).

Here, what they share: the registry (`base.py`: `get_format`; it imports a type's module on first use,
and the class registers itself through `__init_subclass__`; each format's dequantizer is registered
with the GGUF reader, whose `llmkit.gguf.dequant.to_f32` / `load_f32` are re-exported here), F32/F16/BF16 (`floats.py`),
`numerics.py` (float32 helpers with ggml's semantics), `packing.py` (bit packing), `search.py` (ggml's
scale searches), the compiled numba kernels (`jit.py`: the switch and `load_kernels`; `_kernels.py`:
the legacy and K-quant loops, same bytes), their linked library (`native.py`, built from `_cfuncs.py`)
and ggml's own library (`ggml_lib.py`: the grids are read back from its dequantizer; tests use its
quantizer as the reference). Block sizes come from `llmkit.gguf.types`.

May import: `llmkit.gguf`, `llmkit.io`, `llmkit.errors`, `llmkit.config`, `llmkit.native` (and numpy,
numba). Nothing else in `llmkit.quant`: every other stage builds on this one. A type's module imports
shared and family modules only, never another type's module; the shared modules here import no family.
"""

from llmkit.gguf.dequant import load_f32, to_f32
from llmkit.quant.formats.base import FORMATS, Format, by_id, get_format

__all__ = ["FORMATS", "Format", "by_id", "get_format", "load_f32", "to_f32"]
