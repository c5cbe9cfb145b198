"""The index directory's manifest and its writer lock: the small part of the index that queries,
`rag info` and `rag eval` need (so they do not import the indexing code: chunkers, document
readers, tree-sitter).

manifest.json holds the format name and version, the current generation, the embedding model,
dimension and precision, collections, chunking parameters, metadata fields and the tuned fusion;
it is written last and atomically, so it always names a complete generation.

Format versions. Version 2 states every setting the readers use (`new_manifest` lists them). A
manifest of an older version is upgraded when it is read, one step per version (`MIGRATIONS`), and
readers only ever see the current shape; the next writer run writes it back in that shape, in the
same atomic manifest swap as its generation, so an interrupted run leaves the old manifest and the
old generation as they were. Migrations change the manifest only: every chunk, vector and BM25 term
of the old generation is read as it was written. A manifest of a newer version is refused.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from contextlib import contextmanager
from typing import Callable

from llmkit.errors import BadFileFormat, BadInput
from llmkit.bounded import load_json
from llmkit.errors import OptionError

FORMAT, VERSION = "llmkit-rag", 2
MANIFEST = "manifest.json"
DB = "chunks.sqlite"


def now() -> str:
    """The current UTC time, ISO 8601 to the second (manifest timestamps)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_manifest(directory: str) -> dict:
    """The index manifest, checked: an llmkit RAG index of a format this version can read."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory):
        raise BadInput(f"index '{directory}' does not exist. Build it first: llmkit rag index {directory} FILES...")
    try:
        with open(path, encoding="utf-8") as f:
            m = load_json(f.read(), f"'{path}'")
    except FileNotFoundError:
        raise BadFileFormat(f"'{directory}' is not an llmkit RAG index (no {MANIFEST}). "
                            f"Build one with: llmkit rag index DIR FILES...") from None
    except (OSError, ValueError) as e:
        raise BadFileFormat(f"'{path}' is not a readable index manifest ({e}).") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise BadFileFormat(f"'{directory}' is not an llmkit RAG index (manifest format {m.get('format') if isinstance(m, dict) else None!r}).")
    version = m.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BadFileFormat(f"'{path}' has no readable format version ({version!r}). Rebuild the index.")
    if version > VERSION:
        raise BadFileFormat(f"index '{directory}' has format version {version}, newer than this llmkit reads "
                            f"({VERSION}). Upgrade llmkit.")
    return upgrade(m)


def stored_version(directory: str) -> int:
    """The format version the manifest on disk is written in (`read_manifest` upgrades it)."""
    with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
        return load_json(f.read(), f"'{directory}'")["version"]


def new_manifest(model: str, embed_precision: str, embed_runtime: str, query_prompt: str, passage_prompt: str,
                 analysis: str, graph: bool, store: dict | None) -> dict:
    """The manifest of a new, empty index: every key of the current version."""
    return {"format": FORMAT, "version": VERSION, "generation": 0, "model": model, "dim": None,
            "embed_precision": embed_precision, "embed_runtime": embed_runtime, "query_prompt": query_prompt,
            "passage_prompt": passage_prompt, "created": now(), "updated": None, "collections": {},
            "collection_order": [], "fields": [], "index": None, "analysis": analysis, "bm25_idents": True,
            "ranking": "documents", "graph": graph, "store": store}  # `fusion`: added by `rag tune`


def _v1_to_v2(m: dict) -> dict:
    """Version 1 gained settings over its life and left them out when they had their first value;
    version 2 states each. Missing from a version 1 manifest: `analysis` (plain words, or Porter
    stems when it says `stem`), `bm25_idents` (identifiers were not split: false), `ranking` (hits
    were chunks), the embedding precision and prompts, an empty store (faiss), a collection's
    chunking unit (characters, recursive, 800). The tuned fusion's `k` is its `rrf_k`."""
    out = {**m, "version": 2}
    stem = bool(out.pop("stem", False))
    out["analysis"] = m.get("analysis") or ("porter" if stem else "plain")
    for key, first in (("bm25_idents", False), ("ranking", "chunks"), ("embed_precision", "fp32"),
                       ("embed_runtime", "onnx"), ("query_prompt", ""), ("passage_prompt", ""), ("dim", None),
                       ("collections", {}), ("collection_order", []), ("fields", []), ("index", None),
                       ("graph", False), ("store", None), ("created", None), ("updated", None)):
        out.setdefault(key, first)
    out["collections"] = {name: {"unit": "chars", "chunker": "recursive", "sizes": [800], **rec}
                          for name, rec in out["collections"].items()}
    if out.get("fusion"):
        fusion = dict(out["fusion"])
        if "k" in fusion:
            fusion["rrf_k"] = fusion.pop("k")
        out["fusion"] = fusion
    return out


MIGRATIONS = {1: _v1_to_v2}  # version -> the step to the next version


def upgrade(m: dict) -> dict:
    """A manifest in the current version's shape (a copy; `m` is left as it is)."""
    while m["version"] < VERSION:
        m = MIGRATIONS[m["version"]](m)
    return m


def write_manifest(directory: str, manifest: dict) -> None:
    """Replace the manifest atomically (temp file + rename)."""
    from llmkit.io import atomic_write_text

    atomic_write_text(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1, ensure_ascii=False))


LOCK = "writer.lock"
RETIRED = "retired"  # in a gen-N directory: its rows are being deleted; a reader opens the manifest again


def pin_generation(gdir: str):
    """Pin generation directory `gdir` for a reader: its rows.npy opened with a shared flock (kept for
    the reader's life; no writer retires a pinned generation). (file, retired): file is None when
    rows.npy is missing; retired is True when a writer retired it before the pin (read the manifest
    again: a newer generation is live)."""
    import fcntl

    try:
        f = open(os.path.join(gdir, "rows.npy"), "rb")
    except OSError:
        return None, os.path.exists(os.path.join(gdir, RETIRED))
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)  # a writer holds it exclusively only while it marks
    except OSError:  # a filesystem without flock: no pin, as before pins existed
        return f, False
    if os.path.exists(os.path.join(gdir, RETIRED)):
        f.close()
        return None, True
    return f, False


def try_retire(gdir: str) -> bool:
    """Mark a generation directory retired unless a reader pins it (True: no reader can start using
    it now, its rows may go)."""
    import fcntl

    try:
        f = open(os.path.join(gdir, "rows.npy"), "rb")
    except OSError:
        return True  # no rows: nothing a reader could use
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError:
            pass
        try:
            with open(os.path.join(gdir, RETIRED), "w"):
                pass
        except OSError:  # e.g. a full disk: keep the generation, a later run retires it
            return False
    return True


@contextmanager
def writer_lock(directory: str, wait: bool = True, on_wait: Callable[[str], None] | None = None):
    """Hold the index's writer lock (flock on DIR/writer.lock) for the block. A second writer waits
    (telling `on_wait`) or, with wait=False, fails at once; readers never take it. The kernel drops
    the lock when its holder dies, so a killed writer leaves nothing locked."""
    import fcntl

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            if not wait:
                raise OptionError("index '{directory}' is being written by another process (pid {holder}). "
                                  "Wait for it to finish, or run without {no_wait} to queue behind it.",
                                  directory=directory, holder=holder) from None
            if on_wait:
                on_wait(f"index '{directory}' is being written by another process (pid {holder}); waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)
