"""Past one machine, measured on one — rows for run.py (not a test).

    python benchmarks/run.py --area scale [--quick] [--part build|query|store|ray|batch] [--work DIR]

store  faiss (the default store, the anchor) vs Milvus Lite on the same real MiniLM vectors of
       kernel-doc paragraphs: `llmkit rag index` of both kinds and fresh-process `llmkit rag query`
       (whole processes); in-process insert time, query latency and recall@10 against exact search
       for faiss flat, faiss HNSW (M 32, efSearch 64) and Milvus Lite FLAT / IVF_FLAT. Proof that the
       IVF index is used: Milvus' own describe_index, and recall at nprobe 1 next to the nprobe llmkit
       uses (an exact scan would give the same recall at both).
ray    embedding passages/s: local ONNX (2 threads) vs Ray Data with 2 actors of 1 thread, same
       passages, each in its own child process (Ray's span includes actor start-up and model loads;
       ray.init reported apart).
batch  llama-server with SmolLM2-135M: sequential requests (the anchor) vs `llmkit server batch`
       on a server with 1 and with 4 slots; each child starts its own server (not timed).
query  a fresh `llmkit rag query` process (BM25, hybrid, hybrid with a --filter) over indexes of
       growing size: median wall and peak RSS, the index's size on disk, and the bytes a fresh open
       and one BM25 query read through read() (memory-mapped data is not read so); the smallest
       index is the anchor, so the ratio is the growth. The indexes are built (not timed) from
       kernel-doc paragraphs, each copy numbered (JSONL files of 10,000 records), with a tiny 32-d
       embedder so building 10⁶ chunks stays affordable; queries load the same embedder.
build  `llmkit rag index` of a tree of text files (kernel-doc paragraphs, numbered copies, 10 per
       file, 1000 files per directory) with the same tiny embedder, at growing sizes: a first run
       (wall, peak RSS, chunks/s against the smallest tree's), a re-run with nothing changed, a
       re-run after one file was edited (whole commands), and a first run killed with SIGKILL once
       the embedding journal holds half the chunks followed by the run that resumes it (its time
       against a full run's; the resumed index's chunks and top-10 hits compared with the full run's;
       when the killed run published its chunks for BM25 before embedding, how long that took).
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BASE_ENV, PY, ROOT, Cmd, Row, cmds_of, compare, field_stat, ratio, walls  # noqa: E402

ME = os.path.abspath(__file__)

PARTS = ("build", "query", "store", "ray", "batch")  # groups of rows that stand alone (run.py --part)


def paragraphs(n: int) -> list[str]:
    with open(os.path.join(ROOT, "tests/fixtures/kernel-docs.txt.gz"), "rb") as f:
        text = gzip.decompress(f.read()).decode("utf-8")
    return [p.strip() for p in text.split("\n\n") if 150 < len(p.strip()) < 1500][:n]


# -- children ---------------------------------------------------------------------------------------
def store_child(work: str, fa: str) -> None:
    import faiss
    import numpy as np

    from llmkit.rag.embed.embedder import load_embedder
    from llmkit.rag.index.milvus import MilvusStore, parse_store

    faiss.omp_set_num_threads(1)
    man = json.load(open(os.path.join(fa, "manifest.json")))
    vecs = np.load(os.path.join(fa, f"gen-{man['generation']}", "vectors.npy"))
    q = load_embedder().queries(json.load(open(os.path.join(work, "queries.json"))))
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(vecs)
    _, truth = flat.search(q, 10)
    lat = []
    for qi in q:
        t = time.perf_counter()
        flat.search(qi.reshape(1, -1), 10)
        lat.append(time.perf_counter() - t)
    out = {"faiss_flat_ms": 1000 * statistics.median(lat)}
    h = faiss.IndexHNSWFlat(vecs.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    h.hnsw.efConstruction = 80
    h.add(vecs)
    h.hnsw.efSearch = 64
    _, got = h.search(q, 10)

    def recall(hits):
        return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, hits)]))

    out["faiss_hnsw_recall"] = recall(got)
    st = MilvusStore(parse_store("milvus+local:bench.db", work), work)
    ids = np.arange(len(vecs))
    for kind in ("flat", "hnsw"):
        name = f"b_{kind}"
        st.drop(name)
        engine = st.create(name, vecs.shape[1], kind, len(vecs))
        t = time.perf_counter()
        st.upsert(name, ids, vecs, 1)
        ins = time.perf_counter() - t
        lat, hits = [], []
        for qi in q:
            t = time.perf_counter()
            hits.append(st.search(name, qi, 10, 1)[0])
            lat.append(time.perf_counter() - t)
        row = {"engine": engine, "insert_s": ins, "ms": 1000 * statistics.median(lat), "recall": recall(hits),
               "describe_index": {k: str(v) for k, v in (st.client.describe_index(name, "vec") or {}).items()}}
        if engine == "IVF_FLAT":
            nlist = st._index[name][1]
            row["nlist"], row["nprobe"] = nlist, max(16, nlist // 8)
            probe1 = []
            for qi in q:
                res = st.client.search(name, data=[qi.astype(np.float32).tolist()], filter="gen <= 1", limit=10,
                                       anns_field="vec", search_params={"metric_type": "IP", "params": {"nprobe": 1}})
                probe1.append([int(x["id"]) for x in res[0]])
            row["recall_nprobe1"] = recall(probe1)
        out[kind] = row
    st.close()
    out["n"], out["queries"] = len(vecs), len(q)
    print(json.dumps(out))


def ray_child(side: str, work: str) -> None:
    texts = json.load(open(os.path.join(work, "ray_texts.json")))
    from llmkit.rag.embed.embedder import load_embedder

    if side == "local":
        emb = load_embedder(threads=2)
        emb.passages(texts[:16])
        t = time.perf_counter()
        emb.passages(texts)
        print(json.dumps({"per_s": len(texts) / (time.perf_counter() - t)}))
        return
    import ray

    from llmkit.rag.embed.ray_embed import embed_on_ray

    t = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False)
    init = time.perf_counter() - t
    try:
        t = time.perf_counter()
        embed_on_ray(texts, None, "onnx", "fp32", "", "", address="auto", workers=2, batch_size=64)
        dt = time.perf_counter() - t
    finally:
        ray.shutdown()
    print(json.dumps({"per_s": len(texts) / dt, "init_s": init, "span_s": dt}))


def batch_child(mode: str, slots: int, work: str, n_predict: int) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from serverutil import start_server, stop_server

    from llmkit.llama.runtime import default_model_path

    path = os.path.join(work, "batch.jsonl")
    proc, url = start_server(default_model_path(), "-np", str(slots), "-c", str(512 * slots), "-t", "2")
    # both clients are whole processes timed from here (the server is already up): same span
    client = ([PY, ME, "sequential", url, path, str(n_predict)] if mode == "sequential" else
              [PY, "-m", "llmkit", "-q", "server", "batch", "--server", url, path, "-n", str(n_predict), "--temp", "0",
               "--seed", "1"])
    try:
        t = time.perf_counter()
        p = subprocess.run(client, check=True, capture_output=True, text=True, env={**os.environ, **BASE_ENV})
        dt = time.perf_counter() - t
    finally:
        stop_server(proc)
    toks = sum(json.loads(x)["stats"]["generated_tokens"] for x in p.stdout.splitlines() if x.startswith("{"))
    print(json.dumps({"tok_s": toks / dt, "tokens": toks, "s": dt}))


def sequential_client(url: str, path: str, n_predict: int) -> None:
    """The anchor: one /completion request at a time, no batching tool (a plain HTTP loop)."""
    import urllib.request

    for line in open(path):
        item = json.loads(line)
        body = json.dumps({"prompt": item["prompt"], "n_predict": n_predict, "temperature": 0, "seed": 1}).encode()
        req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            res = json.load(r)
        n = res.get("tokens_predicted", res.get("timings", {}).get("predicted_n", 0))
        print(json.dumps({"id": item["id"], "stats": {"generated_tokens": n}}))


def tiny_model_child(root: str) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from pathlib import Path

    from tinyst import write_tiny_models

    print(json.dumps({"model": str(write_tiny_models(Path(root))["st32"])}))


def open_child(idx: str, query: str) -> None:
    """Bytes read through read() by an Index open, one BM25 query and its hits' rows (Linux), after
    one such round has done the imports: what the index costs, not Python's modules."""
    from llmkit.rag.index.reader import Index
    from llmkit.rag.retrieve.hits import Hit, fetch

    def rchar() -> int:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar"))

    def once() -> int:
        ix = Index(idx)
        rows, scores = ix.bm25_list(ix.tok(query), 10)
        fetch(ix, [Hit(r, s) for r, s in zip(rows, scores)])
        ix.close()
        return len(rows)

    once()
    before = rchar()
    hits = once()
    print(json.dumps({"read_kb": (rchar() - before) / 1024, "hits": hits}))


