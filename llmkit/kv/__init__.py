"""The KV cache: memory planning from GGUF metadata (`plan`), an allocation-policy simulator
(`simulate`, over request traces from `trace`), slot files on disk (`slots`) and prompt caching with them (`prompt_cache`).

May import llmkit.llama (models, generation, the llama-server client), llmkit.gguf, llmkit.io and
llmkit.errors; never rag, quant, tokenize or the CLI (click), and never prints.
"""
