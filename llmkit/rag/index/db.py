"""The SQLite half of an index directory (chunks.sqlite): documents, parents, chunks and their
entities, each document tagged with the generation that added it and the one that removed it.

A run inserts its rows tagged with the next generation and marks removed documents with it; until
the manifest names that generation, readers ignore them, and the next run rolls back what a killed
run left (`rollback_unfinished`). After the swap, rows only generations before the previous one
needed are deleted (`drop_superseded`).

Two tables serve the writer only. A document row keeps the (size, mtime_ns, inode) of the file it
was read from, so an unchanged file is recognised without reading it (`file_stat`). `embeddings` is
the journal of vectors embedded but not yet published, keyed by model and chunk text hash and
committed per batch: a run killed while embedding keeps them and the next run reuses them
(`journal_get`); a published generation holds them in its own files, so the journal lets go of
the ones it took after each swap (`journal_drop`).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from typing import TYPE_CHECKING

from llmkit.rag.index.manifest import DB

if TYPE_CHECKING:
    import numpy as np

SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (id INTEGER PRIMARY KEY, collection TEXT NOT NULL, source TEXT NOT NULL,
    path TEXT NOT NULL, hash TEXT NOT NULL, meta TEXT NOT NULL, gen_added INTEGER NOT NULL, gen_removed INTEGER);
CREATE INDEX IF NOT EXISTS docs_path ON docs(collection, path);
CREATE INDEX IF NOT EXISTS docs_added ON docs(gen_added);
CREATE INDEX IF NOT EXISTS docs_removed ON docs(gen_removed);
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
CREATE TABLE IF NOT EXISTS embeddings (space TEXT NOT NULL, key TEXT NOT NULL, vec BLOB NOT NULL,
    PRIMARY KEY (space, key)) WITHOUT ROWID;
"""
STAT_COLUMNS = ("size", "mtime_ns", "inode")  # docs columns added after the first schema (NULL: read the file)
RACY_NS = 2_000_000_000  # a file modified this close to its stat may change again within the same mtime
LIVE = "d.gen_added <= ? AND (d.gen_removed IS NULL OR d.gen_removed > ?)"  # documents `d` of generation ?


