"""Embedding: texts -> L2-normalised float32 vectors.

    models.py        the model registry: the packaged default, local directories, runtimes,
                     precisions; EmbedOptions
    embedder.py      `load_embedder`: one interface over the two runtimes
    onnx_runtime.py  ONNX Runtime + HF tokenizers over a cached export (no torch on the query path)
    onnx_export.py   the export of a sentence-transformers model (needs torch, once per model)
    sbert.py         loading sentence-transformers models (torch runtime, export, fine-tuning)
    ray_embed.py     embedding on a Ray cluster with Ray Data
    env.py           environment variables third-party libraries read, set only for a block

May import: llmkit.io, llmkit.errors. Nothing of read/ or chunk/ is needed.
"""
