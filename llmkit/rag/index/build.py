"""Building an index directory: one run adds, updates and removes the documents of one collection,
then publishes a new searchable generation (`publish.py`). The directory holds

    manifest.json     format, version, current generation, embedding model + dimension, collections,
                      chunking parameters, metadata fields (written last, atomically)
    chunks.sqlite     documents, parents and chunks with their metadata (SQLite, one transaction per run)
    gen-N/            the searchable arrays of generation N: rows.npy (chunk ids), keys.npy (text hashes),
                      vectors.npy, faiss.index, bm25/, collection.npy, parent.npy (after a small
                      update: the last full build's BM25 and vectors as a base, plus a delta: segments.py)

Crash safety: a run inserts its rows tagged with the next generation and marks removed documents
with it, commits, builds gen-N+1 in a fresh directory and only then swaps the manifest. Until the
swap, readers use generation N, whose rows are all still present; a run killed at any point is
rolled back by the next one (rows of generations above the manifest's are deleted, removal marks
undone). Incremental: a file whose (size, mtime, inode) equal those kept with its documents is not
read at all; a document whose content hash is unchanged is not touched; vectors of chunks whose text
was already embedded are reused, so only new text is embedded; a run that changes nothing publishes
nothing.

Bounded: files are read one at a time and each document's rows are written as it is chunked, so its
text is dropped then; boilerplate lines are counted over a sample of the run's files spread over the
walk; the vectors are embedded in batches, each committed to a journal as it finishes (a run killed
while embedding keeps them for the next one) and written to the generation's files in slices
(`publish.py`). docs/design/rag-scale.md has the reasoning.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import numpy as np

from llmkit.io import disk_error
from llmkit.rag.chunk import dedupe, spans
from llmkit.rag.chunk.sections import ChunkOptions, chunk_document, chunking_of
from llmkit.rag.embed.models import EmbedOptions
from llmkit.errors import OptionError
from llmkit.rag.index import db
from llmkit.rag.index.analysis import ANALYSES
from llmkit.rag.index.manifest import MANIFEST, VERSION, read_manifest, stored_version, writer_lock
from llmkit.rag.index.opening import open_or_create
from llmkit.rag.index.vectors import HNSW_ABOVE
from llmkit.rag.read.documents import load_file
from llmkit.rag.read.files import ReadOptions, check_csv_meta, collect_files, read_input
from llmkit.rag.read.types import Skipped


@dataclass
class StoreOptions:
    """What the index keeps beside the chunks, and where its vectors live."""

    store: str | None = None  # where vectors live: None/faiss (index directory) or a served engine URI (milvus.py)
    index_type: str = "auto"  # auto | flat | hnsw
    hnsw_above: int = HNSW_ABOVE
    vector_dtype: str | None = None  # float32 | float16 storage of vectors.npy (None: the index's; new: float32)
    analysis: str | None = None  # BM25 analysis of a new index (analysis.py); None: english
    graph: bool = False  # keep an entity graph (index-wide once enabled)
    graph_llm: str | None = None  # a local GGUF whose listed entities are added to the extracted ones (implies graph)

    @property
    def keeps_graph(self) -> bool:
        return self.graph or bool(self.graph_llm)


@dataclass
class IndexOptions:
    """One indexing run: which collection, the metadata added to every chunk, and the options of
    each stage the documents pass through."""

    collection: str = "default"
    meta: dict = field(default_factory=dict)
    read: ReadOptions = field(default_factory=ReadOptions)
    chunk: ChunkOptions = field(default_factory=ChunkOptions)
    embed: EmbedOptions = field(default_factory=EmbedOptions)
    store: StoreOptions = field(default_factory=StoreOptions)
    tune: bool = True  # tune the fusion on pseudo-queries at the end of a run (when the corpus changed enough)
    wait: bool = True  # queue behind another writer (False: fail at once)

    def validate(self) -> None:
        """Every check on the options alone, before the index is touched."""
        self.chunk.validate()
        if self.store.analysis is not None and self.store.analysis not in ANALYSES:
            raise OptionError("unknown BM25 {analysis} {value!r}; use {names}.", value=self.store.analysis,
                              names=", ".join(ANALYSES))
        if self.embed.ray_workers < 1 or self.embed.ray_batch < 1:
            raise OptionError("{ray_workers} and {ray_batch} must be at least 1 (got {w}, {b}).",
                              w=self.embed.ray_workers, b=self.embed.ray_batch)


@dataclass
class IndexReport:
    generation: int = 0
    files: int = 0
    docs_added: int = 0
    docs_unchanged: int = 0
    docs_removed: int = 0
    chunks_added: int = 0
    chunks_indexed: int = 0
    exact_duplicates: int = 0
    near_duplicates: int = 0
    boilerplate_lines: int = 0
    code_fallbacks: dict = field(default_factory=dict)  # e.g. {'syntax error': 1}: cut at lines instead
    ignored: int = 0  # files and directories left out by .gitignore (and node_modules, __pycache__, ...)
    graph: dict = field(default_factory=dict)  # entities and links of the entity graph
    embedded: int = 0
    over_window: int = 0  # embedded chunks longer than the model's window: their ends are not embedded
    window: int = 0  # the model's window in its tokens
    changes: list[str] = field(default_factory=list)  # chunking that differs from the collection's recorded one
    segments: dict = field(default_factory=dict)  # base, dead and delta rows of a segmented publish (empty: full)
    vectors_reused: int = 0
    vectors_resumed: int = 0  # of the reused: vectors an interrupted run embedded (kept in the journal)
    journalled: list[str] = field(default_factory=list, repr=False)  # text hashes the generation took from the journal
    embed_s: float = 0.0
    total_s: float = 0.0
    index_type: str = ""
    skipped: list[Skipped] = field(default_factory=list)
    version: int = VERSION  # the manifest's format version after the run
    migrated_from: int = 0  # the older format version the run upgraded the manifest from (0: none)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["skipped"] = [asdict(s) for s in self.skipped]
        del d["journalled"]  # bookkeeping between the publish steps, not a result
        return d


def build(directory: str, inputs: list[str], opts: IndexOptions, stdin_data: bytes | None = None,
          progress: Callable[[str, int, int], None] | None = None, on_wait: Callable[[str], None] | None = None,
          changed: Callable[[str], bool] | None = None, vanished: tuple[str, ...] = ()) -> IndexReport:
    """Add, update and remove documents of one collection, then publish a new searchable generation
    (under the index's writer lock: concurrent runs queue, none loses the other's documents).
    `changed`: which indexed files to read again (an absolute path -> True); None reads every file
    and lets its content hash decide. Files not yet indexed are always read, and indexed files no
    longer found under the inputs (or under `vanished`, inputs that no longer exist) are removed."""
    t0 = time.perf_counter()
    opts.validate()
    if opts.store.store is not None:
        from llmkit.rag.index.milvus import parse_store

        parse_store(opts.store.store, directory)  # a bad URI is refused before the directory exists
    files, unsupported, ignored = collect_files(inputs, opts.read, empty_glob=changed is not None)
    if opts.read.csv_meta:
        check_csv_meta(files, opts.read.csv_meta)
    try:
        with writer_lock(directory, opts.wait, on_wait):
            report = _build_locked(directory, files, [*inputs, *vanished], opts, stdin_data, progress, changed)
    except Exception as e:  # a full or read-only disk: one line (the run's rows were rolled back)
        err = disk_error(directory, e, f"index '{directory}'",
                         "Nothing was changed (queries answer from the previous generation)")
        if err is None:
            raise
        raise err from None
    report.skipped[:0] = unsupported
    report.ignored = ignored
    report.total_s = time.perf_counter() - t0
    return report


SAMPLE_FILES = 1000  # files read first to find boilerplate lines (every file of a smaller run)
SAMPLE_DOCS = 5000  # documents whose lines the boilerplate count sees
SAMPLE_CHARS = 64 << 20  # sampled text kept for the main pass; files beyond it are read again there


def _same_file(a: os.stat_result | None, b: os.stat_result | None) -> bool:
    return a is not None and b is not None and (a.st_size, a.st_mtime_ns, a.st_ino) == (b.st_size, b.st_mtime_ns, b.st_ino)


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _plan(files, live, changed, report) -> tuple[list[str], set[str]]:
    """(files to read, paths of documents taken as they are): an indexed file is not read when its
    size, mtime and inode equal those kept with its documents, or when `changed` does not name it."""
    indexed: dict[str, list[str]] = {}
    for doc_path in live:
        indexed.setdefault(doc_path.split("#", 1)[0], []).append(doc_path)
    todo, seen = [], set()
    for path in files:
        kept = indexed.get(os.path.abspath(path)) if path != "-" else None
        if kept:
            if changed is not None and not changed(os.path.abspath(path)):
                unread = True
            else:
                st = _stat(path)
                unread = st is not None and all(live[d][2:] == (st.st_size, st.st_mtime_ns, st.st_ino) for d in kept)
            if unread:
                seen.update(kept)
                report.docs_unchanged += len(kept)
                continue
        todo.append(path)
    return todo, seen


class _Reader:
    """Reads one input into documents (with the file stat to keep beside them)."""

    def __init__(self, opts: IndexOptions, stdin_data, embedder):
        r = opts.read
        self.opts, self.stdin_data = opts, stdin_data
        self.code_size, self.measure = r.code_size or 1500, len
        if not r.code_size and not opts.chunk.sizes:
            self.code_size, self.measure = opts.chunk.tokens, embedder.count_tokens

    def __call__(self, path: str):
        """(documents, stat or None, skipped): a file that changes while it is read is read again, so
        its documents are one version of it, never a mix."""
        stat = None
        if path == "-":
            data = self.stdin_data or b""
        else:
            for _ in range(3):
                before = _stat(path)
                data, skip = read_input(path)  # bounded: a named pipe or device cannot fill memory
                if skip:
                    return [], None, [skip]
                after = _stat(path)
                if _same_file(before, after):
                    stat = db.file_stat(after, time.time_ns())
                    break
        r = self.opts.read
        docs, skipped = load_file(path, data, text_field=r.text_field, id_field=r.id_field,
                                  size=max(self.opts.chunk.sizes or (800,)), code_size=self.code_size,
                                  csv_meta=r.csv_meta, measure=self.measure)
        return docs, stat, skipped


def _boilerplate(todo, read, live, progress):
    """(boilerplate lines, what the sample read: path -> (documents or None, stat, skipped)): lines
    counted over the new or changed documents of up to SAMPLE_FILES files spread over the run, so the
    count's memory does not grow with the corpus (a run of fewer files counts all of them)."""
    picks = todo if len(todo) <= SAMPLE_FILES else [todo[int(i)] for i in np.linspace(0, len(todo) - 1, SAMPLE_FILES)]
    lines, sampled, kept = [], {}, 0
    for n, path in enumerate(picks):
        if progress:
            progress("sampling", n, len(picks))
        docs, stat, skipped = read(path)
        for d in docs:
            old = live.get(d.path)
            if len(lines) < SAMPLE_DOCS and not (old and old[1] == d.hash):  # pre-cut sections (code, tables) are not prose
                lines.append({ln.strip() for s in d.sections if s.chunks is None for ln in s.text.split("\n")})
        size = sum(len(s.text) for d in docs for s in d.sections)
        keep = kept + size <= SAMPLE_CHARS
        kept += size if keep else 0
        sampled[path] = (docs if keep else None, stat, skipped)
    return spans.boilerplate_lines(lines), sampled


