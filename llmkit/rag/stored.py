"""Documents as an index holds them, so an agent can read what a search found (`rag serve`'s `get`
and `multi_get`): a document's text rebuilt from its stored sections, the line range of a chunk in
that text, and lookups by the paths the index lists (one path, or a glob over them).

Nothing here opens a path that a caller names: a path is looked up in the index's own documents
table, so `..`, absolute paths elsewhere and links lead nowhere. The text comes from the index (what
was indexed, the text hits quote), not from the file; the file is read only to say whether it
changed since (its SHA-256 against the one stored when it was indexed).

Layout (`document_text`): a code file's chunks sit at their own line numbers (the source's; lines
that no chunk holds are empty), so its lines are the file's lines; any other document is its
sections' stored text (whitespace normalised, headings and boilerplate lines left out, as indexed)
joined by blank lines.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from llmkit.errors import OptionError
from llmkit.rag.index.db import LIVE, STAT_COLUMNS

MAX_STARS = 10  # '*' wildcards a glob may have: each one more multiplies what a match may try
SEP = "\n\n"  # between the stored sections of a document that is not laid out at its own lines
# a chunk lacking source line numbers (prose) or numbered within a notebook cell: the document is not laid out at lines
_UNLINED = "(json_extract({c}.meta, '$.line_start') IS NULL OR json_extract({c}.meta, '$.cell') IS NOT NULL)"
_NEWLINES = "(length({t}) - length(replace({t}, char(10), '')))"


@dataclass
class StoredDoc:
    """One live document of an index: its row id, collection, path as indexed (`source`, what hits
    call `path`), absolute path (`file`, '#id' for a JSONL record, '-' for stdin), content hash, and
    the (size, mtime_ns, inode) of the file when indexing kept them (None: compare the hash)."""
    id: int
    collection: str
    source: str
    file: str
    hash: str
    stat: tuple[int, int, int] | None = None


def _docs(con, gen: int, where: str = "", args: tuple = ()) -> list[StoredDoc]:
    have = {row[1] for row in con.execute("PRAGMA table_info(docs)")}
    stat = ", ".join(f"d.{c}" for c in STAT_COLUMNS) if have.issuperset(STAT_COLUMNS) else "NULL, NULL, NULL"
    rows = con.execute(f"SELECT d.id, d.collection, d.source, d.path, d.hash, {stat} FROM docs d WHERE {LIVE}{where} "
                       "ORDER BY d.source, d.collection", (gen, gen, *args))
    return [StoredDoc(*r[:5], tuple(r[5:]) if None not in r[5:] else None) for r in rows]


def find_document(con, gen: int, path: str, collection: str | None = None) -> StoredDoc | None:
    """The live document of generation `gen` indexed as `path` (as hits name it, or its absolute
    path); with several collections holding it, the one named, else the first by collection name."""
    where, args = " AND (d.source = ? OR d.path = ?)", (path, path)
    if collection is not None:
        where, args = where + " AND d.collection = ?", (*args, collection)
    found = _docs(con, gen, where, args)
    return found[0] if found else None


def glob_regex(pattern: str) -> re.Pattern:
    """A glob as a regular expression: `*` and `?` stay within one path component, `**/` spans any
    number of directories (none included), `[...]` is a character class (`[!...]` negated).

    >>> [bool(glob_regex("docs/**/*.md").match(p)) for p in ("docs/a.md", "docs/x/y/b.md", "docs/a.txt", "a.md")]
    [True, True, False, False]
    """
    stars = len(re.findall(r"\*+", pattern))
    if stars > MAX_STARS:
        raise OptionError("{pattern} has {stars} '*' wildcards, more than the {most} a glob may have. Use fewer "
                          "(one '**' spans any number of folders).", stars=stars, most=MAX_STARS)
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        j = pattern.find("]", i + 2) if c == "[" else -1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif j > 0:
            body = pattern[i + 1:j].replace("\\", "\\\\")
            neg = body.startswith("!")
            body = body[1:] if neg else body
            out.append("[" + ("^" if neg else "") + ("\\" + body if body.startswith("^") else body) + "]")
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.S)


def glob_documents(con, gen: int, pattern: str) -> list[StoredDoc]:
    """The live documents whose path (as indexed, or absolute) matches the glob, in path order; a
    JSONL record also matches by its file's path (`docs.jsonl` selects every record of it)."""
    rx = glob_regex(pattern)

    def hit(p: str) -> bool:
        return bool(rx.match(p) or ("#" in p and rx.match(p.split("#", 1)[0])))

    # only paths that start with the pattern's text before its first wildcard can match
    prefix = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
    where, args = "", ()
    if prefix:
        where, args = " AND (substr(d.source, 1, ?) = ? OR substr(d.path, 1, ?) = ?)", (len(prefix), prefix) * 2
    return [d for d in _docs(con, gen, where, args) if hit(d.source) or hit(d.file)]


