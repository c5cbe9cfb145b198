"""The on-disk RAG index: one directory holding

    manifest.json     format, version, current generation, embedding model + dimension, collections,
                      chunking parameters, metadata fields (written last, atomically)
    chunks.sqlite     documents, parents and chunks with their metadata (SQLite, one transaction per run)
    gen-N/            the searchable arrays of generation N: rows.npy (chunk ids), keys.npy (text hashes),
                      vectors.npy, faiss.index, bm25/, collection.npy, parent.npy

Crash safety: a run inserts its rows tagged with the next generation and marks removed documents
with it, commits, builds gen-N+1 in a fresh directory and only then swaps the manifest. Until the
swap, readers use generation N, whose rows are all still present; a run killed at any point is
rolled back by the next one (rows of generations above the manifest's are deleted, removal marks
undone). Incremental: a document whose content hash is unchanged is not touched; vectors of chunks
whose text was already embedded are reused, so only new text is embedded.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import hashlib
import json
import os
import shutil
import sqlite3
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from llmkit.errors import BadInput
from llmkit.rag import chunking
from llmkit.rag.documents import SUFFIXES, Document, Skipped, load_file

from llmkit.rag.manifest import DB, FORMAT, MANIFEST, VERSION, read_manifest, write_manifest, writer_lock  # noqa: F401

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


@dataclass
class IndexOptions:
    collection: str = "default"
    chunker: str = "recursive"  # recursive | window
    sizes: tuple[int, ...] = (800,)  # characters (window: words/CJK characters); several = several chunk sizes
    overlap: int = 100
    parent_size: int = 3000  # small-to-big parents (0: the whole section)
    model: str | None = None
    runtime: str = "onnx"  # onnx | torch: how vectors are computed (fp32 vectors of both are interchangeable)
    precision: str | None = None  # fp32 | int8, fixed when the index is created (None: the index's, else fp32)
    query_prompt: str = ""
    passage_prompt: str = ""
    meta: dict = field(default_factory=dict)
    text_field: str = "text"
    id_field: str = "id"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    dedupe: bool = True
    near_threshold: float = 0.9
    boilerplate: bool = True
    stem: bool = False  # Porter-stem English words for BM25 (index-wide, fixed when the index is created)
    code_size: int = 1500  # characters per code chunk (definitions up to this size stay whole)
    csv_meta: tuple[str, ...] = ()  # CSV/TSV columns kept as metadata (one row per chunk then)
    gitignore: bool = True  # respect .gitignore files in directories
    graph: bool = False  # keep an entity graph (index-wide once enabled)
    graph_llm: object = None  # a LocalLLM whose listed entities are added to the extracted ones
    index_type: str = "auto"  # auto | flat | hnsw
    hnsw_above: int = 100_000
    store: str | None = None  # where vectors live: None/faiss (index directory) or a served engine URI (vstore.py)
    ray: str | None = None  # embed new chunks on a Ray cluster ("auto", an address, or "local": start one)
    ray_workers: int = 2
    ray_batch: int = 64


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
    graph: dict = field(default_factory=dict)  # entities and links of the entity graph (--graph)
    embedded: int = 0
    vectors_reused: int = 0
    embed_s: float = 0.0
    total_s: float = 0.0
    index_type: str = ""
    skipped: list[Skipped] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["skipped"] = [asdict(s) for s in self.skipped]
        return d


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


_OWN = re.compile(r"writer\.lock|chunks\.sqlite(-wal|-shm|-journal)?|gen-\d+|\.manifest\.json\..*\.tmp|milvus\.db|\.milvus\.db\.lock")


def _connect(directory: str) -> sqlite3.Connection:
    con = sqlite3.connect(os.path.join(directory, DB), isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.executescript(SCHEMA)
    return con


def _rollback_unfinished(con: sqlite3.Connection, gen: int) -> None:
    """Undo what a run killed before its manifest swap left behind (rows of later generations)."""
    con.execute("BEGIN")
    doomed = "SELECT id FROM docs WHERE gen_added > ?"
    con.execute(f"DELETE FROM chunks WHERE doc_id IN ({doomed})", (gen,))
    con.execute(f"DELETE FROM parents WHERE doc_id IN ({doomed})", (gen,))
    con.execute("DELETE FROM docs WHERE gen_added > ?", (gen,))
    con.execute("UPDATE docs SET gen_removed = NULL WHERE gen_removed > ?", (gen,))
    con.execute("COMMIT")


# directories never worth indexing, even without a .gitignore that says so
JUNK_DIRS = {"node_modules", "__pycache__", "venv", "site-packages", "bower_components"}


def _gitignore(directory: str):
    """The .gitignore of `directory` as a pathspec matcher, or None."""
    path = os.path.join(directory, ".gitignore")
    if not os.path.isfile(path):
        return None
    try:
        import pathspec
    except ImportError:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return pathspec.GitIgnoreSpec.from_lines(f.read().splitlines())
    except (OSError, ValueError):
        return None


def _ignored(path: str, is_dir: bool, specs: list) -> bool:
    """Git's rule: the deepest .gitignore with a matching pattern decides (negations included)."""
    verdict = False
    for base, spec in specs:
        rel = os.path.relpath(path, base).replace(os.sep, "/") + ("/" if is_dir else "")
        res = spec.check_file(rel)
        if res.include is not None:
            verdict = res.include
    return verdict