def resume_child(tree: str, idx: str, model: str, full_idx: str, queries: str) -> None:
    """A first `rag index` killed with SIGKILL once its journal holds half the chunks, then the run
    that resumes it, timed; the result compared with the index of a full run."""
    import signal
    import sqlite3

    import numpy as np

    env = {**os.environ, **BASE_ENV, "LLMKIT_INDEX_BATCH": "256"}
    argv = [PY, "-m", "llmkit", "-q", "rag", "index", idx, tree, "--model", model, "--size", "1000", "--dedupe",
            "off", "--no-tune", "--json"]
    want = json.load(open(os.path.join(full_idx, "manifest.json")))["collections"]["default"]["chunks"] // 2

    def journal() -> int:
        try:
            con = sqlite3.connect(f"file:{os.path.join(idx, 'chunks.sqlite')}?mode=ro", uri=True, timeout=1)
            try:
                return con.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0]
            finally:
                con.close()
        except sqlite3.Error:
            return 0

    def pending() -> bool:
        try:
            return bool(json.load(open(os.path.join(idx, "manifest.json"))).get("pending"))
        except (OSError, ValueError):
            return False

    t0, searchable = time.perf_counter(), None
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while p.poll() is None and journal() < want:
        if searchable is None and pending():  # published for BM25, vectors still coming
            searchable = time.perf_counter() - t0
        time.sleep(0.02)
    killed = p.poll() is None
    if killed:
        os.kill(p.pid, signal.SIGKILL)
    p.wait()
    kept = journal()
    t = time.perf_counter()
    rep = json.loads(subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout)
    dt = time.perf_counter() - t

    def chunks(d):
        m = json.load(open(os.path.join(d, "manifest.json")))
        ids = np.load(os.path.join(d, f"gen-{m['generation']}", "rows.npy")).tolist()
        con = sqlite3.connect(os.path.join(d, "chunks.sqlite"))
        got = set()
        for lo in range(0, len(ids), 500):
            part = ids[lo:lo + 500]
            got.update(con.execute(f"SELECT d.path, c.text FROM chunks c JOIN docs d ON d.id = c.doc_id WHERE c.id IN "
                                   f"({','.join('?' * len(part))})", part).fetchall())
        con.close()
        return got

    def top(d, q):
        out = subprocess.run([PY, "-m", "llmkit", "-q", "rag", "query", d, q, "-k", "10", "--jsonl"], env=env,
                             check=True, capture_output=True, text=True).stdout
        return [(h["doc"], h["text"]) for h in map(json.loads, out.splitlines())]

    qs = json.load(open(queries))
    print(json.dumps({"killed": killed, "kept": kept, "searchable_s": searchable, "rerun_s": dt, "embedded": rep["embedded"],
                      "resumed": rep["vectors_resumed"], "chunks": rep["chunks_indexed"],
                      "same_chunks": chunks(idx) == chunks(full_idx),
                      "same_top10": sum(top(idx, q) == top(full_idx, q) for q in qs), "queries": len(qs)}))


