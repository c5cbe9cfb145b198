"""Reading: files and standard input -> `Document`s made of `Section`s.

    types.py      Document, Section, Skipped
    documents.py  `load_file`: one file's bytes -> documents (text, Markdown, HTML, JSONL, PDF, ...)
    markup.py     Markdown, front matter and HTML sections
    formats.py    code, reStructuredText, Word, CSV/TSV, notebooks, EPUB
    code.py       source code cut at definitions (tree-sitter)
    files.py      ReadOptions; walking directories (.gitignore, include/exclude globs)

May import: llmkit.io, llmkit.errors, llmkit.rag.errors. Nothing of the later stages.
"""
