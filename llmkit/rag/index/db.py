"""The SQLite half of an index directory (chunks.sqlite): documents, parents, chunks and their
entities, each document tagged with the generation that added it and the one that removed it.

A run inserts its rows tagged with the next generation and marks removed documents with it; until
the manifest names that generation, readers ignore them, and the next run rolls back what a killed
run left (`rollback_unfinished`). After the swap, rows only generations before the previous one
needed are deleted (`drop_superseded`).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3

from llmkit.rag.index.manifest import DB

SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (id INTEGER PRIMARY KEY, collection TEXT NOT NULL, source TEXT NOT NULL,
    path TEXT NOT NULL, hash TEXT NOT NULL, meta TEXT NOT NULL, gen_added INTEGER NOT NULL, gen_removed INTEGER);
CREATE INDEX IF NOT EXISTS docs_path ON docs(collection, path);
CREATE TABLE IF NOT EXISTS parents (id INTEGER PRIMARY KEY, doc_id INTEGER NOT NULL, text TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS parents_doc ON parents(doc_id);
CREATE TABLE IF NOT EXISTS chunks (id INTEGER PRIMARY KEY, doc_id INTEGER NOT NULL, parent_id INTEGER NOT NULL,
    collection TEXT NOT NULL, text TEXT NOT NULL, text_hash TEXT NOT NULL, dup_key TEXT NOT NULL,
    minhash BLOB NOT NULL, meta TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_doc ON chunks(doc_id);
CREATE TABLE IF NOT EXISTS chunk_entities (chunk_id INTEGER NOT NULL, entity TEXT NOT NULL, tf INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS chunk_entities_chunk ON chunk_entities(chunk_id);
CREATE TRIGGER IF NOT EXISTS chunks_gone AFTER DELETE ON chunks BEGIN
    DELETE FROM chunk_entities WHERE chunk_id = OLD.id; END;
"""
LIVE = "d.gen_added <= ? AND (d.gen_removed IS NULL OR d.gen_removed > ?)"  # documents `d` of generation ?


def connect(directory: str) -> sqlite3.Connection:
    """The index's database for writing (WAL: readers keep reading while a run writes)."""
    con = sqlite3.connect(os.path.join(directory, DB), isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.executescript(SCHEMA)
    return con


def rollback_unfinished(con: sqlite3.Connection, gen: int) -> None:
    """Undo what a run killed before its manifest swap left behind (rows of later generations)."""
    con.execute("BEGIN")
    doomed = "SELECT id FROM docs WHERE gen_added > ?"
    con.execute(f"DELETE FROM chunks WHERE doc_id IN ({doomed})", (gen,))
    con.execute(f"DELETE FROM parents WHERE doc_id IN ({doomed})", (gen,))
    con.execute("DELETE FROM docs WHERE gen_added > ?", (gen,))
    con.execute("UPDATE docs SET gen_removed = NULL WHERE gen_removed > ?", (gen,))
    con.execute("COMMIT")


def drop_superseded(con: sqlite3.Connection, gen: int) -> None:
    """Generation `gen` is live: delete documents removed before it (generation gen-1 keeps its rows
    for readers that opened it just before the swap; readers take no lock)."""
    con.execute("BEGIN")
    doomed = "SELECT id FROM docs WHERE gen_removed IS NOT NULL AND gen_removed < ?"
    con.execute(f"DELETE FROM chunks WHERE doc_id IN ({doomed})", (gen,))
    con.execute(f"DELETE FROM parents WHERE doc_id IN ({doomed})", (gen,))
    con.execute("DELETE FROM docs WHERE gen_removed IS NOT NULL AND gen_removed < ?", (gen,))
    con.execute("COMMIT")


def live_chunks(con: sqlite3.Connection, gen: int):
    """(id, text, text_hash, dup_key, minhash, collection, parent_id, doc_id, a unit of its own) of
    generation `gen`'s chunks; a unit of its own: a section the reader cut itself (a code definition,
    with line numbers; table rows, with row numbers), which results rank apart from its file's others."""
    return con.execute(
        "SELECT c.id, c.text, c.text_hash, c.dup_key, c.minhash, c.collection, c.parent_id, c.doc_id, "
        "json_extract(c.meta, '$.line_start') IS NOT NULL OR json_extract(c.meta, '$.row_start') IS NOT NULL "
        "FROM chunks c "
        f"JOIN docs d ON d.id = c.doc_id WHERE {LIVE} ORDER BY c.id", (gen, gen)).fetchall()


def live_fields(con: sqlite3.Connection, gen: int) -> list[str]:
    """The metadata keys of generation `gen`'s chunks, sorted."""
    return sorted({k for (k,) in con.execute(
        f"SELECT DISTINCT j.key FROM chunks c JOIN docs d ON d.id = c.doc_id, json_each(c.meta) j WHERE {LIVE}",
        (gen, gen))})


def live_doc_counts(con: sqlite3.Connection, gen: int) -> dict[str, int]:
    """Documents per collection in generation `gen`."""
    return {c: n for c, n in con.execute(
        "SELECT collection, COUNT(*) FROM docs WHERE gen_added <= ? AND (gen_removed IS NULL OR gen_removed > ?) "
        "GROUP BY collection", (gen, gen))}


def text_hash(text: str) -> str:
    """The key under which a chunk's vector is reused (same text, same vector)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def add_entities(con: sqlite3.Connection, chunks, llm=None) -> None:
    """Store the entities of (chunk id, text) pairs (the graph's raw material, kept per chunk so
    updates only extract new text)."""
    from llmkit.rag.index.graph import entities, llm_entities

    rows = []
    for cid, text in chunks:
        found = entities(text)
        if llm is not None:
            found.update(llm_entities(llm, text))
        rows.extend((cid, e, n) for e, n in found.items())
    con.executemany("INSERT INTO chunk_entities (chunk_id, entity, tf) VALUES (?,?,?)", rows)