def _add_doc(con, doc, stat, gen, opts: IndexOptions, manifest, drop_lines, emb, report) -> None:
    """Insert one document with its parents and chunks (and their entities with a graph)."""
    from llmkit.rag.index.bm25 import tokenize

    size, mtime, inode = stat or (None, None, None)
    cur = con.execute("INSERT INTO docs (collection, source, path, hash, meta, gen_added, size, mtime_ns, inode)"
                      " VALUES (?,?,?,?,?,?,?,?,?)", (opts.collection, doc.source, doc.path, doc.hash,
                                                      json.dumps(doc.meta, ensure_ascii=False), gen, size, mtime, inode))
    doc_id = cur.lastrowid
    for parent_text, chunks in chunk_document(doc, opts.chunk, opts.meta, drop_lines,
                                              emb.token_starts if emb else None):
        pid = con.execute("INSERT INTO parents (doc_id, text) VALUES (?, ?)", (doc_id, parent_text)).lastrowid
        rows = []
        for text, meta in chunks:
            meta["collection"] = opts.collection
            rows.append((doc_id, pid, opts.collection, text, db.text_hash(text), dedupe.text_key(text),
                         dedupe.minhash(tokenize(text)).tobytes(), json.dumps(meta, ensure_ascii=False)))
        con.executemany("INSERT INTO chunks (doc_id, parent_id, collection, text, text_hash, dup_key, minhash, meta)"
                        " VALUES (?,?,?,?,?,?,?,?)", rows)
        report.chunks_added += len(rows)
        if manifest["graph"]:
            from llmkit.rag.index.graph import entity_llm

            first = con.execute("SELECT last_insert_rowid()").fetchone()[0] - len(rows) + 1
            db.add_entities(con, [(first + i, r[3]) for i, r in enumerate(rows)], entity_llm(opts.store.graph_llm))
    report.docs_added += 1


