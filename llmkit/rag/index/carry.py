"""The per-row arrays of a generation (rows.npy, keys.npy, collection.npy, parent.npy, unitkey.npy)
and its metadata field counts (live.json), carried from the previous generation when a run changed
a few documents: its rows less the chunks of documents the run removed, plus those of the documents
it added, so a small update reads from SQLite only the chunks that changed, not every live one.

This holds where the previous generation's rows are every live chunk, or every one deduplication
kept with the same setting (`complete` and `dedupe` in live.json; not a subset kept by a model
switch): then `dupes.update` says which chunks are no longer kept and which are now. Otherwise the
rows are read whole (`of_tuples`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from llmkit.io import atomic_write_text
from llmkit.rag.index import db

LIVE = "live.json"
OWN = np.int64(1) << 62  # unit key of a chunk that is a unit of its own: this bit, then its parent id


@dataclass
class Rows:
    """The rows of a generation, in chunk id order."""

    ids: np.ndarray  # chunk ids (int64, ascending)
    keys: np.ndarray  # text hashes (S32): a vector is reused by them
    coll: np.ndarray  # collection codes (int32) into `collections`
    collections: list[str]  # sorted
    parent: np.ndarray  # parent ids (int64)
    unit_key: np.ndarray  # the unit a hit stands for: OWN | parent id (a code definition, table rows), else the doc id
    fields: dict  # metadata key -> live chunks that have it (deduplicated ones included)

    def __len__(self) -> int:
        return len(self.ids)

    def chunk_counts(self) -> dict[str, int]:
        counts = np.bincount(self.coll, minlength=len(self.collections))
        return {c: int(n) for c, n in zip(self.collections, counts)}


def _unit_keys(parent, doc, own) -> np.ndarray:
    parent, doc = np.asarray(parent, np.int64), np.asarray(doc, np.int64)
    return np.where(np.asarray(own, bool), OWN | parent, doc)


def of_tuples(rows: list, fields: dict) -> Rows:
    """Rows of `db.live_chunks` tuples (id, _, text_hash, dup_key, _, collection, parent, doc, own)."""
    collections = sorted({r[5] for r in rows})
    code = {c: i for i, c in enumerate(collections)}
    return Rows(np.array([r[0] for r in rows], np.int64), np.array([r[2] for r in rows], dtype="S32"),
                np.array([code[r[5]] for r in rows], np.int32), collections,
                np.array([r[6] for r in rows], np.int64),
                _unit_keys([r[6] for r in rows], [r[7] for r in rows], [bool(r[8]) for r in rows]), fields)


def write(gdir: str, rows: Rows, complete: bool, dedupe: float | None) -> None:
    """Write the per-row arrays and live.json (`complete`: the rows are every live chunk, or every
    one deduplication with threshold `dedupe` kept)."""
    for name, arr in (("rows", rows.ids), ("keys", rows.keys), ("collection", rows.coll),
                      ("parent", rows.parent), ("unitkey", rows.unit_key)):
        np.save(os.path.join(gdir, f"{name}.npy"), arr)
    atomic_write_text(os.path.join(gdir, LIVE), json.dumps(
        {"format": "llmkit-live", "version": 1, "complete": complete, "dedupe": dedupe, "collections": rows.collections,
         "fields": rows.fields}))


def carried(directory: str, con, manifest: dict, gen: int, gdir: str, dedupe: float | None, report) -> Rows | None:
    """Generation `gen`'s rows (in `gdir`) from the previous generation's and the documents this run
    added and removed, deduplicated with threshold `dedupe` (None: off), or None where the previous
    rows do not allow it (read them whole then)."""
    prev = os.path.join(directory, f"gen-{manifest['generation']}")
    if gen != manifest["generation"] + 1:
        return None
    try:
        with open(os.path.join(prev, LIVE), encoding="utf-8") as f:
            state = json.load(f)
        if state.get("version") != 1 or not state.get("complete") or state.get("dedupe") != dedupe:
            return None
        old = {name: np.load(os.path.join(prev, f"{name}.npy"))
               for name in ("rows", "keys", "collection", "parent", "unitkey")}
    except (OSError, ValueError):
        return None
    if dedupe is None:
        gone = np.array([i for (i,) in con.execute(
            "SELECT c.id FROM chunks c JOIN docs d ON d.id = c.doc_id WHERE d.gen_removed = ?", (gen,))], np.int64)
        new = db.chunks_added(con, gen)
    else:
        from llmkit.rag.index import dupes

        got = dupes.update(prev, gdir, con, gen, dedupe, old["rows"])
        if got is None:
            return None
        gone, take, report.exact_duplicates, report.near_duplicates = got
        new = db.chunk_rows(con, take)
    keep = np.ones(len(old["rows"]), bool)
    if len(gone):
        at = np.minimum(np.searchsorted(old["rows"], gone), len(keep) - 1)
        keep[at[old["rows"][at] == gone]] = False
    collections = sorted(set(state["collections"]) | {r[5] for r in new})
    code = {c: i for i, c in enumerate(collections)}
    remap = np.array([code[c] for c in state["collections"]], np.int32)
    ids = np.concatenate([old["rows"][keep], np.array([r[0] for r in new], np.int64)])
    coll = np.concatenate([remap[old["collection"][keep]] if len(remap) else np.zeros(0, np.int32),
                           np.array([code[r[5]] for r in new], np.int32)])
    rows = Rows(ids, np.concatenate([old["keys"][keep], np.array([r[2] for r in new], dtype="S32")]), coll,
                collections, np.concatenate([old["parent"][keep], np.array([r[6] for r in new], np.int64)]),
                np.concatenate([old["unitkey"][keep], _unit_keys([r[6] for r in new], [r[7] for r in new],
                                                                  [bool(r[8]) for r in new])]), {})
    if len(ids) > 1 and (np.diff(ids) <= 0).any():  # new chunk ids are above the old ones, but never assume it
        order = np.argsort(ids, kind="stable")
        for name in ("ids", "keys", "coll", "parent", "unit_key"):
            setattr(rows, name, getattr(rows, name)[order])
    fields = dict(state["fields"])
    for key, n in db.field_counts(con, "d.gen_removed = ?", gen).items():
        fields[key] = fields.get(key, 0) - n
    for key, n in db.field_counts(con, "d.gen_added = ?", gen).items():
        fields[key] = fields.get(key, 0) + n
    rows.fields = {k: n for k, n in fields.items() if n > 0}
    _drop_empty_collections(rows)
    return rows


def _drop_empty_collections(rows: Rows) -> None:
    """Renumber the collection codes without the collections no row has any more (sorted, as a full read)."""
    counts = np.bincount(rows.coll, minlength=len(rows.collections))
    if (counts > 0).all():
        return
    renum = (np.cumsum(counts > 0) - 1).astype(np.int32)
    rows.coll = renum[rows.coll]
    rows.collections = [c for c, n in zip(rows.collections, counts) if n > 0]


def units(gdir: str, rows: Rows) -> None:
    """Write unit.npy (each row's document or code definition) and lead.npy (each unit's first row)."""
    from llmkit.rag.index.reader import unit_leads

    _, unit = np.unique(rows.unit_key, return_inverse=True)
    unit = unit.reshape(-1).astype(np.int64)
    np.save(os.path.join(gdir, "unit.npy"), unit)
    np.save(os.path.join(gdir, "lead.npy"), unit_leads(unit))  # read mapped by queries