def _collect_files(inputs: list[str], opts: IndexOptions) -> tuple[list[str], list[Skipped], int]:
    """(files to read, files skipped for their type, files ignored by .gitignore/junk directories);
    explicitly named files are always read."""
    files: list[str] = []
    skipped: list[Skipped] = []
    ignored = 0
    for item in inputs:
        if item == "-":
            files.append(item)
        elif os.path.isdir(item):
            specs_at: dict[str, list] = {}
            for root, dirs, names in os.walk(item):
                parent = specs_at.get(os.path.dirname(root), [])
                spec = _gitignore(root) if opts.gitignore else None
                specs = parent + [(root, spec)] if spec is not None else parent
                specs_at[root] = specs
                keep = []
                for d in sorted(dirs):
                    full = os.path.join(root, d)
                    if d.startswith(".") or d in JUNK_DIRS or (specs and _ignored(full, True, specs)):
                        ignored += d not in (".git",) and not d.startswith(".")
                        continue
                    keep.append(d)
                dirs[:] = keep
                for name in sorted(names):
                    p = os.path.join(root, name)
                    if name.startswith("."):
                        continue
                    if specs and _ignored(p, False, specs):
                        ignored += 1
                        continue
                    if opts.include and not any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(p, g) for g in opts.include):
                        continue
                    if any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(p, g) for g in opts.exclude):
                        continue
                    if os.path.splitext(name)[1].lower() not in SUFFIXES:
                        skipped.append(Skipped(p, "unsupported type"))
                        continue
                    files.append(p)
        elif os.path.exists(item):
            files.append(item)
        else:
            raise BadInput(f"input '{item}' does not exist. Check the path.")
    return files, skipped, ignored


def _check_csv_meta(files: list[str], columns: tuple[str, ...]) -> None:
    """Before touching the index: every --csv-meta column must exist in at least one table file."""
    from llmkit.rag.readers import table_header

    seen: set[str] = set()
    tables = [f for f in files if f != "-" and f.lower().endswith((".csv", ".tsv"))]
    for f in tables:
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                seen.update(table_header(fh.read(100000), f)[1])
        except OSError:
            continue
    missing = [c for c in columns if c not in seen]
    if missing:
        raise BadInput(f"no CSV/TSV input has a column {missing[0]!r}" + (
            f" (columns: {', '.join(sorted(seen))})" if seen else " (there is no CSV/TSV input)") + ". Fix --csv-meta.")


def summarize_skipped(skipped: list[Skipped], show: int = 5) -> str:
    """'12 file(s): 8 .png (unsupported type), 3 .py (syntax error: cut at lines) ...: a.png, b.png ...'"""
    from collections import Counter

    def ext(src: str) -> str:
        base = re.sub(r"(:\d+|#.*)$", "", src)  # a JSONL line ('docs.jsonl:7') or record ('docs.jsonl#id')
        return os.path.splitext(base)[1].lower() or "(no suffix)"

    groups = Counter((ext(s.source), s.reason.split(" (")[0]) for s in skipped)
    head = ", ".join(f"{n} {e} ({r})" for (e, r), n in groups.most_common())
    names = ", ".join(s.source for s in skipped[:show]) + (" ..." if len(skipped) > show else "")
    return f"{len(skipped)} file(s): {head}: {names}"