def _build_locked(directory, files, inputs, opts: IndexOptions, stdin_data, progress, changed=None) -> IndexReport:
    """One run under the writer lock: files are planned by their stat, read one at a time, and each
    document's rows written as it is chunked (its text is dropped then), all in one transaction;
    then the generation is published, unless nothing changed."""
    from llmkit.rag.index.embedding import load_index_embedder
    from llmkit.rag.index.publish import publish

    manifest = open_or_create(directory, opts)
    gen = manifest["generation"] + 1
    report = IndexReport(generation=gen, files=len(files))
    if os.path.exists(os.path.join(directory, MANIFEST)) and stored_version(directory) < VERSION:
        report.migrated_from = stored_version(directory)
    model = ModelTokens(lambda: load_index_embedder(manifest, opts.embed))
    opts = replace(opts, chunk=chunking_of(manifest, opts.collection, opts.chunk, model.window, report.changes))
    emb = None if opts.chunk.sizes else model
    con = db.connect(directory)
    try:
        db.rollback_unfinished(con, manifest["generation"])
        live = _live_docs(con, opts.collection)
        todo, seen = _plan(files, live, changed, report)
        read = _Reader(opts, stdin_data, emb)
        drop_lines, sampled = set(), {}
        if opts.chunk.boilerplate:
            drop_lines, sampled = _boilerplate(todo, read, live, progress)
            report.boilerplate_lines = len(drop_lines)
        # the run's rows and removal marks commit together, before any generation is built from them
        con.execute("BEGIN")
        for path, docs, stat in _read_files(todo, read, sampled, report, progress):
            same = _write_docs(con, docs, stat, live, seen, gen, opts, manifest, drop_lines, emb, report)
            if same and path != "-":  # touched, not changed: next time its stat says so
                db.set_file_stat(con, same, stat)
        report.docs_removed = _mark_gone(con, live, seen, inputs, gen)
        con.execute("COMMIT")
        if _nothing_to_publish(manifest, opts, report):
            from llmkit.rag.index.publish import republish

            republish(directory, con, manifest, gen, report)
            return report
        first = None
        if _searchable_first(manifest, opts, report):
            publish(directory, con, manifest, gen, opts, report, progress, searchable_first=True)
            first = os.path.join(directory, f"gen-{gen}")
            gen = report.generation = gen + 1  # a failure from here on keeps the searchable generation
        publish(directory, con, manifest, gen, opts, report, progress, same_as=first)
    except BaseException as e:
        if con.in_transaction:
            con.execute("ROLLBACK")
        if not isinstance(e, KeyboardInterrupt):  # e.g. a vector store refused the write: undo it now
            _undo_unpublished(directory, con, gen - 1)
        raise
    finally:
        con.close()
    return report


