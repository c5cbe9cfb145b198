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
import time

from llmkit.bounded import LimitExceeded, json_limits, limit, load_json_line, too_large
from llmkit.rag.read import formats
from llmkit.rag.read.code import LANGUAGES, MAX_BYTES, minified
from llmkit.rag.read.decode import NotText, decode_text
from llmkit.rag.read.markup import front_matter, html_sections, markdown_sections
from llmkit.rag.read.types import Document, Section, Skipped

# read as plain text (configuration, markup, logs); files without a suffix too (README, Makefile)
PLAIN = {".txt", ".text", ".toml", ".yaml", ".yml", ".ini", ".cfg", ".conf", ".json", ".xml", ".css", ".scss",
         ".tex", ".org", ".adoc", ".asciidoc", ".log", ".properties", ".cmake", ".mk", ".gradle", ".r", ".jl",
         ".pl", ".pm", ".el", ".vim", ".dockerfile", ".proto", ".graphql", ".tf", ".nix", ".cabal", ".hs", ".ml",
         ".ex", ".exs", ".erl", ".dart", ".zig", ".nim", ".v", ".sv", ".vhd", ""}
SUFFIXES = PLAIN | set(LANGUAGES) | {".md", ".markdown", ".rst", ".html", ".htm", ".jsonl", ".pdf", ".docx",
                                     ".csv", ".tsv", ".ipynb", ".epub"}


def file_date(path: str) -> str:
    """The file's modification time as an ISO date (the fallback `date` field)."""
    return _dt.datetime.fromtimestamp(os.path.getmtime(path), _dt.timezone.utc).date().isoformat()


def size_cap(path: str) -> tuple[int, str]:
    """(bytes, limit name) a file of this name may have: PDFs have their own limit."""
    name = "LLMKIT_MAX_PDF_BYTES" if path.lower().endswith(".pdf") else "LLMKIT_MAX_FILE_BYTES"
    return limit(name), name


def load_file(path: str, data: bytes, *, text_field: str = "text", id_field: str = "id",
              display: str | None = None, size: int = 800, code_size: int = 1500,
              csv_meta: tuple[str, ...] = (), measure=len) -> tuple[list[Document], list[Skipped]]:
    """Parse one file's bytes into documents (JSONL: one per line). `size` groups CSV rows,
    `code_size` bounds code chunks (in what `measure` counts: characters, or an embedding model's
    tokens), `csv_meta` names CSV columns to keep as metadata. Never raises
    for the file's content: whatever goes wrong with it becomes a `Skipped` with the reason."""
    display = display or ("<stdin>" if path == "-" else path)
    try:
        return _load(path, data, display, text_field, id_field, size, code_size, csv_meta, measure)
    except LimitExceeded as e:
        return [], [Skipped(display, e.reason)]
    except Exception as e:  # MemoryError and RecursionError included: one bad file must not stop the run
        detail = (str(e).splitlines() or [""])[0][:80]
        return [], [Skipped(display, f"unreadable ({type(e).__name__}{': ' + detail if detail else ''})")]


def _load(path, data, display, text_field, id_field, size, code_size, csv_meta, measure=len):
    abspath = "-" if path == "-" else os.path.abspath(path)
    suffix = "" if path == "-" else os.path.splitext(path)[1].lower()
    if suffix == ".pdf" or data[:5] == b"%PDF-":
        if len(data) > limit("LLMKIT_MAX_PDF_BYTES"):
            raise LimitExceeded(f"'{display}'", "LLMKIT_MAX_PDF_BYTES")
        return _load_pdf(display, abspath, data)
    if not data.strip():
        return [], [Skipped(display, "empty")]
    cap = limit("LLMKIT_MAX_FILE_BYTES")
    if len(data) > cap:
        return [], [Skipped(display, too_large(len(data), cap, "LLMKIT_MAX_FILE_BYTES"))]
    if path != "-" and formats.is_lock_file(path):
        return [], [Skipped(display, "lock file")]
    digest = hashlib.sha256(data).hexdigest()
    if suffix in (".docx", ".epub"):
        return _load_archive(path, data, display, abspath, digest, suffix)
    try:
        text, _encoding = decode_text(data)
    except NotText as e:
        return [], [Skipped(display, str(e))]
    text = text.lstrip("\ufeff")
    meta: dict = {}
    note = ""
    if suffix == ".jsonl":
        return _load_jsonl(display, abspath, text, text_field, id_field)
    if suffix in LANGUAGES:
        if len(data) > MAX_BYTES:
            return [], [Skipped(display, f"too large for code ({len(data) >> 10} kB; the cap is {MAX_BYTES >> 10} kB)")]
        if minified(text):
            return [], [Skipped(display, "minified")]
        sections, meta, note = formats.code_sections(text, path, code_size, measure)
    elif suffix in (".csv", ".tsv"):
        sections, meta, note = formats.table_sections(text, path, size, csv_meta)
    elif suffix == ".ipynb":
        try:
            sections, meta, note = formats.notebook_sections(text, code_size, f"'{display}'", measure)
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