def child(argv):
    if argv[0] == "resume":
        resume_child(*argv[1:6])
    elif argv[0] == "tinymodel":
        tiny_model_child(argv[1])
    elif argv[0] == "open":
        open_child(argv[1], argv[2])
    elif argv[0] == "store":
        store_child(argv[1], argv[2])
    elif argv[0] == "ray":
        ray_child(argv[1], argv[2])
    elif argv[0] == "batch":
        batch_child(argv[1], int(argv[2]), argv[3], int(argv[4]))
    elif argv[0] == "sequential":
        sequential_client(argv[1], argv[2], int(argv[3]))
    else:
        raise SystemExit(f"unknown child {argv[0]}")


# -- rows -------------------------------------------------------------------------------------------
def store_rows(cfg, n: int) -> list[Row]:
    work = cfg.tmp("scale")
    paras = paragraphs(n + 200)
    docs, queries = paras[:n], [" ".join(p.split(". ")[0].split()) for p in paras[n:n + 200]]
    djson = os.path.join(work, "docs.jsonl")
    with open(djson, "w") as f:
        for i, t in enumerate(docs):
            f.write(json.dumps({"id": i, "text": t}) + "\n")
    json.dump(queries, open(os.path.join(work, "queries.json"), "w"))
    fa, mv = os.path.join(work, "faiss"), os.path.join(work, "milvus")
    import shutil

    ia = Cmd("faiss", [PY, "-m", "llmkit", "-q", "rag", "index", fa, djson])
    ib = Cmd("milvus+local", [PY, "-m", "llmkit", "-q", "rag", "index", mv, djson, "--store", "milvus+local:"])
    runs = compare([ia, ib], cfg, warmup=False, min_runs=cfg.pick(3, 3, 1),
                   between=lambda lbl: shutil.rmtree(fa if lbl == "faiss" else mv, ignore_errors=True))
    a, b = walls(runs["faiss"]), walls(runs["milvus+local"])
    rows = [Row("scale-index", f"`rag index` of {len(docs)} paragraphs (embedding included), whole process",
                f"faiss {a.fmt()}", f"milvus+local {b.fmt()}", f"{ratio(b.median, a.median)} faiss's time",
                "smoke: one run each" if cfg.smoke else "",
                cmds_of(ia, ib))]
    qa = Cmd("faiss", [PY, "-m", "llmkit", "-q", "rag", "query", fa, queries[0], "-k", 5])
    qb = Cmd("milvus+local", [PY, "-m", "llmkit", "-q", "rag", "query", mv, queries[0], "-k", 5])
    runs = compare([qa, qb], cfg)
    a, b = walls(runs["faiss"]), walls(runs["milvus+local"])
    rows.append(Row("scale-query-process", "`rag query` hybrid, one query, fresh process", f"faiss {a.fmt()}",
                    f"milvus+local {b.fmt()}", f"{ratio(b.median, a.median)} faiss's time", "", cmds_of(qa, qb)))
    sc = Cmd("store", [PY, ME, "store", work, fa])
    runs = compare([sc], cfg, warmup=False)
    reps = [r.report for r in runs["store"]]
    last = reps[-1]
    flat_ms = field_stat(runs["store"], "faiss_flat_ms")
    cmds = cmds_of(sc)
    nq = last["queries"]
    rows.append(Row("scale-faiss-flat", f"faiss IndexFlatIP, {last['n']} vectors, {nq} first-sentence queries: "
                    "latency (in-process), recall@10", flat_ms.fmt("ms", 3), "–", "–", "recall 1.000 (it is the exact "
                    "reference)", cmds))
    rows.append(Row("scale-faiss-hnsw", "faiss HNSW M 32 efSearch 64 recall@10 vs exact (same vectors and queries)",
                    "exact = 1.000", f"{statistics.median(r['faiss_hnsw_recall'] for r in reps):.3f}", "–",
                    "compare rag-hnsw-recall-*: other vectors (400-character chunks)", cmds))
    for kind in ("flat", "hnsw"):
        k = [r[kind] for r in reps]
        eng = k[-1]["engine"]
        d = k[-1]["describe_index"]
        check = f"describe_index: {d}"
        if d.get("indexed_rows") == "0":
            check = "indexed_rows 0: searches scan unindexed rows, the engine's index is NOT used; " + check
        if eng == "IVF_FLAT":
            check = (f"nlist {k[-1]['nlist']}, nprobe {k[-1]['nprobe']}; recall at nprobe 1: "
                     f"{statistics.median(x['recall_nprobe1'] for x in k):.3f} (lower = the IVF index is used); " + check)
        rows.append(Row(f"scale-milvus-{eng.lower()}", f"Milvus Lite {eng}: insert, latency (in-process), recall@10 vs "
                        "exact", "–", f"insert {statistics.median(x['insert_s'] for x in k):.2f} s; "
                        f"{statistics.median(x['ms'] for x in k):.2f} ms; recall "
                        f"{statistics.median(x['recall'] for x in k):.3f}",
                        f"latency {ratio(statistics.median(x['ms'] for x in k), flat_ms.median)} faiss flat's", check,
                        cmds))
    return rows