def _live_docs(con, collection: str) -> dict:
    """The collection's live documents: path -> (id, hash, size, mtime_ns, inode)."""
    return {row[1]: (row[0], row[2], row[3], row[4], row[5]) for row in con.execute(
        "SELECT id, path, hash, size, mtime_ns, inode FROM docs WHERE collection = ? AND gen_removed IS NULL",
        (collection,))}


def _read_files(todo, read, sampled, report, progress):
    """Yield (path, documents, stat) for each file to index, in order: from the boilerplate sample
    where it kept them, else read now (so only one file's text is held at a time)."""
    for n, path in enumerate(todo):
        if progress:
            progress("reading", n, len(todo))
        docs, stat, skipped = sampled.pop(path, (None, None, None))
        if docs is None:
            docs, stat, again = read(path)
            skipped = again if skipped is None else skipped  # a sampled file's are reported once
        report.skipped.extend(skipped)
        yield path, docs, stat


def _write_docs(con, docs, stat, live, seen, gen, opts: IndexOptions, manifest, drop_lines, emb, report) -> list[int]:
    """Insert one file's new and changed documents (marking the versions they replace removed); the
    ids of its unchanged ones."""
    same = []
    for doc in docs:
        if doc.note:
            report.code_fallbacks[doc.note] = report.code_fallbacks.get(doc.note, 0) + 1
        seen.add(doc.path)
        old = live.get(doc.path)
        if old and old[1] == doc.hash:
            report.docs_unchanged += 1
            same.append(old[0])
            continue
        if old:
            con.execute("UPDATE docs SET gen_removed = ? WHERE id = ?", (gen, old[0]))
        _add_doc(con, doc, stat, gen, opts, manifest, drop_lines, emb, report)
    return same


