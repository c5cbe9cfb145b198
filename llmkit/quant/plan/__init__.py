"""Which type each tensor gets, as llama.cpp's llama-quant.cpp decides it: the file types and their
_S/_M/_L mixes, the tensors never quantized, fallbacks for row lengths, the per-tensor overrides
(`rules.py`), and the plan of one file in llama.cpp's tensor order (`tensors.py`).

May import: `llmkit.gguf`, `llmkit.errors`. Pure decisions: no numerics, no files written.
"""
