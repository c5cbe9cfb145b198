"""Retrieval: a query -> ranked hits from an `Index`.

    options.py   what a caller asks for: FusionRequest, FilterOptions, LLMSteps; `build_pipeline`
    pipeline.py  QueryOptions and the Pipeline: pre-retrieval, retrieval lists, fusion, re-ranking
    settings.py  fusion settings (explicit > the index's tuned choice > built-in), weights
    expand.py    pseudo-relevance feedback and synonyms
    filters.py   metadata filters, collection masks, required terms
    route.py     choosing the collection(s) a query matches best
    fusion.py    weighted RRF and convex combinations of normalised scores
    rerank.py    cross-encoder and local-LLM re-rankers
    hits.py      Hit and parent-level grouping of ranked lists

May import: index/, embed/ (through Index), llmkit.rag.llm, llmkit.errors.
"""
