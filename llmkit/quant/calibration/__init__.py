"""Calibration: running a model over text through llama.cpp's eval callback to learn what its
matrices see. Importance matrices (`imatrix.py`: llama.cpp's GGUF and legacy .dat formats, and
collecting one) and GPTQ's Hessians (`hessians.py`: collecting, saving, indexing).

May import: `llmkit.llama.runtime` (and llama_cpp, lazily), `llmkit.gguf`, `llmkit.quant.memory`, `llmkit.machine`, `llmkit.errors`.
"""
