"""Chunking: documents -> parents and chunks.

    spans.py     recursive and window splitting, whitespace cleaning, boilerplate lines
    dedupe.py    exact-duplicate keys, MinHash signatures, near-duplicate detection
    sections.py  ChunkOptions; one document -> (parent text, [(chunk text, metadata)])

May import: read/, llmkit.errors.
"""
