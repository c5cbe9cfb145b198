"""Publishing one searchable generation of an index: the live chunks are deduplicated, their vectors
reused (same text) or embedded, written to the vector store (faiss files in gen-N/, or a served
Milvus collection), BM25 and the entity graph are built, and only then is the manifest swapped.
Afterwards the rows, store rows and directories only older generations needed are dropped: generation
N-1 is kept for readers that opened it just before the swap, and any older one a reader still pins
(`manifest.pin_generation`) waits for a later run."""

from __future__ import annotations

import os
import re
import shutil

import numpy as np

from llmkit.errors import BadInput
from llmkit.rag.chunk import dedupe
from llmkit.rag.index import carry, db, segments
from llmkit.rag.index.embedding import (embed_missing, journal_dim, journal_space, journalled,
                                        load_index_embedder)
from llmkit.rag.index.manifest import now, try_retire, write_manifest
from llmkit.rag.index.segmented import open_vectors, vectors_dir
from llmkit.rag.index.segments import link
from llmkit.rag.index.vectors import index_kind, vector_dtype, write_vectors


def publish(directory, con, manifest, gen, opts, report, progress, keep_ids: set | None = None,
            searchable_first: bool = False, same_as: str | None = None) -> None:
    """Build gen-N (dedupe, embed new text, BM25, vectors), then swap the manifest. `keep_ids`: exactly
    these chunks, no dedupe, every vector computed again (a model switch). `searchable_first`: embed
    nothing; a chunk whose text has no vector yet gets a zero one and False in embedded.npy, the
    manifest counts them as `pending`, and the next generation brings their vectors. `same_as`: the
    directory of the searchable-first generation this run just published over the same rows: its
    deduplication and BM25 files are taken over (hard links) instead of being computed again."""
    manifest.pop("pending", None)  # chunks without a vector: set again below if this generation has some
    gdir = os.path.join(directory, f"gen-{gen}")
    shutil.rmtree(gdir, ignore_errors=True)  # a half-built directory of a killed run
    os.makedirs(gdir)
    threshold = opts.chunk.near_threshold if opts.chunk.dedupe else None
    rows = None  # a small update: the previous generation's rows, changed (carry.py, dupes.py)
    if keep_ids is None and same_as is None and not searchable_first:
        rows = carry.carried(directory, con, manifest, gen, gdir, threshold, report)
    if rows is None:
        shutil.rmtree(os.path.join(gdir, "dupes"), ignore_errors=True)  # a carry that gave up part-way
        rows = _rows_to_publish(con, gen, gdir, opts, report, keep_ids, same_as)
    report.chunks_indexed = len(rows)
    carry.write(gdir, rows, complete=keep_ids is None, dedupe=threshold)
    ids, keys = rows.ids, rows.keys
    seg = None  # a small update: the previous base's BM25 and vectors plus a delta (segments.py)
    if len(rows) and keep_ids is None and same_as is None and not searchable_first:
        seg = segments.plan(directory, manifest, gdir, ids, opts)
    report.segments = seg.summary() if seg is not None else {}
    if len(rows):
        if manifest["store"]:
            dim = _publish_remote(directory, con, manifest, gen, opts, rows, ids, keys, report, progress,
                                  switch=keep_ids is not None)
        elif seg is not None:
            dim = segments.publish_vectors(seg, con, manifest, opts, keys, report, progress)
        else:
            dim = _publish_local(directory, con, manifest, gdir, opts, rows, keys, report, progress,
                                 reuse=keep_ids is None, embed=not searchable_first)
        if seg is not None:
            if progress:
                progress("BM25", 0, 1)
            segments.publish_bm25(seg, con, manifest)
        else:
            _publish_bm25(con, manifest, gdir, rows, same_as, progress)
        if manifest["ranking"] == "documents":
            carry.units(gdir, rows)
        manifest["dim"] = dim
        if manifest["graph"]:
            if progress:
                progress("entity graph", 0, 1)
            from llmkit.rag.index.graph import entity_llm

            _publish_graph(con, rows, gdir, report, entity_llm(opts.store.graph_llm))
    _swap(directory, con, manifest, gen, opts, report, rows, update_collection=keep_ids is None)
    db.journal_drop(con, journal_space(manifest), report.journalled)  # the generation holds these vectors now
    _retire_old(directory, con, manifest, gen)


