"""The quantization formats: llama.cpp's tensor types, byte-identical to ggml-quants.c.

One module per type (`q8_0.py`, `q4_k.py`, `iq4_xs.py`, ...: the block layout and what is specific to
it), the pieces several share (`numerics.py`: float32 helpers with ggml's semantics; `packing.py`:
bit packing; `search.py`: ggml's scale searches; `block32.py`, `kquant.py`, `iq4.py`: the families),
the registry (`base.py`: `get_format`, `to_f32`) and the compiled numba kernels (`jit.py`,
`_kernels.py`, same bytes). Block sizes come from `llmkit.gguf.types`.

May import: `llmkit.gguf`, `llmkit.io`, `llmkit.errors` (and numpy, numba). Nothing else in
`llmkit.quant`: every other stage builds on this one. Formats never import each other.
"""

from llmkit.quant.formats.base import FORMATS, Format, by_id, get_format, load_f32, to_f32

__all__ = ["FORMATS", "Format", "by_id", "get_format", "load_f32", "to_f32"]
