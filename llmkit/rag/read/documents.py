"""Read documents for indexing: plain text, Markdown (headings become sections, `markup.py`), HTML
(visible text), JSONL (a text field plus metadata fields), PDF (page numbers as metadata, with pypdf),
and through `formats.py` source code, reStructuredText, Word, CSV/TSV, Jupyter notebooks and EPUB.

Every reader returns `Document`s made of `Section`s; problems with one file become a `Skipped`
record (counted and reported by the caller), never an exception that stops the whole run.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re

from llmkit.io import looks_binary
from llmkit.rag.read import formats
from llmkit.rag.read.code import LANGUAGES, MAX_BYTES, minified
from llmkit.rag.read.markup import front_matter, html_sections, markdown_sections
from llmkit.rag.read.types import Document, Section, Skipped

# read as plain text (configuration, markup, logs); files without a suffix too (README, Makefile)
PLAIN = {".txt", ".text", ".toml", ".yaml", ".yml", ".ini", ".cfg", ".conf", ".json", ".xml", ".css", ".scss",
         ".tex", ".org", ".adoc", ".asciidoc", ".log", ".properties", ".cmake", ".mk", ".gradle", ".r", ".jl",
         ".pl", ".pm", ".el", ".vim", ".dockerfile", ".proto", ".graphql", ".tf", ".nix", ".cabal", ".hs", ".ml",
         ".ex", ".exs", ".erl", ".dart", ".zig", ".nim", ".v", ".sv", ".vhd", ""}
SUFFIXES = PLAIN | set(LANGUAGES) | {".md", ".markdown", ".rst", ".html", ".htm", ".jsonl", ".pdf", ".docx",
                                     ".csv", ".tsv", ".ipynb", ".epub"}
MAX_TEXT_BYTES = 32 << 20  # larger files are skipped (dumps, logs): say so rather than stall


def file_date(path: str) -> str:
    """The file's modification time as an ISO date (the fallback `date` field)."""
    return _dt.datetime.fromtimestamp(os.path.getmtime(path), _dt.timezone.utc).date().isoformat()


def load_file(path: str, data: bytes, *, text_field: str = "text", id_field: str = "id",
              display: str | None = None, size: int = 800, code_size: int = 1500,
              csv_meta: tuple[str, ...] = ()) -> tuple[list[Document], list[Skipped]]:
    """Parse one file's bytes into documents (JSONL: one per line). `size` groups CSV rows,
    `code_size` bounds code chunks, `csv_meta` names CSV columns to keep as metadata."""
    display = display or ("<stdin>" if path == "-" else path)
    abspath = "-" if path == "-" else os.path.abspath(path)
    suffix = "" if path == "-" else os.path.splitext(path)[1].lower()
    if suffix == ".pdf" or data[:5] == b"%PDF-":
        return _load_pdf(display, abspath, data)
    if not data.strip():
        return [], [Skipped(display, "empty")]
    if len(data) > MAX_TEXT_BYTES:
        return [], [Skipped(display, f"too large ({len(data) >> 20} MB; the cap is {MAX_TEXT_BYTES >> 20} MB)")]
    if path != "-" and formats.is_lock_file(path):
        return [], [Skipped(display, "lock file")]
    meta: dict = {}
    note = ""
    digest = hashlib.sha256(data).hexdigest()
    if suffix in (".docx", ".epub"):
        try:
            sections, meta, note = (formats.docx_sections(data) if suffix == ".docx" else formats.epub_sections(data))
        except ImportError as e:
            return [], [Skipped(display, f"{suffix} needs {e.name} (pip install 'llmkit[rag]')")]
        except Exception as e:  # damaged archives raise many types; one bad file must not stop the run
            return [], [Skipped(display, f"unreadable {suffix} ({type(e).__name__})")]
        return _finish(path, display, abspath, digest, sections, meta, note)
    if looks_binary(data[:8192]):
        return [], [Skipped(display, "binary")]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return [], [Skipped(display, f"not UTF-8 (byte {e.start})")]
    text = text.lstrip("\ufeff")
    if suffix == ".jsonl":
        return _load_jsonl(display, abspath, text, text_field, id_field)
    if suffix in LANGUAGES:
        if len(data) > MAX_BYTES:
            return [], [Skipped(display, f"too large for code ({len(data) >> 10} kB; the cap is {MAX_BYTES >> 10} kB)")]
        if minified(text):
            return [], [Skipped(display, "minified")]
        sections, meta, note = formats.code_sections(text, path, code_size)
    elif suffix in (".csv", ".tsv"):
        sections, meta, note = formats.table_sections(text, path, size, csv_meta)
    elif suffix == ".ipynb":
        try:
            sections, meta, note = formats.notebook_sections(text, code_size)
        except (ValueError, TypeError, AttributeError) as e:
            return [], [Skipped(display, f"not a notebook ({str(e).splitlines()[0][:60]})")]
    elif suffix == ".rst":
        sections, meta, note = formats.rst_sections(text)
    elif suffix in (".html", ".htm") or (suffix == "" and re.match(r"\s*<(!doctype html|html)", text[:200], re.I)):
        title, sections = html_sections(text)
        if title:
            meta["title"] = title
    elif suffix in (".md", ".markdown"):
        front, text = front_matter(text)
        meta.update(front)
        sections = markdown_sections(text)
    else:
        sections = [Section("", text)]
    return _finish(path, display, abspath, digest, sections, meta, note)