def _sections(con, doc_id: int) -> tuple[list[tuple[str, int | None, int | None]], bool]:
    """([(stored text, first line, last line)] of a document's parents in order, laid out at lines?)"""
    rows = con.execute(  # the document's chunks summed per parent once (chunks have no index on parent_id)
        "SELECT p.text, a.first, a.last, a.unlined FROM parents p LEFT JOIN "
        "(SELECT c.parent_id, MIN(json_extract(c.meta, '$.line_start')) AS first, "
        f"MAX(json_extract(c.meta, '$.line_end')) AS last, SUM({_UNLINED.format(c='c')}) AS unlined "
        "FROM chunks c WHERE c.doc_id = ? GROUP BY c.parent_id) a ON a.parent_id = p.id "
        "WHERE p.doc_id = ? ORDER BY p.id", (doc_id, doc_id)).fetchall()
    return [(t, a, b) for t, a, b, _ in rows], not any(u for *_, u in rows)


def document_text(con, doc_id: int) -> str:
    """The document's text as the index holds it (module docstring: code at its own lines, other
    documents' sections joined by a blank line)."""
    parts, lined = _sections(con, doc_id)
    if not lined:
        return SEP.join(t for t, _, _ in parts)
    lines: list[str] = []
    for text, a, b in parts:
        if a is None:  # a parent without chunks has no place in the file
            continue
        own = text.split("\n")[-(b - a + 1):]  # a leading comment naming the definition is not the source's
        if len(lines) < b:
            lines.extend([""] * (b - len(lines)))
        lines[a - 1:a - 1 + len(own)] = own
    return "\n".join(lines)


def chunk_lines(con, chunk_ids) -> dict[int, tuple[int, int]]:
    """Chunk id -> (first, last) line (1-based) of the chunk in its document's `document_text`,
    computed inside SQLite so no document text is copied out."""
    ids = [int(i) for i in chunk_ids]
    if not ids:
        return {}
    sql = (f"SELECT c.id, json_extract(c.meta, '$.line_start'), json_extract(c.meta, '$.line_end'), "
           f"(SELECT COUNT(*) FROM chunks x WHERE x.doc_id = c.doc_id AND {_UNLINED.format(c='x')}), "
           f"(SELECT COALESCE(SUM({_NEWLINES.format(t='q.text')} + 2), 0) FROM parents q "
           f"WHERE q.doc_id = c.doc_id AND q.id < c.parent_id), instr(p.text, c.text), "
           f"{_NEWLINES.format(t='substr(p.text, 1, instr(p.text, c.text) - 1)')}, {_NEWLINES.format(t='c.text')} "
           f"FROM chunks c JOIN parents p ON p.id = c.parent_id WHERE c.id IN ({','.join('?' * len(ids))})")
    out = {}
    for cid, a, b, unlined, before, at, ahead, own in con.execute(sql, ids):
        if not unlined and a is not None:
            out[cid] = (int(a), int(b))
        elif at:  # sections before this one (their lines and the blank line between), then within it
            first = 1 + before + ahead
            out[cid] = (first, first + own)
    return out