def _chunk_document(doc: Document, opts: IndexOptions, drop_lines: set[str]):
    """(parent text, [(chunk text, meta)]) pairs for one document."""
    out = []
    base = {"source": doc.source, **{k: v for k, v in doc.meta.items()}, **opts.meta}
    for sec in doc.sections:
        if sec.chunks is not None:  # already cut (code, table rows): verbatim, the section is the parent
            chunks = [(t, dict(base, section=sec.heading, chunk_size=len(t), **m)) for t, m in sec.chunks if t.strip()]
            if chunks:
                out.append((sec.text, chunks))
            continue
        text = chunking.normalize_whitespace(chunking.strip_lines(sec.text, drop_lines))
        if not text:
            continue
        parents = (chunking.recursive_spans(text, opts.parent_size, 0) if opts.parent_size
                   else [chunking.Span(0, len(text), text)])
        for par in parents:
            chunks = []
            for size in opts.sizes:
                if opts.chunker == "window":
                    spans = chunking.window_spans(par.text, size, opts.overlap)
                else:
                    spans = chunking.recursive_spans(par.text, size, opts.overlap)
                for sp in spans:
                    meta = dict(base, section=sec.heading, chunk_size=size,
                                char_start=par.start + sp.start, char_end=par.start + sp.end)
                    if sec.page is not None:
                        meta["page"] = sec.page
                    chunks.append((sp.text, meta))
            out.append((par.text, chunks))
    return out


def build(directory: str, inputs: list[str], opts: IndexOptions, stdin_data: bytes | None = None,
          progress: Callable[[str, int, int], None] | None = None, wait: bool = True,
          on_wait: Callable[[str], None] | None = None) -> IndexReport:
    """Add, update and remove documents of one collection, then publish a new searchable generation
    (under the index's writer lock: concurrent runs queue, none loses the other's documents)."""
    t0 = time.perf_counter()
    if opts.chunker not in ("recursive", "window"):
        raise BadInput(f"unknown chunker {opts.chunker!r}; use 'recursive' or 'window'.")
    if not opts.sizes:
        raise BadInput("give at least one chunk size.")
    for size in opts.sizes:
        if opts.chunker == "window":
            chunking.window_spans("x", size, opts.overlap)  # validates size/overlap
        else:
            chunking._check(size, opts.overlap)
    if opts.parent_size and opts.parent_size < max(opts.sizes):
        raise BadInput(f"--parent-size {opts.parent_size} is smaller than the chunk size {max(opts.sizes)}; "
                       "make it larger or 0 (parents = whole sections).")
    if opts.store is not None:
        from llmkit.rag.vstore import parse_store

        parse_store(opts.store, directory)  # a bad URI is refused before the directory exists
    files, unsupported, ignored = _collect_files(inputs, opts)
    if opts.csv_meta:
        _check_csv_meta(files, opts.csv_meta)
    with writer_lock(directory, wait, on_wait):
        report = _build_locked(directory, files, inputs, opts, stdin_data, progress)
    report.skipped[:0] = unsupported
    report.ignored = ignored
    report.total_s = time.perf_counter() - t0
    return report