def _rows_to_publish(con, gen, gdir, opts, report, keep_ids: set | None, same_as: str | None) -> carry.Rows:
    """The live chunk rows generation `gen` holds: `keep_ids` only, the rows of `same_as`, or deduplicated."""
    rows = db.live_chunks(con, gen)
    fields = db.live_field_counts(con, gen)
    if keep_ids is not None:
        rows = [r for r in rows if r[0] in keep_ids]
    if same_as is not None:
        kept = set(np.load(os.path.join(same_as, "rows.npy")).tolist())
        rows = [r for r in rows if r[0] in kept]
        if os.path.isdir(os.path.join(same_as, "dupes")):  # the same chunks: its deduplication state holds
            shutil.copytree(os.path.join(same_as, "dupes"), os.path.join(gdir, "dupes"), copy_function=link)
    elif opts.chunk.dedupe and rows and keep_ids is None:
        rows = _dedupe(con, rows, gdir, opts.chunk, report)
    return carry.of_tuples(rows, fields)


def _publish_local(directory, con, manifest, gdir, opts, rows, keys, report, progress, reuse: bool,
                   embed: bool) -> int:
    """Write the generation's vectors.npy and its faiss index in gdir; their dimension."""
    dim, pending = _vectors(directory, con, manifest, opts, rows, keys, os.path.join(gdir, "vectors.npy"), report,
                            progress, reuse=reuse, embed=embed)
    if pending:
        manifest["pending"] = pending
    # exact search until the vectors are complete: no graph is built twice
    kind = "flat" if pending else index_kind(opts.store.index_type, len(rows), opts.store.hnsw_above)
    dtype = vector_dtype(opts.store.vector_dtype, vectors_dir(os.path.join(directory, f"gen-{manifest['generation']}")))
    report.index_type = write_vectors(gdir, kind, dtype)
    return dim


def _publish_bm25(con, manifest, gdir, rows, same_as: str | None, progress) -> None:
    """Write the generation's BM25 index: hard links to `same_as`'s where it has one, else built from the texts."""
    from llmkit.rag.index.analysis import doc_terms
    from llmkit.rag.index.bm25 import BM25Index

    if progress:
        progress("BM25", 0, 1)
    how, idents = manifest["analysis"], manifest["bm25_idents"]
    if same_as is not None and os.path.isdir(os.path.join(same_as, "bm25")):
        shutil.copytree(os.path.join(same_as, "bm25"), os.path.join(gdir, "bm25"), copy_function=link)
    else:
        texts = db.texts_of(con, rows.ids)  # streamed: BM25 keeps postings, not texts
        BM25Index.build(doc_terms(t, how, idents) for t in texts).save(os.path.join(gdir, "bm25"))


def republish(directory, con, manifest, gen, report) -> None:
    """Publish generation `gen` as the live one again (a run that changed nothing): its files are
    hard-linked, not rebuilt, and rows.npy is copied, since a reader pins a generation by locking that
    file; then the manifest is swapped and older generations are retired as after any run."""
    from llmkit.rag.index.manifest import RETIRED

    old, new = (os.path.join(directory, f"gen-{g}") for g in (manifest["generation"], gen))
    shutil.rmtree(new, ignore_errors=True)  # a half-built directory of a killed run
    shutil.copytree(old, new, copy_function=link, ignore=shutil.ignore_patterns(RETIRED))
    os.remove(os.path.join(new, "rows.npy"))
    shutil.copy2(os.path.join(old, "rows.npy"), os.path.join(new, "rows.npy"))
    manifest.update(generation=gen, updated=now())
    write_manifest(directory, manifest)
    report.generation, report.index_type = gen, manifest["index"] or ""
    report.chunks_indexed = sum(c.get("chunks", 0) for c in manifest["collections"].values())
    _retire_old(directory, con, manifest, gen)


