"""The llama.cpp driver shared by `generate`, `kv`, `rag` and `quant`.

In-process (llama-cpp-python): `runtime` opens checked GGUF models; `sampling` turns logits into
distributions; `speculative` is the acceptance rule (pure); `draft` the draft model's side and
the draft-length policy; `cache` the KV-cache moves (prefix and chunk reuse, context shift);
`generate` the decoding loop; `constrained` grammar/schema-constrained output; `chat` chat templates.
Over HTTP: `server` is the one llama-server client; `batch` runs JSONL requests across a pool of them.

May import llmkit.errors, llmkit.io and llmkit.gguf; never kv, rag, quant, tokenize or the CLI
(click), and never prints: results are returned, failures raised.
"""