def connect(directory: str) -> sqlite3.Connection:
    """The index's database for writing (WAL: readers keep reading while a run writes)."""
    con = sqlite3.connect(os.path.join(directory, DB), isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.executescript(SCHEMA)
    from llmkit.rag.index.catalog import ensure_meta_table

    ensure_meta_table(con)  # filters read metadata from an indexed table that triggers keep (catalog.py)
    have = {row[1] for row in con.execute("PRAGMA table_info(docs)")}
    for col in STAT_COLUMNS:
        if col not in have:  # an index written before file stats were kept: its files are read once more
            con.execute(f"ALTER TABLE docs ADD COLUMN {col} INTEGER")
    return con


def file_stat(st, now_ns: int) -> tuple | None:
    """(size, mtime_ns, inode) of an os.stat result to keep with a file's documents, or None when the
    file was modified so recently that an edit within the same mtime tick could go unseen (git's
    "racy" entries): such a file is read again next time and its content hash decides."""
    if now_ns - st.st_mtime_ns < RACY_NS:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def set_file_stat(con: sqlite3.Connection, doc_ids, stat: tuple | None) -> None:
    """Record the file stat of documents read again and found unchanged."""
    size, mtime, inode = stat or (None, None, None)
    con.executemany("UPDATE docs SET size = ?, mtime_ns = ?, inode = ? WHERE id = ?",
                    [(size, mtime, inode, d) for d in doc_ids])


def journal_get(con: sqlite3.Connection, space: str, keys: list[str]) -> dict[str, bytes]:
    """Vectors (raw float32 bytes) the journal holds for these text hashes."""
    out = {}
    for lo in range(0, len(keys), 500):  # SQLite's bound on parameters per statement
        part = keys[lo:lo + 500]
        out.update(con.execute(f"SELECT key, vec FROM embeddings WHERE space = ? AND key IN ({','.join('?' * len(part))})",
                               (space, *part)).fetchall())
    return out


def journal_keys(con: sqlite3.Connection, space: str, keys: list[str]) -> set[str]:
    """The text hashes among `keys` the journal holds a vector for."""
    out: set[str] = set()
    for lo in range(0, len(keys), 500):
        part = keys[lo:lo + 500]
        out.update(k for (k,) in con.execute(
            f"SELECT key FROM embeddings WHERE space = ? AND key IN ({','.join('?' * len(part))})", (space, *part)))
    return out


def journal_put(con: sqlite3.Connection, space: str, items) -> None:
    """Keep one batch of (text hash, float32 vector) durably (its own transaction)."""
    con.execute("BEGIN")
    con.executemany("INSERT OR REPLACE INTO embeddings (space, key, vec) VALUES (?,?,?)",
                    [(space, k, v.astype("<f4").tobytes()) for k, v in items])
    con.execute("COMMIT")


def journal_drop(con: sqlite3.Connection, space: str, keys: list[str]) -> None:
    """Forget journalled vectors once a generation holding them is published (others stay: a stopped
    run over another collection may still need them)."""
    con.execute("BEGIN")
    for lo in range(0, len(keys), 500):
        part = keys[lo:lo + 500]
        con.execute(f"DELETE FROM embeddings WHERE space = ? AND key IN ({','.join('?' * len(part))})", (space, *part))
    con.execute("COMMIT")


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


_CHUNK_ROW = ("SELECT c.id, NULL, c.text_hash, c.dup_key, NULL, c.collection, c.parent_id, c.doc_id, "
              "json_extract(c.meta, '$.line_start') IS NOT NULL OR json_extract(c.meta, '$.row_start') IS NOT NULL "
              "FROM chunks c JOIN docs d ON d.id = c.doc_id")


def live_chunks(con: sqlite3.Connection, gen: int):
    """(id, None, text_hash, dup_key, None, collection, parent_id, doc_id, a unit of its own) of
    generation `gen`'s chunks; a unit of its own: a section the reader cut itself (a code definition,
    with line numbers; table rows, with row numbers), which results rank apart from its file's others.
    The text and MinHash signature are left out (`texts_of`, `minhashes_of` read them): they are most
    of a chunk row's size."""
    return con.execute(f"{_CHUNK_ROW} WHERE {LIVE} ORDER BY c.id", (gen, gen)).fetchall()


def chunks_added(con: sqlite3.Connection, gen: int):
    """The `live_chunks` rows of the documents generation `gen` added."""
    return con.execute(f"{_CHUNK_ROW} WHERE d.gen_added = ? ORDER BY c.id", (gen,)).fetchall()


def chunk_rows(con: sqlite3.Connection, ids) -> list:
    """The `live_chunks` rows of these chunk ids, in id order."""
    out = []
    ids = sorted(int(i) for i in ids)
    for lo in range(0, len(ids), 500):
        part = ids[lo:lo + 500]
        out += con.execute(f"{_CHUNK_ROW} WHERE c.id IN ({','.join('?' * len(part))}) ORDER BY c.id", part).fetchall()
    return out


def texts_of(con: sqlite3.Connection, ids):
    """The texts of these chunk ids, in their order, read a few hundred at a time."""
    ids = [int(i) for i in ids]
    for lo in range(0, len(ids), 500):
        part = ids[lo:lo + 500]
        got = dict(con.execute(f"SELECT id, text FROM chunks WHERE id IN ({','.join('?' * len(part))})", part))
        for i in part:
            yield got[i]


def minhashes_of(con: sqlite3.Connection, ids, n_perm: int) -> np.ndarray:
    """The MinHash signatures of these chunk ids, in their order, as one (n, n_perm) uint32 array."""
    import numpy as np

    ids = [int(i) for i in ids]
    out = np.empty((len(ids), n_perm), np.uint32)
    for lo in range(0, len(ids), 500):
        part = ids[lo:lo + 500]
        got = dict(con.execute(f"SELECT id, minhash FROM chunks WHERE id IN ({','.join('?' * len(part))})", part))
        out[lo:lo + len(part)] = [np.frombuffer(got[i], np.uint32) for i in part]
    return out


def field_counts(con: sqlite3.Connection, where: str, *args) -> dict[str, int]:
    """Metadata key -> how many chunks have it, over the chunks of the documents `d` matching `where`."""
    return dict(con.execute(
        f"SELECT j.key, COUNT(*) FROM chunks c JOIN docs d ON d.id = c.doc_id, json_each(c.meta) j WHERE {where} "
        "GROUP BY j.key", args).fetchall())


def live_field_counts(con: sqlite3.Connection, gen: int) -> dict[str, int]:
    """Metadata key -> how many of generation `gen`'s chunks have it."""
    return field_counts(con, LIVE, gen, gen)


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
