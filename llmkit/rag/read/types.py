"""The units reading produces: a `Document` made of `Section`s, or a `Skipped` record saying why a file
(or a JSONL line) was left out."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Section:
    heading: str  # "" before the first heading
    text: str
    page: int | None = None
    chunks: list[tuple[str, dict]] | None = None  # already cut (code, tables): indexed verbatim


@dataclass
class Document:
    source: str  # path as given (plus '#id' for JSONL records)
    path: str  # absolute path of the file it came from ('-' for stdin)
    hash: str  # sha256 of the record's bytes: unchanged hash = nothing to re-index
    sections: list[Section]
    meta: dict = field(default_factory=dict)  # title, date, url, ... and user fields
    note: str = ""  # how a code file was chunked when not by definitions ('syntax error', 'no grammar')


@dataclass
class Skipped:
    source: str
    reason: str
