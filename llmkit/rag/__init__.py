"""llmkit.rag: retrieval-augmented generation on your own machine, in the order data flows.

    read/      files -> documents (per-format loaders, directory walking with .gitignore, code parsing)
    chunk/     documents -> parents and chunks (recursive / window splitting, duplicates, boilerplate)
    embed/     chunks -> vectors (model registry, ONNX Runtime, export, sentence-transformers, Ray)
    index/     the index directory (manifest, SQLite, build and publish, BM25, entity graph, vector
               stores: faiss and Milvus behind one small protocol) and its read-only view `Index`
    retrieve/  queries -> hits (pipeline, expansion, filters and masks, routing, fusion, re-ranking)
    evaluate/  how good retrieval is (metrics, datasets, pseudo-queries, tuning, model adaptation)
    answer/    hits -> answers (the cited-sources prompt, global questions, prompt compression)

Beside them: `llm.py` (a local GGUF model for the LLM steps of every stage), `indexing.py` (a `rag index`
run: build then tune, and watching the inputs) and `serve.py` (an index answered over the Model Context
Protocol, reading documents back as the index holds them through `stored.py`); these may import every
stage. Option errors are
`llmkit.errors.OptionError` (messages a front end spells in its own words). A stage imports only the
stages above it in this list (and llmkit.llama, llmkit.io, llmkit.walk, llmkit.errors); never click or rich.
"""