def _build_locked(directory, files, inputs, opts, stdin_data, progress) -> IndexReport:
    manifest = _open_or_create(directory, opts)
    gen = manifest["generation"] + 1
    report = IndexReport(generation=gen, files=len(files))
    con = _connect(directory)
    try:
        _rollback_unfinished(con, manifest["generation"])
        live = {row[1]: (row[0], row[2]) for row in con.execute(
            "SELECT id, path, hash FROM docs WHERE collection = ? AND gen_removed IS NULL", (opts.collection,))}
        new_docs, seen = [], set()
        for n, path in enumerate(files):
            if progress:
                progress("reading", n, len(files))
            if path == "-":
                data = stdin_data or b""
            else:
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError as e:
                    report.skipped.append(Skipped(path, e.strerror or "unreadable"))
                    continue
            docs, skipped = load_file(path, data, text_field=opts.text_field, id_field=opts.id_field,
                                      size=max(opts.sizes), code_size=opts.code_size, csv_meta=opts.csv_meta)
            report.skipped.extend(skipped)
            for doc in docs:
                if doc.note:
                    report.code_fallbacks[doc.note] = report.code_fallbacks.get(doc.note, 0) + 1
                seen.add(doc.path)
                old = live.get(doc.path)
                if old and old[1] == doc.hash:
                    report.docs_unchanged += 1
                else:
                    new_docs.append(doc)
        scopes = [os.path.abspath(p) for p in inputs if p != "-"]
        gone = [(doc_id, p) for p, (doc_id, _) in live.items()
                if p not in seen and (p == "-" and "-" in inputs or _in_scope(p, scopes))]
        changed = [live[d.path][0] for d in new_docs if d.path in live]
        drop_lines: set[str] = set()
        if opts.boilerplate:
            drop_lines = chunking.boilerplate_lines(  # pre-cut sections (code, tables) are not prose
                [{ln.strip() for s in d.sections if s.chunks is None for ln in s.text.split("\n")} for d in new_docs])
            report.boilerplate_lines = len(drop_lines)
        con.execute("BEGIN")
        for doc_id in changed + [d for d, _ in gone]:
            con.execute("UPDATE docs SET gen_removed = ? WHERE id = ?", (gen, doc_id))
        report.docs_removed = len(gone)
        from llmkit.rag.bm25 import tokenize

        for n, doc in enumerate(new_docs):
            if progress:
                progress("chunking", n, len(new_docs))
            cur = con.execute("INSERT INTO docs (collection, source, path, hash, meta, gen_added) VALUES (?,?,?,?,?,?)",
                              (opts.collection, doc.source, doc.path, doc.hash,
                               json.dumps(doc.meta, ensure_ascii=False), gen))
            doc_id = cur.lastrowid
            for parent_text, chunks in _chunk_document(doc, opts, drop_lines):
                pid = con.execute("INSERT INTO parents (doc_id, text) VALUES (?, ?)", (doc_id, parent_text)).lastrowid
                rows = []
                for text, meta in chunks:
                    meta["collection"] = opts.collection
                    rows.append((doc_id, pid, opts.collection, text, _text_hash(text), chunking.text_key(text),
                                 chunking.minhash(tokenize(text)).tobytes(), json.dumps(meta, ensure_ascii=False)))
                con.executemany("INSERT INTO chunks (doc_id, parent_id, collection, text, text_hash, dup_key, minhash, meta)"
                                " VALUES (?,?,?,?,?,?,?,?)", rows)
                report.chunks_added += len(rows)
                if manifest.get("graph"):
                    first = con.execute("SELECT last_insert_rowid()").fetchone()[0] - len(rows) + 1
                    _add_entities(con, [(first + i, r[3]) for i, r in enumerate(rows)], opts.graph_llm)
            report.docs_added += 1
        con.execute("COMMIT")
        _publish(directory, con, manifest, gen, opts, report, progress)
    except BaseException as e:
        if con.in_transaction:
            con.execute("ROLLBACK")
        if not isinstance(e, KeyboardInterrupt):  # e.g. a vector store refused the write: undo it now
            _undo_unpublished(directory, con, gen - 1)
        raise
    finally:
        con.close()
    return report


def _undo_unpublished(directory, con, old_gen: int) -> None:
    """A run that failed before its manifest swap leaves the index exactly as it was (best effort:
    the next run would roll it back anyway)."""
    try:
        if read_manifest(directory).get("generation") == old_gen:
            _rollback_unfinished(con, old_gen)
            shutil.rmtree(os.path.join(directory, f"gen-{old_gen + 1}"), ignore_errors=True)
    except Exception:  # never hide the error that got us here
        pass


def _add_entities(con, chunks, llm=None) -> None:
    """Store the entities of (chunk id, text) pairs (the graph's raw material, kept per chunk so
    updates only extract new text)."""
    from llmkit.rag.graph import entities, llm_entities

    rows = []
    for cid, text in chunks:
        found = entities(text)
        if llm is not None:
            found.update(llm_entities(llm, text))
        rows.extend((cid, e, n) for e, n in found.items())
    con.executemany("INSERT INTO chunk_entities (chunk_id, entity, tf) VALUES (?,?,?)", rows)


def _in_scope(path: str, scopes: list[str]) -> bool:
    base = path.split("#", 1)[0]
    return any(base == s or base.startswith(s.rstrip(os.sep) + os.sep) for s in scopes)