def _load_archive(path, data, display, abspath, digest, suffix):
    """A .docx or .epub document (a zip of XML files), or why it was skipped."""
    try:
        sections, meta, note = (formats.docx_sections(data, display) if suffix == ".docx"
                                else formats.epub_sections(data, display))
    except ImportError as e:
        return [], [Skipped(display, f"{suffix} needs {e.name} (pip install 'llmkit[rag]')")]
    except LimitExceeded:
        raise
    except Exception as e:  # damaged archives raise many types; one bad file must not stop the run
        return [], [Skipped(display, f"unreadable {suffix} ({type(e).__name__})")]
    return _finish(path, display, abspath, digest, sections, meta, note)


def _finish(path, display, abspath, digest, sections, meta, note):
    """Title and date fallbacks; a document with no text is skipped."""
    if "title" not in meta:
        first = next((s.heading for s in sections if s.heading), "")
        meta["title"] = first or (os.path.basename(display) if path != "-" else "")
    if "date" not in meta and path != "-":
        try:
            meta["date"] = file_date(path)
        except OSError:  # removed since it was read: the text read stands, without a date
            pass
    sections = [s for s in sections if s.text.strip() or s.heading]
    if not any(s.text.strip() for s in sections):
        return [], [Skipped(display, "no text")]
    return [Document(display, abspath, digest, sections, meta, note)], []


def _load_jsonl(display: str, abspath: str, text: str, text_field: str, id_field: str):
    docs, skipped, caps = [], [], json_limits()
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{display}:{n}"
        try:
            rec = load_json_line(line, f"line {n} of '{display}'", caps)
        except json.JSONDecodeError as e:
            skipped.append(Skipped(where, f"invalid JSON ({e.msg})"))
            continue
        except LimitExceeded as e:
            skipped.append(Skipped(where, e.reason))
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
    deadline = time.monotonic() + limit("LLMKIT_MAX_PDF_SECONDS")
    per_page = limit("LLMKIT_MAX_PDF_PAGE_SECONDS")
    slow: list[Skipped] = []
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        pages = []
        for i, page in enumerate(reader.pages):
            if time.monotonic() > deadline:  # checked between pages (a page has its own limit below)
                raise LimitExceeded(f"'{display}'", "LLMKIT_MAX_PDF_SECONDS", f"stopped at page {i + 1}")
            text = _page_text(page, min(per_page, max(0.01, deadline - time.monotonic())))
            if text is None:
                slow.append(Skipped(f"{display}#page={i + 1}",
                                    LimitExceeded(f"page {i + 1}", "LLMKIT_MAX_PDF_PAGE_SECONDS").reason))
                continue
            pages.append(Section("", text, page=i + 1))
        title = (reader.metadata or {}).get("/Title") or ""
    except LimitExceeded:
        raise
    except Exception as e:  # pypdf raises many types on damaged files; one bad PDF must not stop the run
        return [], [Skipped(display, f"unreadable PDF ({type(e).__name__})")]
    pages = [p for p in pages if p.text.strip()]
    if not pages:
        return [], slow or [Skipped(display, "PDF without extractable text")]
    meta = {"title": str(title) or os.path.basename(display)}
    return [Document(display, abspath, hashlib.sha256(data).hexdigest(), pages, meta)], slow


class _PageTimeout(BaseException):
    """Raised by the page timer; a BaseException, so pypdf's own `except Exception` cannot swallow it."""


def _page_text(page, seconds: float) -> str | None:
    """The text of one PDF page, or None when extracting it takes longer than `seconds`: in the main
    thread a timer (SIGALRM) interrupts pypdf mid-page (a content stream that would take minutes);
    elsewhere the page is finished and then measured."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        t = time.monotonic()
        text = page.extract_text() or ""
        return None if time.monotonic() - t > seconds else text

    armed = [True]

    def on_alarm(signum, frame):
        if armed[0]:
            raise _PageTimeout

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return page.extract_text() or ""
    except _PageTimeout:
        return None
    finally:
        while True:  # the one-shot timer may fire right here: it is disarmed first, then stopped
            try:
                armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
                break
            except _PageTimeout:
                continue