def _retire_old(directory, con, manifest, gen) -> None:
    """Generation `gen` is live: retire the generations before gen-1 that no reader pins, then delete
    what only they needed (store rows, SQLite rows, their directories, a replaced model's collection)."""
    kept, retired = {gen, gen - 1}, []
    for name in sorted(os.listdir(directory)):
        m = re.fullmatch(r"gen-(\d+)", name)
        if not m or int(m.group(1)) in kept or int(m.group(1)) > gen:
            continue
        g = int(m.group(1))
        if try_retire(os.path.join(directory, name)):
            retired.append(g)
        else:
            kept.add(g)
    oldest = min(kept)
    spec = manifest["store"]
    if spec and spec.get("collection") and not _delete_remote(directory, manifest, retired, kept, oldest):
        oldest = min(kept | set(retired))  # the store refused: keep their rows and directories for the next run
        retired = []
    db.drop_superseded(con, oldest + 1)
    for g in retired:
        shutil.rmtree(os.path.join(directory, f"gen-{g}"), ignore_errors=True)


def _delete_remote(directory, manifest, retired, kept, oldest) -> bool:
    """Delete from the served store the rows only retired generations had, and drop a replaced
    model's collection no kept generation reads; False if the store refused (the next run tries again)."""
    from llmkit.rag.index.milvus import open_store

    spec = manifest["store"]
    keep = [_generation_rows(directory, g)[0] for g in kept]
    gone = np.setdiff1d(np.concatenate([np.zeros(0, np.int64)] + [_generation_rows(directory, g)[0] for g in retired]),
                        np.concatenate([np.zeros(0, np.int64)] + keep))
    replaced = spec.get("replaced", [])
    drops = [name for name, last in replaced if last < oldest]
    if not len(gone) and not drops:
        return True
    try:
        st = open_store(spec, directory)
        try:
            if len(gone):
                st.delete(spec["collection"], gone)
            for name in drops:
                st.drop(name)
        finally:
            st.close()
    except BadInput:
        return False  # the swap is done; queries never see leftover rows (gen and id filters)
    if drops:
        manifest["store"] = {**spec, "replaced": [r for r in replaced if r[0] not in drops]}
        write_manifest(directory, manifest)
    return True


def _dedupe(con, rows, gdir, chunk, report):
    """The rows without exact duplicates (same dup key) and near-duplicates (MinHash) of earlier ones;
    every row's key and signature are kept in gdir for the next small update (dupes.py)."""
    from llmkit.rag.index import dupes

    keep = np.ones(len(rows), bool)
    first: dict[str, int] = {}
    for i, r in enumerate(rows):
        if first.setdefault(r[3], i) != i:
            keep[i] = False
    report.exact_duplicates = int((~keep).sum())
    idx = np.flatnonzero(keep)
    every = db.minhashes_of(con, [r[0] for r in rows], dedupe.N_PERM)
    dupes.write_base(gdir, np.array([r[0] for r in rows], np.int64), [r[3] for r in rows], every,
                     chunk.near_threshold, len(idx))
    near = dedupe.near_duplicates(every[idx], chunk.near_threshold) >= 0
    keep[idx[near]] = False
    report.near_duplicates = int(near.sum())
    return [r for r, k in zip(rows, keep) if k]


def _swap(directory, con, manifest, gen, opts, report, rows, update_collection: bool) -> None:
    """Record the generation's fields and counts in the manifest and write it: the generation is live."""
    counts = db.live_doc_counts(con, gen)
    chunk_counts = rows.chunk_counts()
    colls = manifest.setdefault("collections", {})
    if update_collection:
        from llmkit.rag.chunk.sections import chunking_record

        colls[opts.collection] = chunking_record(opts.chunk)
    for name in list(colls):
        colls[name]["docs"] = int(counts.get(name, 0))
        colls[name]["chunks"] = int(chunk_counts.get(name, 0))
    manifest.update(generation=gen, fields=sorted(rows.fields), index=report.index_type or manifest["index"],
                    collection_order=rows.collections, updated=now())
    write_manifest(directory, manifest)


