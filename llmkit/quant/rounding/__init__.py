"""Rounding methods beyond llama.cpp's round-to-nearest (which is the formats' own): GPTQ's
error-compensating rounding into the standard block layouts (`gptq.py`), using the Hessians of
`calibration/`. Its files load in llama.cpp like any other; the bytes differ by design.

May import: `llmkit.quant.formats`, `llmkit.quant.calibration`, `llmkit.gguf`, `llmkit.errors`.
"""