def ray_rows(cfg, n: int) -> list[Row]:
    work = cfg.tmp("scale")
    json.dump(paragraphs(n), open(os.path.join(work, "ray_texts.json"), "w"))
    a, b = (Cmd(s, [PY, ME, "ray", s, work]) for s in ("local", "ray"))
    runs = compare([a, b], cfg, warmup=False)
    la, lb = field_stat(runs["local"], "per_s"), field_stat(runs["ray"], "per_s")
    init = field_stat(runs["ray"], "init_s")
    return [Row("scale-ray-embed", f"embedding {n} paragraphs, passages/s (in-process span)",
                f"local ONNX 2 threads {la.fmt('passages/s', 1)}",
                f"Ray Data 2 actors × 1 thread {lb.fmt('passages/s', 1)} (actor start-up and model loads included); "
                f"ray.init {init.fmt()}", f"{ratio(lb.median, la.median)} local", "", cmds_of(a, b))]


def batch_rows(cfg, items: int, n_predict: int) -> list[Row]:
    from harness import llama_bin

    if not llama_bin("llama-server"):
        return [Row.skipped("scale-batch", "server batch", "llama-server not built")]
    work = cfg.tmp("scale")
    with open(os.path.join(work, "batch.jsonl"), "w") as f:
        for i in range(items):
            f.write(json.dumps({"id": i, "prompt": f"Write a short note about topic number {i}: "}) + "\n")
    cmds = [Cmd("sequential, 1 slot", [PY, ME, "batch", "sequential", 1, work, n_predict]),
            Cmd("server batch, 1 slot", [PY, ME, "batch", "cli", 1, work, n_predict]),
            Cmd("server batch, 4 slots", [PY, ME, "batch", "cli", 4, work, n_predict])]
    runs = compare(cmds, cfg, warmup=False)
    s = {c.label: field_stat(runs[c.label], "tok_s") for c in cmds}
    base = s["sequential, 1 slot"]
    return [Row("scale-batch", f"{items} prompts × {n_predict} tokens, SmolLM2-135M, one llama-server (-t 2): tok/s "
                "(server start-up not timed)", f"sequential requests {base.fmt('tok/s', 1)}",
                f"server batch 1 slot {s['server batch, 1 slot'].fmt('tok/s', 1)}; 4 slots {s['server batch, 4 slots'].fmt('tok/s', 1)}",
                f"4 slots {ratio(s['server batch, 4 slots'].median, base.median)} sequential", "", cmds_of(*cmds))]


