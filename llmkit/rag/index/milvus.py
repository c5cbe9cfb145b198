"""The served vector store (`vectors.py` has the protocol and the default faiss store): Milvus, through pymilvus, either embedded (`milvus+local:PATH.db`: Milvus Lite, the
Milvus engine run in-process by the same client library) or a Milvus Standalone/Distributed server
(`milvus://HOST:PORT`, `milvus+https://HOST:PORT`; token from MILVUS_TOKEN, as `user:password` or
an API key).

One engine collection per index (and per embedding model: a model switch fills a new collection
and drops the old one after the swap). Rows are keyed by chunk id and carry the generation that
added them; a query at generation G asks for `gen <= G` and keeps only ids of G's rows, so rows
of an unfinished run and rows removed but not yet deleted are never answered. Chunks, metadata and
BM25 stay in the index directory (SQLite and the BM25 arrays): Milvus's own BM25 uses its own
analyzer and does not reproduce rank-bm25's ranking.

Milvus Lite serves one `.db` file to one process at a time. Every llmkit process that opens one
takes `.NAME.db.llmkit.lock` beside it first (re-entrant within the process) and waits for it up to
LLMKIT_STORE_WAIT_SECONDS, so a query waits while a writer upserts and two writers take turns;
a writer opens the file only for its short store phases (never while it embeds), and closing the
store stops the in-process engine, so the next process can open the file at once.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import time
import uuid
import weakref

import numpy as np

from llmkit.errors import BadInput, MissingDependency
from llmkit.errors import OptionError
from llmkit.rag.index.vectors import rows_of_ids

SCHEMES = "faiss (default), milvus+local:PATH.db, milvus://HOST:PORT or milvus+https://HOST:PORT"
BATCH = 2000  # rows per insert request (Milvus caps a request at 64 MB by default)
MAX_IN_FILTER = 100_000  # allowed ids passed to the engine as `id in [...]`; more: over-fetch, filter here


def parse_store(uri: str | None, index_dir: str) -> dict | None:
    """The manifest record of a store URI (None: faiss in the index directory)."""
    if uri is None or uri in ("", "faiss"):
        return None
    m = re.fullmatch(r"milvus\+local:(.*)", uri)
    if m:
        path = m.group(1) or "milvus.db"
        if not path.endswith(".db"):
            raise OptionError("{store} {uri}: the embedded Milvus keeps its data in a file ending in .db, "
                              "e.g. milvus+local:{example}.db.", uri=uri, example=path.rstrip('/') or 'vectors')
        # a bare name lives in the index directory (moves with it); other paths are taken as given
        path = path if os.path.dirname(path) == "" else os.path.abspath(path)
        return {"engine": "milvus", "uri": f"milvus+local:{path}"}
    m = re.fullmatch(r"milvus(\+https?)?://([^/\s:]+)(?::(\d+))?/?", uri)
    if m:
        return {"engine": "milvus", "uri": uri.rstrip("/")}
    raise OptionError("unknown {store} '{uri}'. Use {schemes}.", uri=uri, schemes=SCHEMES)


def new_collection_name(index_dir: str) -> str:
    """A collection name of this index on a shared server: its directory name and a random tag."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", os.path.basename(os.path.abspath(index_dir)))[:40] or "index"
    return f"llmkit_{base}_{uuid.uuid4().hex[:8]}"


