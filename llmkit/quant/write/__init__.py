"""Writing the quantized file as llama.cpp's llama_model_quantize does, byte for byte: the header,
the tensors in llama.cpp's order, each converted in parallel jobs (`quantize.py`), and the thread and
process workers with their buffers (`jobs.py`).

May import: `llmkit.quant.options` (the run's options), `llmkit.quant.memory`, `llmkit.machine`, `llmkit.quant.formats`, `llmkit.quant.plan`, `llmkit.quant.quality.stats` (the errors of
a measured run), `llmkit.gguf`, `llmkit.io`, `llmkit.errors`.
"""
