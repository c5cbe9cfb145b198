"""The llama.cpp driver shared by `generate`, `kv` and `rag`: model loading, sampling, decoding loops."""