def _finish(path, display, abspath, digest, sections, meta, note):
    """Title and date fallbacks; a document with no text is skipped."""
    if "title" not in meta:
        first = next((s.heading for s in sections if s.heading), "")
        meta["title"] = first or (os.path.basename(display) if path != "-" else "")
    if "date" not in meta and path != "-" and os.path.exists(path):
        meta["date"] = file_date(path)
    sections = [s for s in sections if s.text.strip() or s.heading]
    if not any(s.text.strip() for s in sections):
        return [], [Skipped(display, "no text")]
    return [Document(display, abspath, digest, sections, meta, note)], []


def _load_jsonl(display: str, abspath: str, text: str, text_field: str, id_field: str):
    docs, skipped = [], []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{display}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            skipped.append(Skipped(where, f"invalid JSON ({e.msg})"))
            continue
        if not isinstance(rec, dict):
            skipped.append(Skipped(where, "not a JSON object"))
            continue
        body = rec.get(text_field)
        if not isinstance(body, str) or not body.strip():
            skipped.append(Skipped(where, f"no text in field '{text_field}'"))
            continue
        rid = rec.get(id_field, n)
        meta = {k: v for k, v in rec.items() if k != text_field and isinstance(v, (str, int, float, bool))}
        meta.setdefault("title", str(rec.get("title", "")))
        meta["doc_id"] = str(rid)
        digest = hashlib.sha256(line.encode("utf-8")).hexdigest()
        docs.append(Document(f"{display}#{rid}", f"{abspath}#{rid}", digest, [Section("", body)], meta))
    return docs, skipped


def _load_pdf(display: str, abspath: str, data: bytes):
    try:
        import pypdf
    except ImportError:
        return [], [Skipped(display, "PDF needs pypdf (pip install 'llmkit[rag]')")]
    import io
    import logging

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        pages = [Section("", page.extract_text() or "", page=i + 1) for i, page in enumerate(reader.pages)]
        title = (reader.metadata or {}).get("/Title") or ""
    except Exception as e:  # pypdf raises many types on damaged files; one bad PDF must not stop the run
        return [], [Skipped(display, f"unreadable PDF ({type(e).__name__})")]
    pages = [p for p in pages if p.text.strip()]
    if not pages:
        return [], [Skipped(display, "PDF without extractable text")]
    meta = {"title": str(title) or os.path.basename(display)}
    return [Document(display, abspath, hashlib.sha256(data).hexdigest(), pages, meta)], []
