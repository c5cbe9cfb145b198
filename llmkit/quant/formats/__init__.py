"""The quantization formats: llama.cpp's tensor types, byte-identical to ggml-quants.c.

One module per type (`q8_0.py`, `q4_k.py`, `iq4_xs.py`, `iq2_xxs.py`, ...: the block layout and what is
specific to it), the pieces several share (`numerics.py`: float32 helpers with ggml's semantics;
`packing.py`: bit packing; `search.py`: ggml's scale searches; `block32.py`, `kquant.py`, `iq4.py`,
`ternary.py`: the families; `lattice.py`: the formats whose only path is a compiled kernel on whole
rows, with `iq1.py`, `iq2.py`, `iq3.py` and the grid tables `iq2grid.py`, `iq3grid.py`), the registry
(`base.py`: `get_format`, `to_f32`), the compiled numba kernels (`jit.py`, `_kernels*.py`, same bytes)
and ggml's own library (`ggml_lib.py`: the grids are read back from its dequantizer; tests use its
quantizer as the reference). Block sizes come from `llmkit.gguf.types`.

May import: `llmkit.gguf`, `llmkit.io`, `llmkit.errors` (and numpy, numba). Nothing else in
`llmkit.quant`: every other stage builds on this one. A type's module imports shared and family
modules only, never another type's module.
"""

from llmkit.quant.formats.base import FORMATS, Format, by_id, get_format, load_f32, to_f32

__all__ = ["FORMATS", "Format", "by_id", "get_format", "load_f32", "to_f32"]