def _disk_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / 2**20


SHARD = 10_000  # records per JSONL file of the query rows' collections


def query_rows(cfg, sizes: list[int]) -> list[Row]:
    """Fresh-process `rag query` at growing index sizes (module doc)."""
    from harness import rss

    work = cfg.tmp("scale-query")
    env = {**os.environ, **BASE_ENV}
    model = json.loads(subprocess.run([PY, ME, "tinymodel", work], check=True, capture_output=True, text=True,
                                      env=env).stdout.splitlines()[-1])["model"]
    paras = paragraphs(10**9)
    query = " ".join(paragraphs(200)[123].split(". ")[0].split()[:8])
    langs = ("c", "py", "md", "rs")
    out, first = [], {}
    for n in sizes:
        docs, idx = os.path.join(work, f"docs-{n}"), os.path.join(work, f"idx-{n}")
        done = os.path.join(work, f"built-{n}.json")  # an index an earlier run built in this --work directory
        if not os.path.exists(done):
            os.makedirs(docs, exist_ok=True)
            for start in range(0, n, SHARD):  # JSONL shards of 10,000 records, each under the per-file cap
                with open(os.path.join(docs, f"part-{start // SHARD:05d}.jsonl"), "w") as f:
                    for i in range(start, min(start + SHARD, n)):
                        text = f"{paras[i % len(paras)]} (copy {i // len(paras)})"
                        f.write(json.dumps({"id": i, "text": text, "lang": langs[i % 4]}) + "\n")
            built = subprocess.run([PY, "-m", "llmkit", "-q", "rag", "index", idx, docs, "--model", model, "--dedupe",
                                    "off", "--no-tune", "--json"], check=True, capture_output=True, text=True, env=env)
            with open(done, "w") as f:
                f.write(built.stdout)
        chunks = json.loads(open(done).read())["chunks_indexed"]
        base = [PY, "-m", "llmkit", "-q", "rag", "query", idx, query, "-k", 10]
        cmds = [Cmd("bm25", base + ["--mode", "bm25"]), Cmd("hybrid", base),
                Cmd("hybrid --filter", base + ["--filter", "lang=py"])]
        runs = compare(cmds, cfg)
        got = {c.label: (walls(runs[c.label]), rss(runs[c.label])) for c in cmds}
        opened = compare([Cmd("open", [PY, ME, "open", idx, query])], cfg, warmup=False, min_runs=1, fast_runs=1)
        read_kb = field_stat(opened["open"], "read_kb")
        first = first or {k: s.median for k, (s, _) in got.items()}
        figures = "; ".join(f"{k} {s.fmt()}, peak RSS {r:.0f} MB" for k, (s, r) in got.items())
        growth = ", ".join(f"{k} {ratio(s.median, first[k])}" for k, (s, _) in got.items())
        out.append(Row(f"scale-query-{n}", f"fresh `rag query` process over {chunks} chunks (tiny 32-d embedder; "
                       f"index {_disk_mb(idx):.1f} MB on disk)", "smallest index" if n == sizes[0] else
                       f"{sizes[0]} records: " + ", ".join(f"{k} {v:.2f} s" for k, v in first.items()),
                       figures, growth, f"open + BM25 query + hits read {read_kb.median:.0f} KB through read()",
                       cmds_of(*cmds, Cmd("open", [PY, ME, "open", idx, query]))))
    return out