def _text_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _open_or_create(directory: str, opts: IndexOptions) -> dict:
    """The manifest to extend; a new one for an empty directory, or one holding only what a first run
    killed before its manifest left behind (its rows are rolled back as any unfinished run's)."""
    existing = os.listdir(directory) if os.path.isdir(directory) else []
    if os.path.exists(os.path.join(directory, MANIFEST)) or any(not _OWN.fullmatch(n) for n in existing):
        m = read_manifest(directory)
        want = opts.model or None
        have = m.get("model")
        if want is not None and want != have and os.path.abspath(want) != have:
            raise BadInput(f"index '{directory}' was built with the embedding model '{have}'; vectors of "
                           f"'{want}' cannot be mixed into it. Use a new index directory.")
        if (opts.query_prompt or opts.passage_prompt) and (opts.query_prompt, opts.passage_prompt) != (
                m.get("query_prompt", ""), m.get("passage_prompt", "")):
            raise BadInput("this index was built with other --query-prompt/--passage-prompt values; "
                           "use a new index directory to change them.")
        if opts.stem and not m.get("stem", False):
            raise BadInput("this index was built without --stem; BM25 terms cannot be mixed. Use a new index directory.")
        if opts.graph and not m.get("graph"):
            m["graph"] = True  # enabled now: the chunks already indexed get their entities at publish
        have_prec = m.get("embed_precision", "fp32")
        if opts.precision and opts.precision != have_prec:
            raise BadInput(f"index '{directory}' holds {have_prec} embeddings; {opts.precision} vectors cannot be "
                           "mixed into it. Use a new index directory.")
        if opts.store is not None:
            from llmkit.rag.vstore import parse_store

            want_store = parse_store(opts.store, directory)
            have_store = m.get("store")
            if (want_store or {}).get("uri") != (have_store or {}).get("uri"):
                raise BadInput(f"index '{directory}' keeps its vectors in {(have_store or {}).get('uri', 'faiss')}, "
                               f"not {opts.store}. Drop --store to extend it, or build a new index directory.")
        return m
    from llmkit.rag.vstore import parse_store

    spec = parse_store(opts.store, directory)  # checked before anything is created
    os.makedirs(directory, exist_ok=True)
    model = opts.model
    if model:
        from llmkit.rag.embed import resolve_model

        model = resolve_model(model)
    return {"format": FORMAT, "version": VERSION, "generation": 0, "model": model or "default", "dim": None,
            "embed_precision": opts.precision or "fp32", "embed_runtime": opts.runtime,
            "query_prompt": opts.query_prompt, "passage_prompt": opts.passage_prompt, "created": _now(),
            "collections": {}, "fields": [], "index": None, "stem": opts.stem, "bm25_idents": True,
            "graph": opts.graph, **({"store": spec} if spec else {})}


def _live_chunks(con: sqlite3.Connection, gen: int):
    return con.execute(
        "SELECT c.id, c.text, c.text_hash, c.dup_key, c.minhash, c.collection, c.parent_id FROM chunks c "
        "JOIN docs d ON d.id = c.doc_id WHERE d.gen_added <= ? AND (d.gen_removed IS NULL OR d.gen_removed > ?) "
        "ORDER BY c.id", (gen, gen)).fetchall()