class MilvusStore:
    """Vectors of one index in one Milvus collection (id INT64 primary, gen INT64, vec FLOAT_VECTOR)."""

    def __init__(self, spec: dict, index_dir: str, timeout: float = 10.0):
        try:
            from pymilvus.exceptions import MilvusException
        except ImportError:
            raise MissingDependency("pymilvus", "store") from None
        import logging

        # its RPC error logs repeat what we say in one line (pymilvus sets levels on its own loggers)
        for name in ["pymilvus", *[n for n in logging.root.manager.loggerDict if n.startswith("pymilvus.")]]:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self.Error = MilvusException
        self.spec = spec
        self.local = spec["uri"].startswith("milvus+local:")
        uri = spec["uri"]
        self.where = uri
        self.target = None  # the embedded store's .db file, while this object holds it
        self.client = None
        if uri.startswith("milvus+local:"):
            path = uri[len("milvus+local:"):]
            target = path if os.path.isabs(path) else os.path.join(os.path.abspath(index_dir), path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            kwargs = {"uri": target}
        else:
            scheme = "https" if uri.startswith("milvus+https") else "http"
            kwargs = {"uri": scheme + "://" + uri.split("://", 1)[1], "token": os.environ.get("MILVUS_TOKEN", "")}
        self.timeout = timeout
        self._index: dict = {}
        _OPEN.add(self)
        if self.local:
            self.target = os.path.realpath(target)
            deadline = time.monotonic() + store_wait()
            _hold_local(self.target, deadline)
        try:
            self.client = self._connect(kwargs, deadline if self.local else 0.0)
        except BaseException:
            self.close()
            raise

    def _connect(self, kwargs: dict, deadline: float):
        """The pymilvus client; an embedded file still held by a process that is not llmkit (or an
        engine that has not quite stopped) is tried again until `deadline`."""
        from pymilvus import MilvusClient

        import warnings

        while True:
            try:
                with warnings.catch_warnings():  # milvus-lite 2.5 imports the deprecated pkg_resources
                    warnings.simplefilter("ignore")
                    # an alias of its own: pymilvus shares one connection per URI in a process, and
                    # closing one client would cut the others (a reader's and a writer's)
                    return MilvusClient(timeout=self.timeout, alias=f"llmkit-{uuid.uuid4().hex}", **kwargs)
            except self.Error as e:
                if self.local and "open local milvus failed" in str(e).lower() and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                if self.local and "open local milvus failed" in str(e).lower():
                    raise _busy(self.target, None) from None
                raise self._explain(e, "connect") from None
            except Exception as e:  # pymilvus wraps some connection failures in plain exceptions
                raise OptionError("cannot reach the Milvus store at {uri} ({why}). Start it, or check {store}.",
                                  uri=self.where, why=_first_line(e)) from None

    def _explain(self, e, action: str) -> BadInput:
        msg = _first_line(getattr(e, "message", None) or e)
        low = msg.lower()
        if "fail connecting" in low or "unavailable" in low or "deadline" in low or "refused" in low:
            return OptionError("cannot reach the Milvus store at {uri} ({why}). Start it, or check {store}.",
                               uri=self.where, why=msg)
        if "auth" in low or "password" in low or "token" in low or "permission" in low or getattr(e, "code", 0) == 1800:
            return BadInput(f"the Milvus store at {self.where} refused the credentials ({msg}). Set MILVUS_TOKEN to "
                            "user:password or an API key.")
        return BadInput(f"the Milvus store at {self.where} failed to {action} ({msg}).")

    def _call(self, action: str, fn, *a, **kw):
        try:
            return fn(*a, timeout=self.timeout if action != "insert" else max(self.timeout, 120), **kw)
        except self.Error as e:
            raise self._explain(e, action) from None

    def close(self) -> None:
        """Close the connection; for an embedded store, stop its engine and let the file go."""
        client, self.client = self.client, None
        try:
            if client is not None:
                client.close()
        except Exception:  # closing a dead connection must not hide the real error
            pass
        target, self.target = self.target, None
        if target is not None:
            _release_local(target)

    def __del__(self):  # a reader's Index is not closed explicitly: the file goes when it does
        if sys.is_finalizing():  # gRPC cannot close a channel then (it hangs): _close_open did it
            return
        try:
            self.close()
        except Exception:
            pass

    # -- collections -------------------------------------------------------------------------------
    def dim_of(self, name: str) -> int | None:
        """The vector dimension of collection `name` (None if it does not exist)."""
        if not self._call("list", self.client.has_collection, name):
            return None
        desc = self._call("describe", self.client.describe_collection, name)
        fields = {f["name"]: f for f in desc.get("fields", [])}
        if "vec" not in fields or "gen" not in fields:
            raise BadInput(f"collection '{name}' in {self.where} was not made by llmkit (no vec/gen fields). "
                           "Use another index directory, or drop the collection.")
        return int(fields["vec"]["params"]["dim"])

    def create(self, name: str, dim: int, kind: str, n: int = 0) -> str:
        """An empty collection for `dim`-d vectors with an inner-product index: exact (FLAT), or for
        `kind` hnsw HNSW on a server and IVF_FLAT in Milvus Lite (which has no HNSW). Returns the
        engine's index type."""
        from pymilvus import DataType

        have = self.dim_of(name)
        if have is not None:
            if have != dim:
                raise BadInput(f"collection '{name}' in {self.where} holds {have}-d vectors but the embedding model "
                               f"gives {dim}-d ones. Use the index's model, or another index directory.")
            return self.index_type(name)
        schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("gen", DataType.INT64)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=dim)
        params = self.client.prepare_index_params()
        if kind == "hnsw" and self.local:
            nlist = int(min(65536, max(16, 4 * np.sqrt(max(n, 1)))))
            params.add_index("vec", index_type="IVF_FLAT", metric_type="IP", params={"nlist": nlist})
        elif kind == "hnsw":
            params.add_index("vec", index_type="HNSW", metric_type="IP", params={"M": 32, "efConstruction": 80})
        else:
            params.add_index("vec", index_type="FLAT", metric_type="IP")
        self._call("create", self.client.create_collection, name, schema=schema, index_params=params)
        return self.index_type(name)

    def index_type(self, name: str) -> str:
        """The engine's index on the vectors (FLAT, HNSW, IVF_FLAT) and its build parameters."""
        if name not in self._index:
            info = self._call("describe", self.client.describe_index, name, "vec") or {}
            self._index[name] = (str(info.get("index_type", "FLAT")), int(info.get("nlist", 0) or 0))
        return self._index[name][0]

    def drop(self, name: str) -> None:
        if self._call("list", self.client.has_collection, name):
            self._call("drop", self.client.drop_collection, name)

    # -- rows --------------------------------------------------------------------------------------
    def upsert(self, name: str, ids: np.ndarray, vectors: np.ndarray, gen: int, progress=None) -> None:
        """Write rows (an id left by a killed run is overwritten)."""
        for lo in range(0, len(ids), BATCH):
            rows = [{"id": int(i), "gen": gen, "vec": v} for i, v in zip(ids[lo:lo + BATCH].tolist(),
                                                                           vectors[lo:lo + BATCH].tolist())]
            self._call("insert", self.client.upsert, name, rows)
            if progress:
                progress(min(lo + BATCH, len(ids)), len(ids))

    def delete(self, name: str, ids) -> None:
        ids = [int(i) for i in ids]
        for lo in range(0, len(ids), 10_000):
            self._call("delete", self.client.delete, name, ids=ids[lo:lo + 10_000])

    def delete_unfinished(self, name: str, gen: int) -> None:
        """Rows a killed run wrote for a generation that never went live."""
        self._call("delete", self.client.delete, name, filter=f"gen > {int(gen)}")

    def vectors(self, name: str, ids) -> dict[int, np.ndarray]:
        """Stored vectors of these ids (to reuse them for unchanged text)."""
        out: dict[int, np.ndarray] = {}
        ids = [int(i) for i in ids]
        for lo in range(0, len(ids), 1000):
            for r in self._call("read", self.client.get, name, ids=ids[lo:lo + 1000], output_fields=["vec"]):
                out[int(r["id"])] = np.asarray(r["vec"], np.float32)
        return out

    def search(self, name: str, q: np.ndarray, limit: int, gen: int, ids=None, ef: int = 64) -> tuple[list[int], list[float]]:
        """(chunk ids, inner products), best first, among rows of generations <= gen (and `ids`)."""
        expr = f"gen <= {int(gen)}"
        if ids is not None:
            expr += f" and id in [{','.join(str(int(i)) for i in ids)}]"
        kind = self.index_type(name)
        params = {"ef": max(ef, limit)} if kind == "HNSW" else (
            {"nprobe": max(16, self._index[name][1] // 8)} if kind == "IVF_FLAT" else {})
        res = self._call("search", self.client.search, name, data=[q.astype(np.float32).tolist()],
                         filter=expr, limit=min(limit, 16384), anns_field="vec",
                         search_params={"metric_type": "IP", "params": params})
        hits = res[0] if res else []
        return [int(h["id"]) for h in hits], [float(h["distance"]) for h in hits]


def store_wait() -> float:
    """Seconds to wait for an embedded store another process has open (LLMKIT_STORE_WAIT_SECONDS)."""
    from llmkit.bounded import limit

    return float(limit("LLMKIT_STORE_WAIT_SECONDS"))


_OPEN: "weakref.WeakSet[MilvusStore]" = weakref.WeakSet()  # stores not closed yet


@atexit.register
def _close_open() -> None:
    """At exit, while gRPC still works: close the stores nobody closed (a query's index view)."""
    for st in list(_OPEN):
        st.close()


# .db file -> [lock fd, users in this process]: Milvus Lite runs one engine per file per process
_HELD: dict[str, list] = {}
_HELD_LOCK = threading.Lock()


def lock_path(target: str) -> str:
    """The lock file llmkit takes before opening an embedded store's .db file."""
    return os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.llmkit.lock")


def _busy(target: str, holder: str | None) -> BadInput:
    n = int(store_wait())
    who = f"process {holder}" if holder else "another process"
    return BadInput(f"the embedded Milvus store '{target}' stayed in use by {who} for {n} s (Milvus Lite serves "
                    "one process at a time). Wait for it to finish, or raise LLMKIT_STORE_WAIT_SECONDS.")


def _hold_local(target: str, deadline: float) -> None:
    """Take the store's lock file for this process (flock; waits until `deadline`). The kernel drops
    it when its holder dies, so a killed process leaves nothing locked."""
    import fcntl

    with _HELD_LOCK:
        held = _HELD.get(target)
        if held is not None:
            held[1] += 1
            return
        fd = os.open(lock_path(target), os.O_RDWR | os.O_CREAT, 0o666)
        pause = 0.02
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or None
                        raise _busy(target, holder) from None
                    time.sleep(pause)
                    pause = min(0.2, pause * 1.5)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        _HELD[target] = [fd, 1]


def _release_local(target: str) -> None:
    """One user of the file fewer; the last one stops the in-process engine (pymilvus never does:
    its engine would keep the file until the process exits), then lets the lock go."""
    with _HELD_LOCK:
        held = _HELD.get(target)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _HELD[target]
        try:
            from milvus_lite.server_manager import server_manager_instance

            server_manager_instance.release_server(target)
        except Exception:  # the engine stops by itself once the lock below is gone
            pass
        os.close(held[0])


def _first_line(e) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__).rstrip(".")[:300]


def open_store(spec: dict, index_dir: str):
    """The engine behind a manifest's store record."""
    if spec.get("engine") == "milvus":
        return MilvusStore(spec, index_dir)
    raise BadInput(f"index '{index_dir}' names an unknown vector store {spec.get('engine')!r}; this llmkit "
                   f"knows {SCHEMES}.")


class MilvusVectors:
    """The vector-store protocol (`vectors.py`) over an index generation whose vectors live in Milvus:
    only ids of this generation are answered (a mask goes to the engine as an id list, or, for very
    large masks, is applied to an over-fetched answer)."""

    def __init__(self, index):
        self.index = index
        self.collection = index.manifest["store"]["collection"]

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        ix = self.index
        ids = [int(ix.rows[r]) for r in rows]
        got = ix.vstore.vectors(self.collection, ids)
        out = np.zeros((len(ids), ix.manifest.get("dim") or 0), np.float32)
        for i, cid in enumerate(ids):
            out[i] = got[cid]
        return out

    def vectors(self) -> np.ndarray:
        return self.of_rows(np.arange(self.index.n))

    def search(self, q: np.ndarray, depth: int, allowed) -> tuple[list[int], list[float]]:
        ix = self.index
        ids, limit = None, depth + 32  # + rows removed but not yet deleted, which are dropped below
        if allowed is not None:
            rows = np.flatnonzero(allowed)
            if len(rows) == 0:
                return [], []
            if len(rows) <= MAX_IN_FILTER:
                ids = ix.rows[rows]
            else:
                limit = min(16384, max(limit, int(limit * ix.n / len(rows)) + 32))
        got, scores = ix.vstore.search(self.collection, q, limit, ix.manifest["generation"], ids, ef=max(64, depth))
        out_r, out_s = [], []
        rows = rows_of_ids(ix.rows, got) if got else np.zeros(0, np.int64)
        row_of = dict(zip(ix.rows[rows].tolist(), rows.tolist()))
        for cid, s in zip(got, scores):
            r = row_of.get(cid)
            if r is None or (allowed is not None and not allowed[r]):
                continue
            out_r.append(int(r))
            out_s.append(s)
            if len(out_r) == depth:
                break
        return out_r, out_s
