"""GGUF files, below every model-handling package: the type table (`types`: block sizes of every
ggml type), a hardened reader (`reader`), tensor data as raw bytes (`tensors`), the same data as
float32 rows (`dequant`: `to_f32`, `load_f32`) and a writer (`writer`). May import only `llmkit.io`
and `llmkit.errors` (and numpy); the per-type dequantizers are `llmkit.quant.formats`', which
registers them with `dequant` (named there, imported on first use, never imported at import time)."""

from llmkit.gguf.reader import GGUFFile, read_gguf

__all__ = ["GGUFFile", "read_gguf"]