def _publish(directory, con, manifest, gen, opts, report, progress, keep_ids: set | None = None) -> None:
    """Build gen-N (dedupe, embed new text, BM25, faiss), then swap the manifest. `keep_ids`: exactly
    these chunks, no dedupe, every vector computed again (a model switch)."""
    from llmkit.rag.bm25 import BM25Index, tokenize

    rows = _live_chunks(con, gen)
    if keep_ids is not None:
        rows = [r for r in rows if r[0] in keep_ids]
    keep = np.ones(len(rows), bool)
    if opts.dedupe and rows and keep_ids is None:
        first: dict[str, int] = {}
        for i, r in enumerate(rows):
            if first.setdefault(r[3], i) != i:
                keep[i] = False
        report.exact_duplicates = int((~keep).sum())
        idx = np.flatnonzero(keep)
        sigs = np.stack([np.frombuffer(rows[i][4], np.uint32) for i in idx])
        near = chunking.near_duplicates(sigs, opts.near_threshold) >= 0
        keep[idx[near]] = False
        report.near_duplicates = int(near.sum())
    rows = [r for r, k in zip(rows, keep) if k]
    report.chunks_indexed = len(rows)
    gdir = os.path.join(directory, f"gen-{gen}")
    shutil.rmtree(gdir, ignore_errors=True)  # a half-built directory of a killed run
    os.makedirs(gdir)
    ids = np.array([r[0] for r in rows], np.int64)
    keys = np.array([r[2] for r in rows], dtype="S32")
    collections = sorted({r[5] for r in rows})
    coll_code = {c: i for i, c in enumerate(collections)}
    np.save(os.path.join(gdir, "rows.npy"), ids)
    np.save(os.path.join(gdir, "keys.npy"), keys)
    np.save(os.path.join(gdir, "collection.npy"), np.array([coll_code[r[5]] for r in rows], np.int32))
    np.save(os.path.join(gdir, "parent.npy"), np.array([r[6] for r in rows], np.int64))
    remote = None
    if rows and manifest.get("store"):
        remote, dim = _publish_remote(directory, manifest, gen, opts, rows, ids, keys, report, progress,
                                      switch=keep_ids is not None)
    elif rows:
        vectors, dim = _vectors(directory, manifest, opts, rows, keys, report, progress, reuse=keep_ids is None)
        np.save(os.path.join(gdir, "vectors.npy"), vectors)
        report.index_type = _write_faiss(os.path.join(gdir, "faiss.index"), vectors, opts)
    if rows:
        if progress:
            progress("BM25", 0, 1)
        stem = bool(manifest.get("stem", False))
        idents = bool(manifest.get("bm25_idents", False))
        BM25Index.build([tokenize(r[1], stem, idents) for r in rows]).save(os.path.join(gdir, "bm25"))
        manifest["dim"] = dim
        if manifest.get("graph"):
            if progress:
                progress("entity graph", 0, 1)
            _publish_graph(con, rows, gdir, report, getattr(opts, "graph_llm", None))
    fields = sorted({k for (k,) in con.execute(
        "SELECT DISTINCT j.key FROM chunks c JOIN docs d ON d.id = c.doc_id, json_each(c.meta) j "
        "WHERE d.gen_added <= ? AND (d.gen_removed IS NULL OR d.gen_removed > ?)", (gen, gen))})
    counts = {c: n for c, n in con.execute(
        "SELECT collection, COUNT(*) FROM docs WHERE gen_added <= ? AND (gen_removed IS NULL OR gen_removed > ?) "
        "GROUP BY collection", (gen, gen))}
    chunk_counts = dict(zip(*np.unique([r[5] for r in rows], return_counts=True))) if rows else {}
    colls = manifest.setdefault("collections", {})
    if keep_ids is None:
        colls[opts.collection] = {"chunker": opts.chunker, "sizes": list(opts.sizes), "overlap": opts.overlap,
                                  "parent_size": opts.parent_size}
    for name in list(colls):
        colls[name]["docs"] = int(counts.get(name, 0))
        colls[name]["chunks"] = int(chunk_counts.get(name, 0))
    manifest.update(generation=gen, fields=fields, index=report.index_type or manifest.get("index"),
                    collection_order=collections, updated=_now())
    write_manifest(directory, manifest)
    if remote is not None:
        _after_swap_remote(directory, manifest, gen, ids, remote)
    # the new generation is live: drop what only older generations needed, keeping generation N-1
    # (its rows and arrays) for readers that opened it just before the swap (readers take no lock)
    con.execute("BEGIN")
    doomed = "SELECT id FROM docs WHERE gen_removed IS NOT NULL AND gen_removed < ?"
    con.execute(f"DELETE FROM chunks WHERE doc_id IN ({doomed})", (gen,))
    con.execute(f"DELETE FROM parents WHERE doc_id IN ({doomed})", (gen,))
    con.execute("DELETE FROM docs WHERE gen_removed IS NOT NULL AND gen_removed < ?", (gen,))
    con.execute("COMMIT")
    for name in os.listdir(directory):
        m = re.fullmatch(r"gen-(\d+)", name)
        if m and int(m.group(1)) not in (gen, gen - 1):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _publish_graph(con, rows, gdir, report, llm=None) -> None:
    """Entities for live chunks that have none yet (graph enabled on an existing index), then the
    generation's graph arrays."""
    from llmkit.rag import graph

    have = {cid for (cid,) in con.execute("SELECT DISTINCT chunk_id FROM chunk_entities")}
    missing = [(r[0], r[1]) for r in rows if r[0] not in have]
    if missing:
        con.execute("BEGIN")
        _add_entities(con, missing, llm)
        con.execute("COMMIT")
    row_of = {r[0]: i for i, r in enumerate(rows)}

    def triples():
        for cid, ent, tf in con.execute("SELECT chunk_id, entity, tf FROM chunk_entities"):
            i = row_of.get(cid)
            if i is not None:
                yield i, ent, tf

    report.graph = graph.build(triples(), len(rows), os.path.join(gdir, "graph"))


