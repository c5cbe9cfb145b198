"""Reading: files and standard input -> `Document`s made of `Section`s.

    types.py      Document, Section, Skipped
    documents.py  `load_file`: one file's bytes -> documents (text, Markdown, HTML, JSONL, PDF, ...);
                  never raises for a file's content: any failure is a `Skipped` with its reason
    decode.py     bytes -> text: UTF-8/16/32, Windows-1252 / Latin-1, charset-normalizer's guesses
    markup.py     Markdown, front matter and HTML sections
    formats.py    code, reStructuredText, Word, CSV/TSV, notebooks, EPUB
    code.py       source code cut at definitions (tree-sitter)
    files.py      ReadOptions; walking directories (.gitignore, include/exclude globs; links, pipes
                  and devices skipped); `read_input`, a file's bytes within its size limit

Limits on what a file may hold (nesting, unpacked bytes, entries, sizes, parse time) are the
LLMKIT_MAX_* variables of llmkit.io.LIMITS.

May import: llmkit.io, llmkit.walk, llmkit.errors. Nothing of the later stages.
"""