def _publish_graph(con, rows, gdir, report, llm=None) -> None:
    """Entities for live chunks that have none yet (graph enabled on an existing index), then the
    generation's graph arrays."""
    from llmkit.rag.index import graph

    have = {cid for (cid,) in con.execute("SELECT DISTINCT chunk_id FROM chunk_entities")}
    ids = [i for i in rows.ids.tolist() if i not in have]
    missing = list(zip(ids, db.texts_of(con, ids)))
    if missing:
        con.execute("BEGIN")
        db.add_entities(con, missing, llm)
        con.execute("COMMIT")
    row_of = {cid: i for i, cid in enumerate(rows.ids.tolist())}

    def triples():
        for cid, ent, tf in con.execute("SELECT chunk_id, entity, tf FROM chunk_entities"):
            i = row_of.get(cid)
            if i is not None:
                yield i, ent, tf

    report.graph = graph.build(triples(), len(rows), os.path.join(gdir, "graph"))


def _publish_remote(directory, con, manifest, gen, opts, rows, ids, keys, report, progress, switch: bool):
    """Write generation `gen`'s new rows to the served vector store (milvus.py): rows already there
    for the previous generation stay; vectors of unchanged text are read back instead of embedded.
    A model switch fills a new collection (the old one is dropped once no kept generation reads it).
    The store is open only while it is read or written, not while text is embedded: an embedded
    Milvus Lite file serves one process at a time, and queries wait for it meanwhile."""
    from llmkit.rag.index.milvus import new_collection_name, open_store

    spec = manifest["store"]
    name = spec.get("collection")
    prev_ids, prev_keys = _generation_rows(directory, manifest["generation"])
    if switch or not name:
        old, name = (name if switch else None), new_collection_name(directory)
        prev_ids, prev_keys = np.zeros(0, np.int64), np.zeros(0, "S32")
    else:
        old = None
    need = np.flatnonzero(~np.isin(ids, prev_ids))
    key_to_prev = dict(zip(prev_keys.tolist(), prev_ids.tolist()))
    reuse = [i for i in need.tolist() if keys[i] in key_to_prev]
    dim = manifest["dim"] if not switch else None
    st = open_store(spec, directory)
    try:
        if spec.get("collection") and not switch:
            st.delete_unfinished(name, manifest["generation"])
        got = st.vectors(name, [key_to_prev[keys[i]] for i in reuse]) if reuse else {}
        if dim is None and not switch:
            dim = st.dim_of(name)
    finally:
        st.close()
    reuse = [i for i in reuse if key_to_prev[keys[i]] in got]
    fresh = sorted(set(need.tolist()) - set(reuse))
    if fresh:
        dim = embed_missing(con, manifest, opts, [(keys[i].decode(), int(ids[i])) for i in fresh], dim, report,
                             progress)
    vecs = np.zeros((len(need), dim or 0), np.float32)
    pos = {r: j for j, r in enumerate(need.tolist())}
    if fresh:
        vecs[[pos[i] for i in fresh]] = journalled(con, manifest, [keys[i].decode() for i in fresh], dim, report)
    for i in reuse:
        vecs[pos[i]] = got[key_to_prev[keys[i]]]
    kind = (manifest["index"] if (manifest["index"] and not switch)
            else index_kind(opts.store.index_type, len(rows), opts.store.hnsw_above))
    st = open_store(spec, directory)
    try:
        if dim:
            st.create(name, dim, kind, len(rows))
        if len(need):
            st.upsert(name, ids[need], vecs, gen,
                      progress=(lambda d, n: progress("writing vectors", d, n)) if progress else None)
    finally:
        st.close()
    report.vectors_reused = len(rows) - report.embedded
    report.index_type = kind
    manifest["store"] = {**spec, "collection": name}
    if old:  # generation gen-1 still reads it
        manifest["store"]["replaced"] = [*spec.get("replaced", []), [old, gen - 1]]
    return dim