def switch_model(directory: str, model: str, runtime: str = "onnx", progress=None) -> IndexReport:
    """Re-embed every chunk of the current generation with another model (the one `rag adapt`
    trained) and publish it as the next generation; chunks, BM25 and metadata stay as they are."""
    from llmkit.rag.embed import resolve_model

    t0 = time.perf_counter()
    path = resolve_model(model)
    with writer_lock(directory):
        manifest = read_manifest(directory)
        gen = manifest["generation"] + 1
        report = IndexReport(generation=gen)
        try:
            current = set(np.load(os.path.join(directory, f"gen-{manifest['generation']}", "rows.npy")).tolist())
        except (OSError, ValueError) as e:
            raise BadInput(f"index '{directory}' is damaged ({e}). Rebuild it with llmkit rag index.") from None
        manifest.update(model=path, dim=None, embed_runtime=runtime)
        con = _connect(directory)
        try:
            _rollback_unfinished(con, manifest["generation"])
            opts = IndexOptions(runtime=runtime, index_type=manifest.get("index") or "auto")
            _publish(directory, con, manifest, gen, opts, report, progress, keep_ids=current)
        finally:
            con.close()
    report.total_s = time.perf_counter() - t0
    return report


def _publish_remote(directory, manifest, gen, opts, rows, ids, keys, report, progress, switch: bool):
    """Write generation `gen`'s new rows to the served vector store (vstore.py): rows already there
    for the previous generation stay; vectors of unchanged text are read back instead of embedded.
    A model switch fills a new collection (the old one is dropped after the swap)."""
    from llmkit.rag.vstore import new_collection_name, open_store

    spec = manifest["store"]
    st = open_store(spec, directory)
    try:
        name = spec.get("collection")
        if name and not switch:
            st.delete_unfinished(name, manifest["generation"])
        prev_ids, prev_keys = _generation_rows(directory, manifest["generation"])
        if switch or not name:
            old, name = (name if switch else None), new_collection_name(directory)
            prev_ids, prev_keys = np.zeros(0, np.int64), np.zeros(0, "S32")
        else:
            old = None
        need = np.flatnonzero(~np.isin(ids, prev_ids))
        key_to_prev = dict(zip(prev_keys.tolist(), prev_ids.tolist()))
        reuse = [i for i in need.tolist() if keys[i] in key_to_prev]
        got = st.vectors(name, [key_to_prev[keys[i]] for i in reuse]) if reuse else {}
        reuse = [i for i in reuse if key_to_prev[keys[i]] in got]
        fresh = sorted(set(need.tolist()) - set(reuse))
        dim = manifest.get("dim") if not switch else None
        new = None
        if fresh:
            new, dim = _embed(manifest, opts, [rows[i][1] for i in fresh], dim, report, progress)
        if dim is None:  # nothing new to embed: the dimension is the collection's
            dim = st.dim_of(name)
        vecs = np.zeros((len(need), dim or 0), np.float32)
        pos = {r: j for j, r in enumerate(need.tolist())}
        for j, i in enumerate(fresh):
            vecs[pos[i]] = new[j]
        for i in reuse:
            vecs[pos[i]] = got[key_to_prev[keys[i]]]
        kind = manifest["index"] if (manifest.get("index") and not switch) else _index_kind(opts, len(rows))
        if dim:
            st.create(name, dim, kind, len(rows))
        if len(need):
            st.upsert(name, ids[need], vecs, gen,
                      progress=(lambda d, n: progress("writing vectors", d, n)) if progress else None)
        report.embedded, report.vectors_reused = len(fresh), len(rows) - len(fresh)
        report.index_type = kind
        manifest["store"] = {**spec, "collection": name}
    except BaseException:
        st.close()
        raise
    return (st, name, old), dim


def _generation_rows(directory, gen) -> tuple[np.ndarray, np.ndarray]:
    """Chunk ids and text hashes of generation `gen` (empty if it has none)."""
    try:
        return (np.load(os.path.join(directory, f"gen-{gen}", "rows.npy")),
                np.load(os.path.join(directory, f"gen-{gen}", "keys.npy")))
    except (OSError, ValueError):
        return np.zeros(0, np.int64), np.zeros(0, "S32")


