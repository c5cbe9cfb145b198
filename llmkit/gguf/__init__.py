"""GGUF files, below every model-handling package: the type table (`types`: block sizes of every
ggml type), a hardened reader (`reader`), tensor data as raw bytes (`tensors`) and a writer
(`writer`). May import only `llmkit.io` and `llmkit.errors` (and numpy); nothing here decodes
quantized numbers (that is `llmkit.quant.formats`)."""

from llmkit.gguf.reader import GGUFFile, read_gguf

__all__ = ["GGUFFile", "read_gguf"]
