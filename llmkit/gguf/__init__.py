"""GGUF files: a hardened reader that llmkit uses before anything is handed to llama.cpp."""

from llmkit.gguf.reader import GGUFFile, read_gguf

__all__ = ["GGUFFile", "read_gguf"]
