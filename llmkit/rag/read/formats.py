"""Readers for the documents users have beyond plain text: source code (definitions, `code.py`),
reStructuredText (sections from heading adornments), Word (.docx, python-docx), CSV/TSV (groups of
rows with the header kept), Jupyter notebooks (markdown and code cells, outputs dropped) and EPUB
(ebooklib, chapters in spine order).

Each returns (sections, meta, note): `note` says how a code file was chunked ('syntax error',
'no grammar') so the caller can count fallbacks. Sections with `chunks` are already cut (code, CSV)
and are indexed verbatim: no whitespace folding, no boilerplate stripping (a `}` repeated in every
file is not a footer).
"""

from __future__ import annotations

import csv
import io
import os
import re

from llmkit.bounded import check_archive, limit, load_json

from llmkit.rag.read.code import MAX_BYTES, chunk_code, language_of
from llmkit.rag.read.markup import html_sections, markdown_sections
from llmkit.rag.read.types import Section

RST_ADORN = r"[=\-`:'\"~^_*+#<>.]"
_RST_HEADING = re.compile(rf"^(?:({RST_ADORN})\1{{2,}}[ \t]*\n)?([^\s\n][^\n]*)\n({RST_ADORN})\3{{2,}}[ \t]*$", re.M)


def code_sections(text: str, path: str, size: int, measure=len):
    """One section per definition chunk, with language/symbol/kind/line metadata (`size` in what
    `measure` counts: characters, or model tokens)."""
    lang = language_of(path) or "text"
    chunks, how = chunk_code(text, lang, size, measure)
    sections = [Section(c.symbol, c.text, chunks=[(c.text, {"language": lang, "symbol": c.symbol, "kind": c.kind,
                                                             "line_start": c.line_start, "line_end": c.line_end})])
                for c in chunks]
    return sections, {"language": lang}, "" if how == "parsed" else how


def rst_sections(text: str):
    """Split reStructuredText at section titles (a text line underlined, optionally overlined, with
    one punctuation character repeated at least as long as the title).

    >>> [(s.heading, s.text.strip()) for s in rst_sections("Intro\\n\\nTitle\\n=====\\nBody\\n")[0]]
    [('', 'Intro'), ('Title', 'Body')]
    """
    sections, start, heading = [], 0, ""
    for m in _RST_HEADING.finditer(text):
        title, under, over = m.group(2).rstrip(), m.group(3), m.group(1)
        adorn_len = len(text[m.start(3):m.end()].rstrip())
        if adorn_len < len(title) or (over and over != under) or title.startswith(".. "):
            continue
        sections.append(Section(heading, text[start:m.start()]))
        heading, start = title.strip(), m.end()
    sections.append(Section(heading, text[start:]))
    return sections, {}, ""


def docx_sections(data: bytes, what: str = "the .docx"):
    """Paragraphs and tables of a Word file in body order; Heading/Title paragraphs start sections."""
    import docx
    from docx.table import Table

    check_archive(data, what)  # python-docx unpacks every part into memory: refuse zip bombs first
    d = docx.Document(io.BytesIO(data))
    sections, heading, parts = [], "", []
    for block in d.iter_inner_content():
        if isinstance(block, Table):
            for row in block.rows:
                cells = [c.text.strip() for c in row.cells]
                parts.append(" | ".join(dict.fromkeys(c for c in cells if c)))  # merged cells repeat
            parts.append("")
            continue
        style = (block.style.name if block.style is not None else "") or ""
        if (style.startswith("Heading") or style == "Title") and block.text.strip():
            sections.append(Section(heading, "\n".join(parts)))
            heading, parts = block.text.strip(), []
        else:
            parts.append(block.text)
    sections.append(Section(heading, "\n".join(parts)))
    meta = {}
    cp = d.core_properties
    if cp.title:
        meta["title"] = cp.title
    if cp.created:
        meta["date"] = cp.created.date().isoformat()
    if cp.author:
        meta["author"] = cp.author
    return sections, meta, ""


def _cell(v: str):
    """A CSV value as metadata: a number when it reads as one (so range filters work)."""
    try:
        f = float(v)
        return int(f) if f.is_integer() and re.fullmatch(r"[+-]?\d+", v.strip()) else f
    except ValueError:
        return v


def _field_limit() -> None:
    """csv's default field limit (128 kB) would refuse a long cell; files are bounded anyway."""
    csv.field_size_limit(max(csv.field_size_limit(), limit("LLMKIT_MAX_LINE_BYTES")))


