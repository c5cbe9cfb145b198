"""Embedding: texts -> L2-normalised float32 vectors.

    models.py        the model registry: the packaged default, local directories, runtimes,
                     precisions; EmbedOptions
    base.py          `Embedder`: the interface every runtime implements
    embedder.py      `load_embedder`: one interface over the runtimes (ONNX, torch, llama.cpp for GGUF)
    onnx_runtime.py  ONNX Runtime + HF tokenizers over a cached export (no torch on the query path)
    onnx_build.py    the fused ONNX graph of a BERT-family model built from its safetensors (no torch)
    onnx_export.py   the export cache: built as above, else exported with torch (once per model)
    openvino_runtime.py  bf16 indexing: the fp32 graph compiled by OpenVINO with bf16 products
    gguf_runtime.py  GGUF embedders and re-rankers through llama.cpp: what a file is, batching, pooling
    openai_endpoint.py  an embedding model served over HTTP (/v1/embeddings of an OpenAI-compatible server)
    sbert.py         loading sentence-transformers models (torch runtime, export, fine-tuning)
    ray_embed.py     embedding on a Ray cluster with Ray Data

May import: llmkit.io, llmkit.errors, llmkit.gguf (reader, converter's source reader), llmkit.llama.runtime,
llmkit.rag.endpoint (the HTTP client of endpoint specs).
Nothing of read/ or chunk/ is needed.
"""
