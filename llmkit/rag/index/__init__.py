"""The index directory and its read-only view.

    manifest.py     manifest.json and the writer lock: all that `rag info` and queries need to open it
    db.py           the SQLite schema (documents, parents, chunks, entities) and generation bookkeeping
    build.py        IndexOptions / StoreOptions, `build` (add, update, remove documents)
    opening.py      the manifest a run extends (checked against its options) or a new one
    switch.py       `switch_model`: every chunk embedded again with another model (`rag adapt`)
    publish.py      one searchable generation: dedupe, vectors, BM25, graph; then the manifest swap
    embedding.py    the index's embedding model and the journal of vectors not yet published
    segments.py     a small update published as the last full build's BM25 and vectors plus a delta
    segmented.py    BM25 and vector search over such a base + delta, as over one index
    bm25.py         BM25 (Okapi) over an inverted index, equal to rank-bm25; the tokenizer
    analysis.py     how chunks and queries become BM25 terms (English: stemmed, stop words dropped)
    stem.py         the Porter stemmer
    graph.py        the entity graph (extraction, co-occurrence matrices, communities)
    vectors.py      the vector-store protocol and the faiss store (files in the index directory)
    milvus.py       the Milvus store (embedded Milvus Lite or a server)
    reader.py       `Index`: one generation opened for queries
    catalog.py      the index's SQL for reading (texts, hits, metadata filters, evaluation records)

May import: read/, chunk/, embed/, llmkit.io, llmkit.errors. Queries import only
manifest.py, analysis.py, bm25.py, catalog.py, reader.py, segmented.py and vectors.py of it (no chunkers, readers or tree-sitter).
"""
