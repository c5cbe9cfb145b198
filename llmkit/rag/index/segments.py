"""Publishing a small update as segments, in proportion to the change (`segmented.py` reads them).

The base is the last full build's BM25 postings and vectors (faiss index included): a new
generation hard-links them and writes only small files. Base rows whose chunk is gone (removed,
changed, or now a duplicate) are dead, and stay dead; rows the base does not hold form the delta:
its BM25 postings are the previous delta's alive ones merged with those of the new chunks (only
new text is tokenized), its vectors the previous generation's where the text is the same, else the
journal's or embedded now. The per-row arrays of the generation (rows.npy, keys.npy, ...) are
written whole as before, so everything outside BM25 and the vector search sees plain rows.

Scores stay exactly a full build's: N, the mean length, each term's document frequency (the base's
over its alive rows, carried from the previous generation less the terms of the rows that died
since, plus the delta's) and the idf with rank-bm25's epsilon rule over the merged vocabulary are
computed here over arrays; only the new and the newly dead rows' texts are tokenized.

When the delta or the dead rows pass DELTA_FRACTION of the base (at least DELTA_MIN rows), or the
vector options change (the index type asked or chosen by size, a vector dtype asked), or the previous generation is not a plain base (vectors pending, an older
BM25 format), publishing is the full build (`plan` returns None): that compaction makes the next base.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass

import numpy as np

from llmkit.io import atomic_write_text
from llmkit.rag.index import db
from llmkit.rag.index.bm25 import BM25Index
from llmkit.rag.index.embedding import embed_missing, journalled
from llmkit.rag.index.segmented import SEGMENTS, is_segmented, open_vectors
from llmkit.rag.index.vectors import index_kind

DELTA_FRACTION = 0.1  # compact (a full build) when the delta or the dead rows pass this share of the base
DELTA_MIN = 1000  # ... or this many rows, whichever is larger: a small index keeps its base a while
RECOUNT_ROWS = 10_000  # count the alive postings again when more base rows died than postings / this
POSTINGS = ("terms", "term_offsets", "indptr", "docs", "tfs", "doc_len")  # what the base's BM25 shares


def link(src: str, dst: str) -> None:
    """Hard-link a file of an immutable generation into a new one (a copy where links fail)."""
    import shutil

    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@dataclass
class Segments:
    """How generation `gdir` is published from the previous one, `prev`, as base + delta."""

    prev: str  # the previous generation's directory
    gdir: str
    src: str  # the directory holding the base's bm25/, vectors.npy, faiss.index
    base_ids: np.ndarray  # chunk ids of the base's rows
    base_rows: np.ndarray  # base row -> row of the new generation (-1: dead)
    delta_rows: np.ndarray  # rows of the new generation the delta holds
    ids: np.ndarray  # the new generation's chunk ids

    def summary(self) -> dict:
        return {"base_rows": len(self.base_ids), "dead": int((self.base_rows < 0).sum()),
                "delta_rows": len(self.delta_rows)}


def plan(directory: str, manifest: dict, gdir: str, ids: np.ndarray, opts) -> Segments | None:
    """The segments generation `gdir` (chunk ids `ids`, ascending) is published as, or None for a
    full build (module doc)."""
    prev = os.path.join(directory, f"gen-{manifest['generation']}")
    st = opts.store
    if (manifest["generation"] == 0 or not len(ids) or os.path.exists(os.path.join(prev, "embedded.npy"))
            or index_kind(st.index_type, len(ids), st.hnsw_above) != manifest["index"] or st.vector_dtype):
        return None
    segmented = is_segmented(prev)
    src = os.path.join(prev, "base") if segmented else prev
    try:
        with open(os.path.join(src, "bm25", "params.json"), encoding="utf-8") as f:
            if json.load(f).get("version") != 2:
                return None
        base_ids = np.load(os.path.join(src, "ids.npy" if segmented else "rows.npy"))
        alive = np.load(os.path.join(prev, "base", "row_of.npy")) >= 0 if segmented else np.ones(len(base_ids), bool)
    except (OSError, ValueError):
        return None
    if not manifest["store"] and not os.path.exists(os.path.join(src, "vectors.npy")):
        return None
    alive &= np.isin(base_ids, ids, assume_unique=True)
    delta_rows = np.flatnonzero(~np.isin(ids, base_ids[alive], assume_unique=True))
    limit = max(DELTA_MIN, DELTA_FRACTION * len(base_ids))
    if len(delta_rows) > limit or (~alive).sum() > limit:
        return None
    base_rows = np.full(len(base_ids), -1, np.int64)
    base_rows[alive] = np.searchsorted(ids, base_ids[alive])
    return Segments(prev, gdir, src, base_ids, base_rows, delta_rows, ids)


def publish_bm25(seg: Segments, con, manifest) -> None:
    """Write the generation's BM25 as the base's postings (linked) and a delta, with global statistics."""
    base_dir, delta_dir = os.path.join(seg.gdir, "base"), os.path.join(seg.gdir, "delta")
    os.makedirs(os.path.join(base_dir, "bm25"))
    for name in POSTINGS:
        link(os.path.join(seg.src, "bm25", f"{name}.npy"), os.path.join(base_dir, "bm25", f"{name}.npy"))
    if is_segmented(seg.prev):
        link(os.path.join(seg.src, "ids.npy"), os.path.join(base_dir, "ids.npy"))
    else:
        np.save(os.path.join(base_dir, "ids.npy"), seg.base_ids)
    np.save(os.path.join(base_dir, "row_of.npy"), seg.base_rows)
    base = BM25Index.load(os.path.join(seg.src, "bm25"))
    terms, indptr, docs, tfs, doc_len, base_term = _delta_postings(seg, con, manifest, base)
    # document frequencies over the generation: the base's alive postings, plus the delta's
    alive = seg.base_rows >= 0
    df = _alive_df(seg, con, manifest, base)
    np.save(os.path.join(base_dir, "alive_df.npy"), df.astype(np.int32))
    delta_df = np.diff(indptr)
    shared = base_term >= 0
    df[base_term[shared]] += delta_df[shared]
    delta_df[shared] = df[base_term[shared]]
    lengths = np.empty(len(seg.ids), np.int32)  # in row order, as a full build averages them
    lengths[seg.base_rows[alive]] = base.doc_len[alive]
    lengths[seg.delta_rows] = doc_len
    avgdl = float(np.asarray(lengths, np.float64).mean())
    n = len(seg.ids)
    idf_base = np.log(n - df + 0.5) - np.log(df + 0.5)
    idf_delta = np.log(n - delta_df + 0.5) - np.log(delta_df + 0.5)
    # rank-bm25's epsilon: the mean idf over the terms some row of the generation has
    vocab = int((df > 0).sum() + (~shared).sum())
    eps = base.epsilon * ((idf_base[df > 0].sum() + idf_delta[~shared].sum()) / vocab) if vocab else 0.0
    idf_base, idf_delta = np.where(idf_base < 0, eps, idf_base), np.where(idf_delta < 0, eps, idf_delta)
    np.save(os.path.join(base_dir, "bm25", "idf.npy"), idf_base)
    np.save(os.path.join(base_dir, "bm25", "df.npy"), df.astype(np.int32))
    atomic_write_text(os.path.join(base_dir, "bm25", "params.json"), json.dumps(
        {"format": "llmkit-bm25", "version": 2, "k1": base.k1, "b": base.b, "epsilon": base.epsilon, "avgdl": avgdl,
         "terms": len(df), "docs": len(seg.base_ids)}))
    if len(seg.delta_rows):
        os.makedirs(delta_dir, exist_ok=True)
        BM25Index({t: i for i, t in enumerate(terms)}, indptr, docs, tfs, doc_len, idf_delta, base.k1, base.b,
                  base.epsilon, avgdl).save(os.path.join(delta_dir, "bm25"))
        np.save(os.path.join(delta_dir, "bm25", "base_term.npy"), base_term)
        np.save(os.path.join(delta_dir, "row_of.npy"), seg.delta_rows)
    atomic_write_text(os.path.join(seg.gdir, SEGMENTS), json.dumps(
        {"format": "llmkit-segments", "version": 1, **seg.summary()}))


def _alive_df(seg: Segments, con, manifest, base: BM25Index) -> np.ndarray:
    """Each base term's document frequency over the base's alive rows: the previous generation's,
    less the terms of the rows that died since (their texts tokenized again: a few rows), or the
    alive postings counted where many rows died."""
    from llmkit.rag.index.analysis import doc_terms

    alive = seg.base_rows >= 0
    try:
        if is_segmented(seg.prev):
            was = np.load(os.path.join(seg.prev, "base", "row_of.npy")) >= 0
            df = np.load(os.path.join(seg.prev, "base", "alive_df.npy")).astype(np.int64)
        else:
            was, df = np.ones(len(alive), bool), np.diff(np.asarray(base.indptr)).astype(np.int64)
    except OSError:
        was = None
    died = np.flatnonzero(was & ~alive) if was is not None else None
    if died is None or len(died) * RECOUNT_ROWS > len(base.docs):
        df = np.zeros(len(base.indptr) - 1, np.int64)
        if len(df):
            df[:] = np.add.reduceat(alive.astype(np.int32)[base.docs], np.asarray(base.indptr[:-1]))
        return df
    how, idents = manifest["analysis"], manifest["bm25_idents"]
    gone = [base.vocab.get(t) for text in db.texts_of(con, seg.base_ids[died]) for t in set(doc_terms(text, how, idents))]
    np.subtract.at(df, np.array(gone, np.int64), 1)
    return df


def _delta_postings(seg: Segments, con, manifest, base: BM25Index):
    """(terms, indptr, docs, tfs, doc_len, base term id of each term or -1) of the delta rows: the
    previous delta's postings of rows still in it, merged with the new rows' (tokenized now)."""
    from llmkit.rag.index.analysis import doc_terms

    delta_ids = seg.ids[seg.delta_rows]
    old_terms: list[str] = []
    old_base = np.zeros(0, np.int64)
    parts = []  # (term ids into old_terms or new_terms, doc, tf) per source
    lengths = np.zeros(len(delta_ids), np.int32)
    fresh = np.ones(len(delta_ids), bool)
    path = os.path.join(seg.prev, "delta", "bm25")
    if os.path.isdir(path):
        old = BM25Index.load(path, mmap=False)
        old_ids = np.load(os.path.join(seg.prev, "rows.npy"), mmap_mode="r")[np.load(os.path.join(seg.prev, "delta", "row_of.npy"))]
        keep = np.isin(old_ids, delta_ids, assume_unique=True)
        doc_of = np.full(len(old_ids), -1, np.int64)
        doc_of[keep] = np.searchsorted(delta_ids, old_ids[keep])
        fresh[doc_of[keep]] = False
        lengths[doc_of[keep]] = old.doc_len[keep]
        term_of = np.repeat(np.arange(len(old.indptr) - 1), np.diff(old.indptr))
        mask = keep[old.docs]
        parts.append((term_of[mask], doc_of[old.docs[mask]], old.tfs[mask]))
        old_terms = [old.vocab.term(i) for i in range(len(old.vocab))]
        old_base = np.load(os.path.join(path, "base_term.npy"))
    new_terms: dict[str, int] = {}
    t_new, d_new, f_new = [], [], []
    new_docs = np.flatnonzero(fresh)
    how, idents = manifest["analysis"], manifest["bm25_idents"]
    for d, text in zip(new_docs.tolist(), db.texts_of(con, delta_ids[new_docs])):
        toks = doc_terms(text, how, idents)
        lengths[d] = len(toks)
        for term, tf in Counter(toks).items():
            t_new.append(new_terms.setdefault(term, len(new_terms)))
            d_new.append(d)
            f_new.append(tf)
    terms = sorted(set(old_terms) | set(new_terms))  # byte order: the stored term table's
    at = {t: i for i, t in enumerate(terms)}
    old_map = np.array([at[t] for t in old_terms], np.int64)
    new_map = np.array([at[t] for t in new_terms], np.int64)
    t_all = np.concatenate([old_map[p[0]] for p in parts] + [new_map[np.array(t_new, np.int64)]]) if terms else np.zeros(0, np.int64)
    d_all = np.concatenate([p[1] for p in parts] + [np.array(d_new, np.int64)]).astype(np.int32)
    f_all = np.concatenate([p[2] for p in parts] + [np.array(f_new, np.int32)]).astype(np.int32)
    counts = np.bincount(t_all, minlength=len(terms))
    used = counts > 0  # a term only rows gone from the delta had is dropped
    renum = np.cumsum(used) - 1
    t_all = renum[t_all]
    order = np.lexsort((d_all, t_all))  # by term, rows ascending within a term
    indptr = np.concatenate([[0], np.cumsum(counts[used])]).astype(np.int64)
    terms = [t for t, u in zip(terms, used) if u]
    carried = dict(zip(old_terms, old_base.tolist()))
    base_term = np.array([carried[t] if t in carried else base.vocab.get(t, -1) for t in terms], np.int64)
    return terms, indptr, d_all[order], f_all[order], lengths, base_term


def publish_vectors(seg: Segments, con, manifest, opts, keys: np.ndarray, report, progress) -> int:
    """Link the base's vectors (and faiss index) and write the delta's: the previous generation's
    vector of the same text where it held one, else the journal's or embedded now; their dimension."""
    base_dir = os.path.join(seg.gdir, "base")
    os.makedirs(base_dir, exist_ok=True)
    for name in ("vectors.npy", "faiss.index"):
        if os.path.exists(os.path.join(seg.src, name)):
            link(os.path.join(seg.src, name), os.path.join(base_dir, name))
    base = np.load(os.path.join(base_dir, "vectors.npy"), mmap_mode="r")
    dim = manifest["dim"] or base.shape[1]
    report.index_type = manifest["index"] or "flat"
    report.vectors_reused = len(seg.ids)
    if not len(seg.delta_rows):
        return dim
    os.makedirs(os.path.join(seg.gdir, "delta"), exist_ok=True)
    # texts the previous generation held outside its alive base: its delta and the rows gone now
    prev_ids = np.load(os.path.join(seg.prev, "rows.npy"))
    cand = np.flatnonzero(~np.isin(prev_ids, seg.ids, assume_unique=True))
    old_delta = os.path.join(seg.prev, "delta", "row_of.npy")
    if os.path.exists(old_delta):
        cand = np.union1d(cand, np.load(old_delta))
    prev_keys = np.load(os.path.join(seg.prev, "keys.npy"), mmap_mode="r")
    held = dict(zip(np.asarray(prev_keys[cand]).tolist(), cand.tolist()))
    want = keys[seg.delta_rows].tolist()
    have = [i for i, k in enumerate(want) if k in held]
    need = [i for i, k in enumerate(want) if k not in held]
    out = np.lib.format.open_memmap(os.path.join(seg.gdir, "delta", "vectors.npy") + ".tmp.npy", "w+", base.dtype,
                                    (len(want), dim))
    if have:
        store = open_vectors(seg.prev, len(prev_ids), manifest["index"])
        out[have] = store.of_rows(np.array([held[want[i]] for i in have], np.int64))
    if need:
        dim = embed_missing(con, manifest, opts, [(want[i].decode(), int(seg.ids[seg.delta_rows[i]])) for i in need],
                            dim, report, progress) or dim
        out[need] = journalled(con, manifest, [want[i].decode() for i in need], dim, report)
    out.flush()
    del out
    os.replace(os.path.join(seg.gdir, "delta", "vectors.npy") + ".tmp.npy", os.path.join(seg.gdir, "delta", "vectors.npy"))
    report.vectors_reused = len(seg.ids) - report.embedded
    return dim
