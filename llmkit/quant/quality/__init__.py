"""What quantization cost: per-tensor error statistics and model-to-model comparison (`stats.py`),
llama-perplexity's chunked scoring (`scoring.py`), perplexity (`perplexity.py`) and KL divergence
against a saved base with llama-perplexity's file format and statistics (`kld.py`).

May import: `llmkit.quant.formats` (to decode tensors), `llmkit.llama.runtime` (to run models),
`llmkit.gguf`, `llmkit.io`, `llmkit.errors`.
"""
