"""Retrieval: a query -> ranked hits from an `Index`.

    options.py   what a caller asks for: QueryOptions (Fusion, FilterOptions, LLMSteps), the fusion
                 to run (given > the index's tuned choice > built-in)
    pipeline.py  the Pipeline: pre-retrieval, retrieval lists, fusion, the passage per hit, re-ranking;
                 `build_pipeline` (the Pipeline, its local LLM and re-ranker, for a QueryOptions)
    expand.py    pseudo-relevance feedback and synonyms
    filters.py   metadata filters, collection masks, required terms
    route.py     choosing the collection(s) a query matches best
    fusion.py    weighted RRF and convex combinations of normalised scores
    rerank.py    cross-encoder and local-LLM re-rankers
    hits.py      Hit and parent-level grouping of ranked lists

May import: index/, embed/ (through Index), llmkit.rag.llm, llmkit.errors.
"""
