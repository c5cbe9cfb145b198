"""Quantize GGUF weights to llama.cpp's formats, byte-identical to llama.cpp's own quantizer.

One module per format (`q8_0.py`, `q4_k.py`, ...); each defines a `Format` subclass that registers
itself here. Block layouts and sizes follow ggml; the math follows ggml-quants.c in float32 with
the same order of operations, so the bytes match.
"""

from llmkit.quant.base import FORMATS, Format, get_format

__all__ = ["FORMATS", "Format", "get_format"]