def _after_swap_remote(directory, manifest, gen, ids, remote) -> None:
    """Generation `gen` is live: delete the store rows that only generations before it had (the
    previous two: a run killed after its swap left its deletions to this one), drop a replaced
    model's collection."""
    st, name, old = remote
    try:
        gone = np.setdiff1d(np.union1d(_generation_rows(directory, gen - 1)[0], _generation_rows(directory, gen - 2)[0]),
                            ids)
        if old:
            st.drop(old)
        elif len(gone):
            st.delete(name, gone)
    except BadInput:
        pass  # the swap is done; the next run deletes what is left (queries never see it: gen/rows filter)
    finally:
        st.close()


def _embed(manifest, opts, texts, dim, report, progress):
    """Vectors of `texts` with the index's model (on a Ray cluster with opts.ray)."""
    from llmkit.rag.embed import load_embedder

    model = None if manifest["model"] == "default" else manifest["model"]
    t = time.perf_counter()
    if getattr(opts, "ray", None):
        from llmkit.rag.ray_embed import embed_on_ray

        new, got_dim = embed_on_ray(texts, model, opts.runtime, manifest.get("embed_precision", "fp32"),
                                    manifest.get("query_prompt", ""), manifest.get("passage_prompt", ""),
                                    address=opts.ray, workers=opts.ray_workers, batch_size=opts.ray_batch,
                                    progress=(lambda d, n: progress("embedding (ray)", d, n)) if progress else None)
    else:
        emb = load_embedder(model, opts.runtime, manifest.get("embed_precision", "fp32"),
                            manifest.get("query_prompt", ""), manifest.get("passage_prompt", ""), progress=progress)
        got_dim = emb.dim
        _check_dim(got_dim, dim)  # before embedding: a wrong model is refused at once
        new = emb.passages(texts, progress=(lambda d, n: progress("embedding", d, n)) if progress else None)
    _check_dim(got_dim, dim)  # (Ray: known only from the vectors)
    report.embed_s = time.perf_counter() - t
    return new, got_dim


def _check_dim(got: int, dim: int | None) -> None:
    if dim and got != dim:
        raise BadInput(f"the embedding model gives {got}-d vectors but the index holds {dim}-d ones. "
                       "Use the model the index was built with.")


def _vectors(directory, manifest, opts, rows, keys, report, progress, reuse: bool = True):
    """Vectors for the live chunks: reused from the previous generation where the text is unchanged
    (same model: a model switch passes reuse=False)."""
    old_gen = os.path.join(directory, f"gen-{manifest['generation']}")
    old_vecs = None
    reuse_at: dict[bytes, int] = {}
    if reuse:
        try:
            old_keys = np.load(os.path.join(old_gen, "keys.npy"))
            old_vecs = np.load(os.path.join(old_gen, "vectors.npy"), mmap_mode="r")
            reuse_at = {k: i for i, k in enumerate(old_keys.tolist())}
        except (OSError, ValueError):
            old_vecs = None
    key_list = keys.tolist()
    need = [i for i, k in enumerate(key_list) if k not in reuse_at]
    have = [i for i, k in enumerate(key_list) if k in reuse_at]
    dim = manifest.get("dim")
    new = None
    if need:
        new, dim = _embed(manifest, opts, [rows[i][1] for i in need], dim, report, progress)
    vectors = np.zeros((len(rows), dim), np.float32)
    if need:
        vectors[need] = new
    if have:
        vectors[have] = old_vecs[[reuse_at[key_list[i]] for i in have]]
    report.embedded, report.vectors_reused = len(need), len(have)
    return vectors, dim


def _index_kind(opts: IndexOptions, n: int) -> str:
    """flat (exact) or hnsw: as asked, or exact up to `hnsw_above` vectors (auto)."""
    if opts.index_type == "auto":
        return "hnsw" if n > opts.hnsw_above else "flat"
    return opts.index_type


def _write_faiss(path: str, vectors: np.ndarray, opts: IndexOptions) -> str:
    """Exact inner-product search up to `hnsw_above` vectors, HNSW beyond (or as asked)."""
    import faiss

    kind = _index_kind(opts, len(vectors))
    if kind == "flat":
        index = faiss.IndexFlatIP(vectors.shape[1])
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(vectors.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
    else:
        raise BadInput(f"unknown index type {kind!r}; use auto, flat or hnsw.")
    index.add(np.ascontiguousarray(vectors))
    faiss.write_index(index, path + ".tmp")
    os.replace(path + ".tmp", path)
    return kind