def table_header(text: str, path: str) -> tuple[str, list[str]]:
    """(delimiter, column names) of a CSV/TSV text (TSV by suffix, else sniffed among , ; | tab)."""
    _field_limit()
    delim = "\t" if path.lower().endswith(".tsv") else None
    if delim is None:
        try:
            delim = csv.Sniffer().sniff(text[:20000], delimiters=",;|\t").delimiter
        except csv.Error:
            delim = ","
    first = next(csv.reader(io.StringIO(text[:100000]), delimiter=delim), [])
    return delim, first


def table_sections(text: str, path: str, size: int, meta_columns: tuple[str, ...] = ()):
    """Rows of a CSV/TSV file: groups of rows up to `size` characters, each chunk starting with the
    header line; with `meta_columns`, one row per chunk and those columns as its metadata. Rows are
    streamed: only the current group is held."""
    delim, _ = table_header(text, path)
    rows = ((i, r) for i, r in enumerate(csv.reader(io.StringIO(text), delimiter=delim), 1)
            if any(c.strip() for c in r))
    first_row = next(rows, None)
    if first_row is None:
        return [], {}, ""
    header = first_row[1]
    meta_columns = tuple(c for c in meta_columns if c in header)  # another table may have the others
    head = delim.join(header)
    sections, group, n, first, first_values, last = [], [], len(head), 2, None, 1

    def flush(last_row):
        if group:
            body_text = head + "\n" + "\n".join(group)
            meta = {"row_start": first, "row_end": last_row}
            if meta_columns:
                values = dict(zip(header, first_values))
                meta.update({c: _cell(values.get(c, "")) for c in meta_columns})
            sections.append(Section("", body_text, chunks=[(body_text, meta)]))

    for k, (_, r) in enumerate(rows, 2):  # line 1 is the header; numbered among non-empty rows
        line = delim.join(r)
        if group and (meta_columns or n + len(line) + 1 > size):
            flush(k - 1)
            group, n, first = [], len(head), k
        if not group:
            first_values = r
        group.append(line)
        n += len(line) + 1
        last = k
    flush(last)
    return sections, {"columns": delim.join(header)}, ""


def notebook_sections(text: str, size: int, what: str = "the notebook", measure=len):
    """Markdown and code cells of a Jupyter notebook (outputs dropped); code cells as code chunks."""
    nb = load_json(text, what)
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("no 'cells' list")
    lang = ((nb.get("metadata") or {}).get("language_info") or {}).get("name") or \
        ((nb.get("metadata") or {}).get("kernelspec") or {}).get("language") or "python"
    ext = {"python": ".py", "r": ".r", "julia": ".jl", "javascript": ".js", "typescript": ".ts"}.get(str(lang).lower(), "")
    sections, heading = [], ""
    for i, cell in enumerate(nb["cells"], 1):
        if not isinstance(cell, dict):
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        if not src.strip():
            continue
        if cell.get("cell_type") == "markdown":
            for s in markdown_sections(src):
                heading = s.heading or heading
                sections.append(Section(heading, s.text))
        elif cell.get("cell_type") == "code":
            big = len(src) > MAX_BYTES  # as for code files: no parse tree for a generated blob, only lines
            chunks, _ = chunk_code(src, "text" if big else language_of("x" + ext) or "text", size, measure)
            for c in chunks:
                sections.append(Section(heading, c.text, chunks=[(c.text, {
                    "language": str(lang).lower(), "cell": i, "symbol": c.symbol, "kind": c.kind,
                    "line_start": c.line_start, "line_end": c.line_end})]))
    return sections, {}, ""


def epub_sections(data: bytes, what: str = "the .epub"):
    """Chapters of an EPUB in reading (spine) order, as HTML sections."""
    import warnings

    from ebooklib import ITEM_DOCUMENT, epub

    check_archive(data, what)  # ebooklib reads every item into memory: refuse zip bombs first
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        book = epub.read_epub(io.BytesIO(data), {"ignore_ncx": True})
    sections = []
    for idref, _ in book.spine:
        item = book.get_item_with_id(idref)
        if item is None or item.get_type() != ITEM_DOCUMENT:
            continue
        _, secs = html_sections(item.get_content().decode("utf-8", "replace"))
        sections.extend(secs)
    meta = {}
    title = book.get_metadata("DC", "title")
    if title:
        meta["title"] = str(title[0][0])
    creator = book.get_metadata("DC", "creator")
    if creator:
        meta["author"] = str(creator[0][0])
    return sections, meta, ""


def is_lock_file(path: str) -> bool:
    """Dependency lock files: generated, huge, and noise for retrieval."""
    name = os.path.basename(path).lower()
    return name in {"package-lock.json", "yarn.lock", "pnpm-lock.yaml", "cargo.lock", "poetry.lock", "uv.lock",
                    "composer.lock", "gemfile.lock", "pipfile.lock", "go.sum"}