def _mark_gone(con, live, seen, inputs, gen) -> int:
    """Mark removed the live documents under the run's inputs that it did not see; how many."""
    scopes = [os.path.abspath(p) for p in inputs if p != "-"]
    gone = [doc_id for p, (doc_id, *_) in live.items()
            if p not in seen and (p == "-" and "-" in inputs or _in_scope(p, scopes))]
    for doc_id in gone:
        con.execute("UPDATE docs SET gen_removed = ? WHERE id = ?", (gen, doc_id))
    return len(gone)


SEARCHABLE_FIRST_BATCHES = 16  # a run adding more chunks than this many embedding batches is searchable first


def _searchable_first(manifest, opts: IndexOptions, report) -> bool:
    """Publish the run's chunks for BM25 before embedding them (their vectors come with the next
    generation) when embedding them takes long: more than SEARCHABLE_FIRST_BATCHES batches, embedded
    here into the index directory's own vector files."""
    from llmkit import config

    return (report.chunks_added > SEARCHABLE_FIRST_BATCHES * config.size("LLMKIT_INDEX_BATCH")
            and not manifest["store"] and not opts.embed.ray)


def _nothing_to_publish(manifest, opts: IndexOptions, report) -> bool:
    """A run that added, changed and removed nothing: its generation is the live one's files again
    (`republish`), not a rebuild (a format upgrade, a new collection, a new graph or index type still
    build, and so do vectors a stopped run left pending). With a served vector store a run builds as
    before."""
    return (manifest["generation"] > 0 and not report.docs_added and not report.docs_removed
            and not manifest.get("pending") and not manifest["store"]
            and not report.migrated_from and not report.changes and opts.collection in manifest["collections"]
            and not opts.store.keeps_graph and opts.store.index_type in ("auto", manifest["index"])
            and not opts.store.vector_dtype)  # a vector dtype asked for: stored as asked


class ModelTokens:
    """The index's embedding model as a tokenizer, loaded on first use (a run that cuts no text into
    token-sized chunks never loads it)."""

    def __init__(self, load):
        self._load, self._emb = load, None

    def _get(self):
        if self._emb is None:
            self._emb = self._load()
        return self._emb

    def window(self) -> int:
        return self._get().window

    def token_starts(self, text: str):
        return self._get().token_starts(text)

    def count_tokens(self, text: str) -> int:
        return self._get().count_tokens(text)


def _undo_unpublished(directory, con, old_gen: int) -> None:
    """A run that failed before its manifest swap leaves the index exactly as it was (best effort:
    the next run would roll it back anyway)."""
    try:
        if read_manifest(directory).get("generation") == old_gen:
            db.rollback_unfinished(con, old_gen)
            shutil.rmtree(os.path.join(directory, f"gen-{old_gen + 1}"), ignore_errors=True)
    except Exception:  # never hide the error that got us here
        pass


def _in_scope(path: str, scopes: list[str]) -> bool:
    base = path.split("#", 1)[0]
    return any(base == s or base.startswith(s.rstrip(os.sep) + os.sep) for s in scopes)
