"""Evaluation and tuning of retrieval.

    datasets.py  queries and TREC qrels files, the Cranfield collection
    metrics.py   nDCG, recall, reciprocal rank; `evaluate` one configuration over judged queries
    queries.py   pseudo-queries from the corpus, judged queries, document keys, multi-hop test sets
    tune.py      `rag tune`: choose an index's fusion from data
    adapt.py     `rag adapt`: fine-tune the embedding model on the corpus, promote when better

May import: retrieve/, index/, embed/, chunk/, llmkit.rag.llm, llmkit.errors.
"""