def _generation_rows(directory, gen) -> tuple[np.ndarray, np.ndarray]:
    """Chunk ids and text hashes of generation `gen` (empty if it has none)."""
    try:
        return (np.load(os.path.join(directory, f"gen-{gen}", "rows.npy")),
                np.load(os.path.join(directory, f"gen-{gen}", "keys.npy")))
    except (OSError, ValueError):
        return np.zeros(0, np.int64), np.zeros(0, "S32")


def _vectors(directory, con, manifest, opts, rows, keys, out, report, progress, reuse: bool = True,
             embed: bool = True) -> tuple[int, int]:
    """Write the live chunks' vectors to `out` (a .npy file, filled in slices): reused from the
    previous generation where the text is unchanged (same model: a model switch passes
    reuse=False), from the journal, or embedded now; (their dimension, chunks left without a vector:
    only with embed=False, marked in embedded.npy beside `out`)."""
    old_gen = os.path.join(directory, f"gen-{manifest['generation']}")
    old_vecs = None
    reuse_at: dict[bytes, int] = {}
    if reuse:
        try:
            old_keys = np.load(os.path.join(old_gen, "keys.npy"))
            np.load(os.path.join(vectors_dir(old_gen), "vectors.npy"), mmap_mode="r")  # present and readable
            old_vecs = open_vectors(old_gen, len(old_keys), manifest["index"])
            done = _embedded(old_gen, len(old_keys))
            reuse_at = {k: i for i, k in enumerate(old_keys.tolist()) if done[i]}
        except (OSError, ValueError):
            old_vecs = None
    key_list = keys.tolist()
    need = [i for i, k in enumerate(key_list) if k not in reuse_at]
    have = [i for i, k in enumerate(key_list) if k in reuse_at]
    missing: list[int] = []
    if embed:
        dim = embed_missing(con, manifest, opts, [(key_list[i].decode(), int(rows.ids[i])) for i in need],
                             manifest["dim"], report, progress)
    else:
        held = db.journal_keys(con, journal_space(manifest), [key_list[i].decode() for i in need])
        missing = [i for i in need if key_list[i].decode() not in held]
        need = [i for i in need if key_list[i].decode() in held]
        dim = journal_dim(con, manifest, key_list[need[0]].decode()) if need else None
    dim = dim or manifest["dim"] or (old_vecs.of_rows(np.zeros(0, np.int64)).shape[1] if old_vecs is not None else 0)
    if not dim:
        dim = load_index_embedder(manifest, opts.embed, progress).dim
    vectors = np.lib.format.open_memmap(out, "w+", np.float32, (len(rows), dim))
    step = 8192
    for lo in range(0, len(have), step):
        part = have[lo:lo + step]
        vectors[part] = old_vecs.of_rows(np.array([reuse_at[key_list[i]] for i in part], np.int64))
    for lo in range(0, len(need), step):
        part = need[lo:lo + step]
        vectors[part] = journalled(con, manifest, [key_list[i].decode() for i in part], dim, report)
    vectors.flush()
    del vectors
    if missing:
        done = np.ones(len(rows), bool)
        done[missing] = False
        np.save(os.path.join(os.path.dirname(out), "embedded.npy"), done)
    report.vectors_reused = len(rows) - report.embedded - len(missing)
    return dim, len(missing)


def _embedded(gdir: str, n: int) -> np.ndarray:
    """Which rows of a generation have their vector (all, unless it was published searchable-first)."""
    try:
        return np.load(os.path.join(gdir, "embedded.npy"))
    except OSError:
        return np.ones(n, bool)