def _tree(root: str, n: int, paras: list[str]) -> None:
    """n paragraphs (numbered copies once the fixture runs out) in files of 10, 1000 files per
    directory, every file's mtime an hour back (a stat taken now is then trusted)."""
    old = time.time() - 3600
    for f in range(0, n, 10):
        d = os.path.join(root, f"d{f // 10000:03d}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"f{f // 10:06d}.txt")
        with open(path, "w") as out:
            out.write("\n\n".join(f"{paras[i % len(paras)]} (copy {i // len(paras)})" for i in range(f, min(f + 10, n))))
        os.utime(path, (old, old))


def build_rows(cfg, sizes: list[int]) -> list[Row]:
    """`rag index` at growing sizes: first run, unchanged re-run, one edited file, SIGKILL and resume."""
    import shutil

    from harness import rss

    work = cfg.tmp("scale-build")
    env = {**os.environ, **BASE_ENV}
    model = json.loads(subprocess.run([PY, ME, "tinymodel", work], check=True, capture_output=True, text=True,
                                      env=env).stdout.splitlines()[-1])["model"]
    paras = paragraphs(10**9)
    queries = os.path.join(work, "queries.json")
    json.dump([" ".join(p.split(". ")[0].split()[:8]) for p in paras[100:105]], open(queries, "w"))
    out, first_rate = [], None
    for n in sizes:
        tree, idx = os.path.join(work, f"tree-{n}"), os.path.join(work, f"idx-{n}")
        _tree(tree, n, paras)
        argv = [PY, "-m", "llmkit", "-q", "rag", "index", idx, tree, "--model", model, "--size", "1000", "--dedupe",
                "off", "--no-tune", "--json"]
        full = Cmd("first run", argv)
        runs = compare([full], cfg, warmup=False, min_runs=cfg.pick(1 if n > sizes[0] else 3, 1, 1), fast_runs=1,
                       between=lambda _: shutil.rmtree(idx, ignore_errors=True))
        w, chunks = walls(runs["first run"]), runs["first run"][-1].report["chunks_indexed"]
        rate = chunks / w.median
        first_rate = first_rate or rate
        out.append(Row(f"scale-build-index-{n}", f"`rag index` of {n // 10} files, {chunks} chunks (tiny 32-d embedder), "
                       "whole process", "smallest tree" if n == sizes[0] else f"{first_rate:.0f} chunks/s",
                       f"{w.fmt()}, peak RSS {rss(runs['first run']):.0f} MB, {rate:.0f} chunks/s",
                       f"chunks/s {ratio(rate, first_rate)} the smallest tree's", "", cmds_of(full)))
        same = Cmd("unchanged re-run", argv)
        runs = compare([same], cfg, warmup=False, fast_runs=1)
        rep = runs["unchanged re-run"][-1].report
        out.append(Row(f"scale-build-unchanged-{n}", f"`rag index` again, nothing changed ({n // 10} files)", "–",
                       f"{walls(runs['unchanged re-run']).fmt()}, peak RSS {rss(runs['unchanged re-run']):.0f} MB",
                       f"{ratio(walls(runs['unchanged re-run']).median, w.median)} the first run's",
                       f"documents added again: {rep['docs_added']}, embedded: {rep['embedded']}", cmds_of(same)))
        edited = os.path.join(tree, "d000", "f000000.txt")
        count = [0]

        def edit(_):
            count[0] += 1
            with open(edited, "a") as f:
                f.write(f"\n\nAn edit, number {count[0]}, about interrupt handlers.")

        one = Cmd("one file edited", argv)
        runs = compare([one], cfg, warmup=False, fast_runs=1, between=edit)
        rep = runs["one file edited"][-1].report
        out.append(Row(f"scale-build-onefile-{n}", f"`rag index` after one file was edited ({n // 10} files)", "–",
                       f"{walls(runs['one file edited']).fmt()}, peak RSS {rss(runs['one file edited']):.0f} MB",
                       f"{ratio(walls(runs['one file edited']).median, w.median)} the first run's",
                       f"documents added {rep['docs_added']}, embedded {rep['embedded']}", cmds_of(one)))
        res_idx = os.path.join(work, f"resume-{n}")
        resume = Cmd("killed, then resumed", [PY, ME, "resume", tree, res_idx, model, idx, queries])
        shutil.rmtree(idx, ignore_errors=True)
        subprocess.run(argv, check=True, capture_output=True, env=env)  # the reference: a clean full run
        runs = compare([resume], cfg, warmup=False, min_runs=1, fast_runs=1,
                       between=lambda _: shutil.rmtree(res_idx, ignore_errors=True))
        r = runs["killed, then resumed"][-1].report
        out.append(Row(f"scale-build-resume-{n}", f"a first run SIGKILLed once half its chunks were embedded, then "
                       f"the run that resumes it ({r['chunks']} chunks)", f"full run {w.median:.2f} s",
                       f"resuming run {r['rerun_s']:.2f} s: embedded {r['embedded']}, from the journal {r['resumed']}",
                       f"{ratio(r['rerun_s'], w.median)} a full run's",
                       f"killed mid-run: {r['killed']}; same chunks as a full run: {r['same_chunks']}; same top-10: "
                       f"{r['same_top10']}/{r['queries']} queries; the killed run was searchable by BM25 after "
                       + (f"{r['searchable_s']:.1f} s" if r["searchable_s"] is not None else "– (fewer than 16 "
                          "batches of chunks: one publish)"), cmds_of(resume)))
    return out


def rows(cfg):
    out = []
    if cfg.wants("build"):
        out += build_rows(cfg, cfg.pick([10_000, 100_000], [2_000], [200]))
    if cfg.wants("query"):
        out += query_rows(cfg, cfg.pick([10_000, 100_000, 1_000_000], [2_000, 20_000], [100, 400]))
    if cfg.wants("store"):
        out += store_rows(cfg, cfg.pick(3000, 400, 60))
    if cfg.wants("ray"):
        out += ray_rows(cfg, cfg.pick(600, 200, 40))
    if cfg.wants("batch"):
        out += batch_rows(cfg, cfg.pick(16, 8, 4), cfg.pick(64, 16, 8))
    return "index and query paths at growing sizes, Milvus Lite, Ray, llama-server batching", [
        "paragraphs of tests/fixtures/kernel-docs.txt.gz (150–1500 characters); store queries: first sentences of "
        "200 further paragraphs",
        "batch: each client (a plain sequential HTTP loop, or `llmkit server batch`) is a whole process timed "
        "by the child that started the server"], out


if __name__ == "__main__":
    child(sys.argv[1:])
