"""The index's SQL for reading, in one place: what retrieval and evaluation ask of chunks.sqlite
(chunk texts, the rows behind hits, the chunks a metadata filter allows, the records pseudo-queries
and judged document keys are made from). Nothing outside this module writes a SELECT over the index.

Metadata filters read `chunk_meta`: one (key, value, chunk) row per top-level metadata field that
is not null, the value typed as `json_extract` gives it, ordered by its primary key (one B-tree, no
second index). Triggers keep it as chunks are inserted and deleted (a deletion seeks each of the
chunk's own rows), so a filter reads one key's entries instead of parsing every chunk's JSON. The writer creates it with `ensure_meta_table` (filling it once for an index built
before it existed); an index opened read-only without it is filtered with `json_extract` as before,
with the same results.
"""

from __future__ import annotations

import sqlite3
from typing import Iterable, Iterator

MAX_VARS = 900  # ids per statement: SQLite caps bound variables (999 in older builds)

META_SCHEMA = """
CREATE TABLE chunk_meta (key TEXT NOT NULL, value NOT NULL, chunk_id INTEGER NOT NULL,
    PRIMARY KEY (key, value, chunk_id)) WITHOUT ROWID;
CREATE TRIGGER chunk_meta_add AFTER INSERT ON chunks BEGIN
    INSERT OR IGNORE INTO chunk_meta (key, value, chunk_id)
        SELECT j.key, j.value, NEW.id FROM json_each(NEW.meta) j WHERE j.value IS NOT NULL;
END;
CREATE TRIGGER chunk_meta_gone AFTER DELETE ON chunks BEGIN
    DELETE FROM chunk_meta WHERE chunk_id = OLD.id AND (key, value) IN (SELECT j.key, j.value FROM json_each(OLD.meta) j);
END;
"""


# -- the writer's hook ------------------------------------------------------------------------------
def ensure_meta_table(con: sqlite3.Connection) -> None:
    """Create the metadata table and its triggers if the index has none, filled from the chunks
    already there, in one transaction (a table that exists is complete)."""
    if has_meta_table(con):
        return
    in_tx = con.in_transaction
    if not in_tx:
        con.execute("BEGIN IMMEDIATE")
    try:
        if not has_meta_table(con):  # another writer may have made it while this one waited
            for stmt in _statements(META_SCHEMA):
                con.execute(stmt)
            con.execute("INSERT OR IGNORE INTO chunk_meta (key, value, chunk_id) "
                        "SELECT j.key, j.value, c.id FROM chunks c, json_each(c.meta) j WHERE j.value IS NOT NULL")
        if not in_tx:
            con.execute("COMMIT")
    except BaseException:
        if not in_tx:
            con.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    """The statements of a script whose triggers hold `;` inside BEGIN ... END."""
    out, cur = [], []
    for line in script.strip().splitlines():
        cur.append(line)
        text = "\n".join(cur).strip()
        if text.endswith(";") and sqlite3.complete_statement(text):
            out.append(text)
            cur = []
    return out


def has_meta_table(con: sqlite3.Connection) -> bool:
    """Does this index keep the indexed metadata table?"""
    return con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'chunk_meta'").fetchone() is not None


# -- texts and hits ---------------------------------------------------------------------------------
def _in_parts(ids: list[int]) -> Iterator[list[int]]:
    for lo in range(0, len(ids), MAX_VARS):
        yield ids[lo:lo + MAX_VARS]


def chunk_texts(con: sqlite3.Connection, ids: Iterable[int]) -> dict[int, str]:
    """Chunk id -> text, for these ids."""
    got: dict[int, str] = {}
    for part in _in_parts(list(ids)):
        got.update(con.execute(f"SELECT id, text FROM chunks WHERE id IN ({','.join('?' * len(part))})", part))
    return got


def hit_records(con: sqlite3.Connection, ids: Iterable[int]) -> dict[int, tuple]:
    """Chunk id -> (id, parent id, document source, text, metadata JSON, parent text)."""
    got: dict[int, tuple] = {}
    for part in _in_parts(list(ids)):
        got.update((r[0], r) for r in con.execute(
            "SELECT c.id, c.parent_id, d.source, c.text, c.meta, p.text FROM chunks c JOIN docs d ON d.id = c.doc_id "
            f"JOIN parents p ON p.id = c.parent_id WHERE c.id IN ({','.join('?' * len(part))})", part))
    return got


# -- evaluation ---------------------------------------------------------------------------------------
def chunk_records(con: sqlite3.Connection) -> list[tuple]:
    """(id, parent id, document id, text, metadata JSON) of every chunk (pseudo-queries sample them)."""
    return con.execute("SELECT c.id, c.parent_id, c.doc_id, c.text, c.meta FROM chunks c").fetchall()


def chunk_documents(con: sqlite3.Connection) -> dict[int, int]:
    """Chunk id -> its document's id, for every chunk."""
    return dict(con.execute("SELECT id, doc_id FROM chunks"))


def judged_ids(con: sqlite3.Connection) -> Iterator[tuple[int, str, object]]:
    """(chunk id, document source, the metadata's `doc_id` or None) of every chunk."""
    yield from con.execute(
        "SELECT c.id, d.source, json_extract(c.meta, '$.doc_id') FROM chunks c JOIN docs d ON d.id = c.doc_id")


# -- metadata filters ---------------------------------------------------------------------------------
def _number(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


def _condition(col: str, op: str, value: str) -> tuple[str, list]:
    """SQL true for a metadata value `col` that passes FIELD op VALUE ('~' substring, '=' with * globs,
    numbers compared as numbers, the rest as text); a missing or null value never passes."""
    num = _number(value)
    if op == "~":
        return f"instr(lower(CAST({col} AS TEXT)), lower(?)) > 0", [value]
    if op in ("=", "!=") and ("*" in value or "?" in value):
        return ("NOT " if op == "!=" else "") + f"CAST({col} AS TEXT) GLOB ?", [value]
    if num is not None:
        return (f"(typeof({col}) IN ('integer','real') AND {col} {op} ?"
                f" OR typeof({col}) = 'text' AND CAST({col} AS REAL) {op} ? AND trim({col}) GLOB '[0-9.+-]*')",
                [num, num])
    if op == "=":  # a text value equal to text that is not a number: the index finds it
        return f"{col} = ?", [value]
    return f"CAST({col} AS TEXT) {op} ?", [value]


def filter_ids(con: sqlite3.Connection, conditions: list[tuple[str, str, str]], indexed: bool | None = None) -> list[int]:
    """Ids of the chunks whose metadata passes every (key, op, value) condition. `indexed`: read the
    metadata table (None: when the index has one) or parse every chunk's JSON (False)."""
    if indexed is None:
        indexed = has_meta_table(con)
    parts, args = [], []
    if indexed:
        for key, op, value in conditions:
            cond, a = _condition("value", op, value)
            parts.append(f"SELECT chunk_id FROM chunk_meta WHERE key = ? AND {cond}")
            args += [key, *a]
        sql = " INTERSECT ".join(parts)
    else:
        for key, op, value in conditions:
            cond, a = _condition(f"json_extract(meta, '$.\"{key}\"')", op, value)
            parts.append(cond)
            args += a
        sql = f"SELECT id FROM chunks WHERE {' AND '.join(parts)}"
    return [r for (r,) in con.execute(sql, args)]