@dataclass
class LineRange:
    """Lines `first`..`last` of a document of `total` lines (`last` < `first`: none), their text,
    whether the request ran past the end, and the line to continue from when `max_bytes` stopped it."""
    first: int
    last: int
    total: int
    text: str
    past_end: bool
    next_line: int | None = None
    cut_line: bool = False  # the one line returned was longer than max_bytes: its start only

    def note(self, max_bytes: int) -> str:
        """What a reader should know about this range, in words ('' when it is just what was asked)."""
        notes = []
        if self.past_end:
            notes.append(f"the document has {self.total} lines; the range asked for runs past its end, "
                         "so only the lines that exist are returned")
        if self.cut_line:
            notes.append(f"line {self.first} is longer than {max_bytes} bytes: only its start is returned")
        if self.next_line is not None:
            notes.append(f"stopped to stay within {max_bytes} bytes; continue from line {self.next_line}")
        return "; ".join(notes)


def take_lines(text: str, first: int = 1, count: int | None = None, max_bytes: int = 1 << 20) -> LineRange:
    """Lines `first`.. (1-based) of `text`, at most `count` of them and `max_bytes` UTF-8 bytes
    (whole lines, except a first line longer than the budget, of which its start is returned).

    >>> r = take_lines("a\\nbb\\nccc", 2, 5)
    >>> (r.first, r.last, r.total, r.text, r.past_end)
    (2, 3, 3, 'bb\\nccc', True)
    >>> r = take_lines("a\\nbb\\nccc", 1, None, 4)
    >>> (r.text, r.next_line)
    ('a\\nbb', 3)
    """
    lines = text.split("\n") if text else []
    total = len(lines)
    end = total if count is None else first - 1 + count
    past_end = first > total or end > total
    end = min(end, total)
    got, used, nxt, cut = [], 0, None, False
    for i in range(first - 1, end):
        size = len(lines[i].encode("utf-8")) + (1 if got else 0)
        if used + size > max_bytes:
            if not got:  # one line over the whole budget: its start, cut at a character boundary
                got.append(lines[i].encode("utf-8")[:max_bytes].decode("utf-8", "ignore"))
                cut = True
                nxt = i + 2 if i + 1 < end else None
            else:
                nxt = i + 1
            break
        got.append(lines[i])
        used += size
    return LineRange(first, first - 1 + len(got), total, "\n".join(got), past_end, nxt, cut)


def file_state(doc: StoredDoc, cache: dict | None = None) -> str:
    """Whether the file a document was read from still holds what was indexed: 'unchanged',
    'changed', 'missing', or 'unchecked' (stdin). A file whose size, mtime and inode equal those
    indexing kept is not read (as `rag index` does not read it again); otherwise its hash decides.
    Only paths the index lists are read; a JSONL record is looked for among its file's lines (the
    hash indexing stored is the line's)."""
    if doc.file == "-":
        return "unchecked"
    from llmkit.rag.read.documents import size_cap

    record = not os.path.isfile(doc.file) and "#" in doc.file
    path = doc.file.split("#", 1)[0] if record else doc.file
    if doc.stat is not None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return "missing"
        except OSError:
            st = None
        if st is not None and (st.st_size, st.st_mtime_ns, st.st_ino) == doc.stat:
            return "unchanged"
    key = (path, record)
    if cache is not None and key in cache:
        got = cache[key]
    else:
        got = _file_hashes(path, record, size_cap(path)[0])
        if cache is not None:
            cache[key] = got
    if got is None:
        return "missing"
    return "unchanged" if doc.hash in got else "changed"


def _file_hashes(path: str, record: bool, cap: int) -> set[str] | None:
    """SHA-256 of a file's bytes (of each line, for JSONL records, decoded as indexing decodes them);
    None when it is gone, an empty set when it is now too large to have been indexed or unreadable."""
    try:
        if os.path.getsize(path) > cap:
            return set()  # indexing would refuse it now, so it is not what was indexed
        with open(path, "rb") as f:
            data = f.read(cap + 1)
    except FileNotFoundError:
        return None
    except OSError:
        return set()
    if not record:
        return {hashlib.sha256(data).hexdigest()}
    from llmkit.rag.read.decode import NotText, decode_text

    try:
        text = decode_text(data)[0].lstrip("\ufeff")
    except NotText:
        return set()
    return {hashlib.sha256(line.encode("utf-8")).hexdigest() for line in text.split("\n") if line.strip()}
