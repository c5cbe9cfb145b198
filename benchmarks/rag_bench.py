"""RAG rows for run.py (not a test): BM25 against rank-bm25 and bm25s, dense and hybrid, indexing, Cranfield.

    python benchmarks/run.py --area rag [--quick]

- BM25 top-10 latency, in-process, the same span on every side: one query's tokens in, the
  top-10 document ids out. rank-bm25: `get_scores` + numpy `argpartition` top-10 (sorted by score,
  then id); bm25s (numba backend, `method="robertson"`, k1 1.5, b 0.75, 1 thread): `retrieve(k=10)`;
  llmkit: `BM25Index.top_k`. Same chunks, same tokens (llmkit's tokenizer, applied once in setup).
  Each side in its own child process, alternating; a child reports the median per-query latency.
  Check: top-10 lists identical to rank-bm25's.
- HNSW (M 32, efConstruction 80, efSearch 64) recall@10 against exact search, on real MiniLM
  vectors of the chunks, for BOTH query sets the README quoted (4-word BM25 queries; first
  sentences of held-out paragraphs) on the same vectors.
- Hybrid (BM25 top-100 + flat faiss top-100 + RRF) latency at N chunks, query embedding excluded;
  vectors beyond the real ones are the real ones tiled with small noise (flat search cost does not
  depend on the values). No anchor.
- `llmkit rag index --json` split: embedding vs everything else, size on disk.
- Cranfield: embedding passages/s (sentence-transformers torch = the anchor, ONNX fp32, ONNX int8);
  nDCG@10 per precision (`llmkit rag eval`); fresh-process `llmkit rag query` wall time.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Cmd, Row, cmds_of, compare, field_stat, ratio, run_once, speed, walls  # noqa: E402

ME = os.path.abspath(__file__)
CRANFIELD = os.path.join(ROOT, "examples", "data", "cranfield")  # shipped gzipped; scripts/cranfield.py reads it


# -- children ---------------------------------------------------------------------------------------
def bm25_child(impl: str, corpus_path: str, queries_path: str, out: str, rounds: int) -> None:
    import numpy as np

    corpus = json.load(open(corpus_path))
    queries = json.load(open(queries_path))
    t = time.perf_counter()
    if impl == "rank-bm25":
        import rank_bm25

        ref = rank_bm25.BM25Okapi(corpus)

        def top10(q):
            s = ref.get_scores(q)
            idx = np.argpartition(-s, 10)[:10]
            idx = idx[np.lexsort((idx, -s[idx]))]
            return [(int(d), float(s[d])) for d in idx if s[d] > 0]
    elif impl == "bm25s":
        import bm25s

        ref = bm25s.BM25(k1=1.5, b=0.75, method="robertson", backend="numba")
        ref.index(corpus, show_progress=False)
        vocab = ref.vocab_dict

        def top10(q):
            q = [w for w in q if w in vocab]
            if not q:
                return []
            docs, scores = ref.retrieve([q], k=10, backend_selection="numba", n_threads=1, show_progress=False)
            return [(int(d), float(s)) for d, s in zip(docs[0], scores[0]) if s > 0]
    else:
        from llmkit.rag.index.bm25 import BM25Index

        ours = BM25Index.build(corpus)

        def top10(q):
            return [(d, s) for d, s in ours.top_k(q, 10) if s > 0]
    build_s = time.perf_counter() - t
    top10(queries[0])  # first call compiles / warms (numba); not timed
    lat, tops = [], []
    for _ in range(rounds):
        tops = []
        for q in queries:
            t = time.perf_counter()
            tops.append(top10(q))
            lat.append(time.perf_counter() - t)
    json.dump(tops, open(out, "w"))
    print(json.dumps({"ms": 1000 * statistics.median(lat), "build_s": build_s}))


def embed_child(what: str, work: str, n_real: int) -> None:
    """Embed the chunks (real MiniLM vectors) and both query sets; save them for the other children."""
    import numpy as np

    from llmkit.rag.embed.embedder import load_embedder

    chunks = json.load(open(os.path.join(work, "chunks.json")))[:n_real]
    qsets = json.load(open(os.path.join(work, "query_texts.json")))
    emb = load_embedder()
    np.save(os.path.join(work, "vecs.npy"), emb.passages(chunks))
    for name, texts in qsets.items():
        np.save(os.path.join(work, f"q-{name}.npy"), emb.queries(texts))


def hnsw_child(work: str) -> None:
    import faiss
    import numpy as np

    faiss.omp_set_num_threads(1)
    v = np.load(os.path.join(work, "vecs.npy"))
    flat = faiss.IndexFlatIP(v.shape[1])
    flat.add(v)
    h = faiss.IndexHNSWFlat(v.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    h.hnsw.efConstruction = 80
    h.add(v)
    h.hnsw.efSearch = 64
    out = {}
    for name in ("bm25_4word", "first_sentence"):
        q = np.load(os.path.join(work, f"q-{name}.npy"))
        _, exact = flat.search(q, 10)
        _, got = h.search(q, 10)
        out[name] = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, exact)]))
        out[name + "_n"] = len(q)
    print(json.dumps(out))


def hybrid_child(work: str, n: int, rounds: int) -> None:
    import faiss
    import numpy as np

    from llmkit.rag.index.bm25 import BM25Index
    from llmkit.rag.retrieve.fusion import rrf

    faiss.omp_set_num_threads(1)
    corpus = json.load(open(os.path.join(work, "tokens.json")))[:n]
    queries = json.load(open(os.path.join(work, "queries.json")))
    real = np.load(os.path.join(work, "vecs.npy"))
    qv = np.load(os.path.join(work, "q-bm25_4word.npy"))
    rng = np.random.default_rng(0)
    vecs = np.tile(real, (-(-len(corpus) // len(real)), 1))[:len(corpus)]
    vecs = vecs + rng.normal(0, 0.02, vecs.shape).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ours = BM25Index.build(corpus)
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(vecs)
    lat = []
    for _ in range(rounds):
        for q, v in zip(queries, qv):
            t = time.perf_counter()
            b = [d for d, _ in ours.top_k(q, 100)]
            _, idx = flat.search(v.reshape(1, -1), 100)
            rrf([("bm25", 1.0, b, None), ("dense", 1.0, idx[0].tolist(), None)], 60)[:10]
            lat.append(time.perf_counter() - t)
    print(json.dumps({"p50_ms": 1000 * float(np.percentile(lat, 50)), "p95_ms": 1000 * float(np.percentile(lat, 95))}))


def _native_bf16() -> bool:
    """Does this CPU get bf16 by default (the precision a new index takes here)?"""
    from llmkit.rag.embed.openvino_runtime import native_bf16

    return native_bf16()


def throughput_child(runtime: str, precision: str, docs: str, n: int) -> None:
    from llmkit.rag.embed.embedder import load_embedder

    texts = [t for t in (json.loads(x)["text"] for x in open(docs, encoding="utf-8")) if t.strip()][:n]
    m = load_embedder(None, runtime, precision)
    m.passages(texts[:8])  # session / graph warm-up, not timed
    if hasattr(m, "encoder") and hasattr(m.encoder, "session_for"):
        from llmkit.rag.embed.onnx_runtime import BULK_TEXTS

        # the bulk session (packed weights, the bf16 graph) that indexing a collection uses, built untimed
        m.encoder.session_for(max(len(texts), BULK_TEXTS))
    t = time.perf_counter()
    m.passages(texts)
    print(json.dumps({"per_s": len(texts) / (time.perf_counter() - t), "n": len(texts)}))


def mcp_child(idx: str, queries_path: str, n: int) -> None:
    """Warm `search` calls through the MCP SDK's own stdio client against `llmkit rag serve IDX`: the
    call's round trip as a client sees it (server start-up and the first call not timed). Checks the
    top 10 of the first queries against fresh `llmkit rag query --jsonl` processes."""
    import subprocess

    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    qs = [json.loads(x)["text"] for x in open(queries_path, encoding="utf-8") if x.strip()][:n]
    got: dict[str, list] = {}
    lat: list[float] = []
    started = {}

    async def session():
        t0 = time.perf_counter()
        params = StdioServerParameters(command=sys.executable, args=["-m", "llmkit", "-q", "rag", "serve", idx],
                                       env=dict(os.environ))
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            await s.call_tool("search", {"query": "warm up", "k": 10})
            started["s"] = time.perf_counter() - t0
            for q in qs:
                t = time.perf_counter()
                res = await s.call_tool("search", {"query": q, "k": 10})
                lat.append(time.perf_counter() - t)
                got[q] = [h["chunk_id"] for h in res.structured_content["hits"]]

    anyio.run(session)
    same = 0
    for q in qs[:3]:
        out = subprocess.run([sys.executable, "-m", "llmkit", "-q", "rag", "query", idx, q, "-k", "10", "--jsonl"],
                             capture_output=True, text=True, check=True).stdout
        same += [json.loads(x)["chunk_id"] for x in out.splitlines()] == got[q]
    lat.sort()
    print(json.dumps({"p50_ms": 1000 * statistics.median(lat), "p95_ms": 1000 * lat[int(0.95 * (len(lat) - 1))],
                      "n": len(lat), "start_s": started["s"], "same_top10": same, "checked": min(3, len(qs))}))


def watch_child(docs: str, work: str, n_docs: int, n_edits: int) -> None:
    """`llmkit rag index IDX DIR --watch` over `n_docs` Markdown files (Cranfield abstracts): `n_edits`
    edits one after another, each timed from the write to the first query (BM25, a word only the
    edit has) that finds it through `rag serve`'s Searcher (which follows generations); then 200
    edits in a burst, timed to the index holding exactly the last text of every file."""
    import re
    import subprocess

    from llmkit.rag.index.reader import Index
    from llmkit.rag.serve import Searcher

    tree, idx = os.path.join(work, "watched"), os.path.join(work, "watch-idx")
    shutil.rmtree(tree, ignore_errors=True)
    shutil.rmtree(idx, ignore_errors=True)
    os.makedirs(tree)
    recs = [json.loads(x) for x in open(docs, encoding="utf-8") if x.strip()][:n_docs]
    for i, r in enumerate(recs):
        with open(os.path.join(tree, f"d{i}.md"), "w", encoding="utf-8") as f:
            f.write(f"# {r.get('title') or r['id']}\n\n{r['text']}\n")
    err = open(os.path.join(work, "watch.err"), "w")
    # SIGINT at its default, as in a terminal: run.py started in the background inherits it ignored
    p = subprocess.Popen([sys.executable, "-m", "llmkit", "-q", "rag", "index", idx, tree, "--watch", "--json",
                          "--no-tune"], stdout=subprocess.PIPE, stderr=err, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    passes = []
    threading.Thread(target=lambda: passes.extend(json.loads(x) for x in p.stdout), daemon=True).start()

    def until(cond, what, limit=600.0):
        t = time.time()
        while not cond():
            if p.poll() is not None or time.time() - t > limit:
                tail = open(os.path.join(work, "watch.err"), errors="replace").read()[-1500:]
                raise SystemExit(f"watch child: no {what} (watcher exit {p.poll()}); its stderr ends:\n{tail}")
            time.sleep(0.02)

    try:
        until(lambda: passes, "first pass")
        first_s = passes[0]["total_s"]
        searcher = Searcher(idx)
        edits, pass_s = [], []
        for e in range(n_edits):
            path = os.path.join(tree, f"d{e % len(recs)}.md")
            token = f"zq{e}marker"
            before = len(passes)
            t = time.perf_counter()
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"\nEdit {e}: {token}.\n")
            until(lambda: any(token in h["text"] for h in searcher.search(token, 1, "bm25")["hits"]), "edit")
            edits.append(time.perf_counter() - t)
            until(lambda: len(passes) > before, "pass record")
            pass_s.append(passes[-1]["total_s"])
        final = {}
        t = time.perf_counter()
        for n in range(200):
            path = os.path.join(tree, f"burst{n % 25}.md")
            text = f"# Burst {n % 25}\n\nBurst edit {n}: bq{n}z.\n"
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            final[path] = f"bq{n}z"

        def settled():
            ix = Index(idx)
            try:
                rows = ix.rows.tolist()
                got = ix.con.execute(f"SELECT d.path, c.text FROM chunks c JOIN docs d ON d.id = c.doc_id WHERE "
                                     f"c.id IN ({','.join('?' * len(rows))}) AND d.path LIKE '%burst%'", rows).fetchall()
            finally:
                ix.close()
            return len(got) == len(final) and all(re.findall(r"bq\d+z", txt) == [final[pth]] for pth, txt in got)

        until(settled, "settled burst")
        burst_s = time.perf_counter() - t
        searcher.close()
    finally:
        p.send_signal(2)
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            tail = open(os.path.join(work, "watch.err"), errors="replace").read()[-1500:]
            raise SystemExit(f"watch child: the watcher ignored Ctrl-C for 120 s; its stderr ends:\n{tail}")
    print(json.dumps({"edit_p50_s": statistics.median(edits), "edit_max_s": max(edits), "pass_p50_s":
                      statistics.median(pass_s), "first_pass_s": first_s, "burst_s": burst_s, "n_docs": len(recs),
                      "n_edits": len(edits), "exit": p.returncode}))


def child(argv):
    what = argv[0]
    if what == "bm25":
        bm25_child(argv[1], argv[2], argv[3], argv[4], int(argv[5]))
    elif what == "embed":
        embed_child(*argv[:2], int(argv[2]))
    elif what == "hnsw":
        hnsw_child(argv[1])
    elif what == "hybrid":
        hybrid_child(argv[1], int(argv[2]), int(argv[3]))
    elif what == "throughput":
        throughput_child(argv[1], argv[2], argv[3], int(argv[4]))
    elif what == "mcp":
        mcp_child(argv[1], argv[2], int(argv[3]))
    elif what == "watch":
        watch_child(argv[1], argv[2], int(argv[3]), int(argv[4]))
    else:
        raise SystemExit(f"unknown child {what}")


# -- setup ------------------------------------------------------------------------------------------
def make_inputs(cfg, n_chunks: int, n_queries: int, n_real: int) -> tuple[str, str]:
    """chunks.json (texts), tokens.json, queries.json (4-word token lists), query_texts.json (both sets)."""
    import numpy as np

    from llmkit.rag.chunk.spans import recursive_spans
    from llmkit.rag.index.bm25 import tokenize

    work = cfg.tmp("rag")
    src = os.path.join(ROOT, "data/kernel-docs.txt")
    if os.path.exists(src):
        text, name = open(src, encoding="utf-8").read(), "data/kernel-docs.txt"
    else:
        with gzip.open(os.path.join(ROOT, "tests/fixtures/kernel-docs.txt.gz"), "rt", encoding="utf-8") as f:
            text, name = f.read(), "tests/fixtures/kernel-docs.txt.gz (data/kernel-docs.txt missing)"
    paras = [p for p in text.split("\n\n") if p.strip()]
    held = [p.strip() for p in paras[-400:] if 150 < len(p.strip()) < 1500][:n_queries]  # first-sentence queries
    paras = paras[:-400]
    chunks: list[str] = []
    passes = 0
    while len(chunks) < n_chunks:
        passes += 1
        for p in paras:
            chunks.extend(s.text for s in recursive_spans(p, 400, 0))
            if len(chunks) >= n_chunks:
                break
    chunks = chunks[:n_chunks]
    tokens = [tokenize(t) for t in chunks]
    rng = np.random.default_rng(1)
    queries = []
    for i in rng.choice(min(len(chunks), n_real), n_queries, replace=False):
        toks = tokens[i]
        s = int(rng.integers(0, max(1, len(toks) - 4)))
        queries.append(toks[s:s + 4])
    for fname, obj in (("chunks.json", chunks), ("tokens.json", tokens), ("queries.json", queries),
                       ("query_texts.json", {"bm25_4word": [" ".join(q) for q in queries],
                                             "first_sentence": [p.split(". ")[0] for p in held]})):
        json.dump(obj, open(os.path.join(work, fname), "w"))
    return work, (f"{n_chunks} chunks (400-character recursive chunks of {name}"
                  f"{f', the text repeated {passes}×' if passes > 1 else ''}), {n_queries} queries")


# -- rows -------------------------------------------------------------------------------------------
def same_ranking(a: list, b: list, tol: float = 1e-6) -> bool:
    """Two top-k lists of (doc, score) rank alike: equal length, scores equal within `tol` (relative)
    position by position, and the same documents within every run of tied scores. argpartition picks
    among documents tied at the k-th score by chance, so the last run may hold different documents."""
    if len(a) != len(b) or any(abs(x[1] - y[1]) > tol * max(1.0, abs(x[1])) for x, y in zip(a, b)):
        return False
    i = 0
    while i < len(a):
        j = i + 1
        while j < len(a) and abs(a[j][1] - a[i][1]) <= tol * max(1.0, abs(a[i][1])):
            j += 1
        if j < len(a) and {d for d, _ in a[i:j]} != {d for d, _ in b[i:j]}:
            return False
        i = j
    return True


def bm25_rows(cfg, work: str, n_chunks: int) -> list[Row]:
    rounds = cfg.pick(5, 3, 2)
    sides = [("rank-bm25", "rank-bm25"), ("bm25s (numba)", "bm25s"), ("llmkit", "llmkit")]
    cmds = [Cmd(lbl, [PY, ME, "bm25", impl, os.path.join(work, "tokens.json"), os.path.join(work, "queries.json"),
                      os.path.join(work, f"top-{impl}.json"), rounds]) for lbl, impl in sides]
    runs = compare(cmds, cfg, warmup=False)
    ms = {c.label: field_stat(runs[c.label], "ms") for c in cmds}
    build = {c.label: field_stat(runs[c.label], "build_s") for c in cmds}
    tops = {impl: json.load(open(os.path.join(work, f"top-{impl}.json"))) for _, impl in sides}
    same = {impl: sum(same_ranking(a, b) for a, b in zip(tops["rank-bm25"], tops[impl]))
            for impl in ("bm25s", "llmkit")}
    nq = len(tops["rank-bm25"])
    r, s, k = ms["rank-bm25"], ms["bm25s (numba)"], ms["llmkit"]
    return [
        Row("rag-bm25-top10", f"BM25 top-10 per query, {n_chunks} chunks, in-process (median per-query latency)",
            f"rank-bm25 get_scores+argpartition {r.fmt('ms', 2)}; bm25s numba {s.fmt('ms', 3)}", k.fmt("ms", 3),
            f"{speed(r.median, k.median, 'rank-bm25')}; {speed(s.median, k.median, 'bm25s')}",
            f"top-10 the same ranking as rank-bm25's (scores within 1e-6, ties in any order): llmkit "
            f"{same['llmkit']}/{nq}, bm25s {same['bm25s']}/{nq} (bm25s' Robertson idf has no negative-idf floor)",
            cmds_of(*cmds)),
        Row("rag-bm25-build", f"BM25 index build, {n_chunks} tokenized chunks, in-process",
            f"rank-bm25 {build['rank-bm25'].fmt()}; bm25s {build['bm25s (numba)'].fmt()}", build["llmkit"].fmt(),
            f"{speed(build['rank-bm25'].median, build['llmkit'].median, 'rank-bm25')}; "
            f"{speed(build['bm25s (numba)'].median, build['llmkit'].median, 'bm25s')}", "", cmds_of(*cmds))]


def dense_rows(cfg, work: str, n_chunks: int, n_real: int) -> list[Row]:
    emb = Cmd("setup: embed chunks and queries (MiniLM, ONNX)", [PY, ME, "embed", work, n_real])
    run_once(emb)
    h = Cmd("faiss HNSW vs flat", [PY, ME, "hnsw", work])
    rep = run_once(h).report
    rows = [Row(f"rag-hnsw-recall-{name.replace('_', '-')}",
                f"HNSW M32 efSearch 64 recall@10 vs exact, {n_real} real MiniLM chunk vectors, {rep[name + '_n']} "
                f"{'4-word BM25' if name == 'bm25_4word' else 'first-sentence'} queries", "exact (flat) = 1.000",
                f"{rep[name]:.3f}", "", "same vectors, the other query set in the row beside", cmds_of(emb, h))
            for name in ("bm25_4word", "first_sentence")]
    hy = Cmd("llmkit hybrid", [PY, ME, "hybrid", work, n_chunks, cfg.pick(5, 3, 1)])
    runs = compare([hy], cfg, warmup=False)
    p50, p95 = field_stat(runs[hy.label], "p50_ms"), field_stat(runs[hy.label], "p95_ms")
    rows.append(Row("rag-hybrid-latency", f"hybrid BM25 top-100 + flat faiss top-100 + RRF, {n_chunks} chunks, query "
                    "embedding excluded, in-process", "–", f"p50 {p50.fmt('ms', 1)}; p95 {p95.fmt('ms', 1)}", "–",
                    f"{n_real} real vectors tiled with noise", cmds_of(hy)))
    return rows


def build_row(cfg, work: str, n_docs: int, per: int) -> Row:
    chunks = json.load(open(os.path.join(work, "chunks.json")))
    docs = os.path.join(work, "docs.jsonl")
    with open(docs, "w", encoding="utf-8") as f:
        for i in range(n_docs):
            f.write(json.dumps({"id": i, "text": "\n\n".join(chunks[i * per:(i + 1) * per])}) + "\n")
    idx = os.path.join(work, "build-idx")
    c = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "rag", "index", idx, docs, "--size", "400", "--overlap", "50", "--json"])
    runs = compare([c], cfg, warmup=False, between=lambda _: shutil.rmtree(idx, ignore_errors=True))
    rep = [r.report for r in runs[c.label]]
    emb = statistics.median(r["embed_s"] for r in rep)
    other = statistics.median(r["total_s"] - r["embed_s"] for r in rep)
    size = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(idx) for n in ns)
    n = rep[0]["chunks_indexed"]
    return Row("rag-index-build", f"`rag index` of {n_docs} documents ({n} chunks): embedding vs everything else",
               "–", f"embedding {emb:.1f} s, rest {other:.1f} s ({100 * other / max(emb, 1e-9):.0f}%); whole process "
               f"{walls(runs[c.label]).fmt()}", "–", f"{size / max(n, 1) / 1024:.1f} kB per chunk on disk", cmds_of(c))


def cranfield_rows(cfg) -> list[Row]:
    if not os.path.isdir(CRANFIELD):
        return [Row.skipped("rag-cranfield", "Cranfield rows", f"no collection at {CRANFIELD}")]
    work = cfg.tmp("cranfield")
    conv = Cmd("setup", [PY, os.path.join(ROOT, "scripts", "cranfield.py"), CRANFIELD, "-o", work])
    run_once(conv)
    docs = os.path.join(work, "docs.jsonl")
    n = cfg.pick(1400, 150, 24)
    sides = [("sentence-transformers (torch)", "torch", "fp32"), ("ONNX fp32", "onnx", "fp32"),
             ("OpenVINO bf16", "onnx", "bf16"), ("ONNX int8", "onnx", "int8")]
    cmds = [Cmd(lbl, [PY, ME, "throughput", rt, p, docs, n]) for lbl, rt, p in sides]
    runs = compare(cmds, cfg, warmup=False)  # each child warms its own session before the timed span
    s = {c.label: field_stat(runs[c.label], "per_s") for c in cmds}
    base = s[sides[0][0]].median
    rows = [Row("rag-embed-throughput", f"embedding Cranfield title+abstract, first {n} passages, in-process "
                "(the embed call only), 2 threads", f"torch {s[sides[0][0]].fmt('passages/s', 1)}",
                "; ".join(f"{lbl} {s[lbl].fmt('passages/s', 1)}" for lbl, _, _ in sides[1:]),
                ", ".join(f"{lbl} {ratio(s[lbl].median, base)}" for lbl, _, _ in sides[1:]) + " of torch",
                f"bf16 on this CPU: {'native (OpenVINO chooses it)' if _native_bf16() else 'not native (fp32 products)'}",
                cmds_of(*cmds))]
    builds = cfg.pick([("torch", "fp32"), ("onnx", "fp32"), ("onnx", "bf16"), ("onnx", "int8")],
                      [("onnx", "fp32"), ("onnx", "bf16"), ("onnx", "int8")], [("onnx", "fp32")])
    limit = cfg.pick(None, None, 10)
    src = docs
    if cfg.smoke:  # a handful of documents: the plumbing only
        src = os.path.join(work, "docs-small.jsonl")
        open(src, "w").writelines(open(docs).readlines()[:40])
    evals = []
    for rt, p in builds:
        idx = os.path.join(work, f"idx-{rt}-{p}")
        b = Cmd(f"index {rt} {p}", [PY, "-m", "llmkit", "-q", "rag", "index", idx, src, "--runtime", rt,
                                    "--embed-precision", p, "--json"])
        rep = run_once(b).report
        e = Cmd(f"eval {rt} {p}", [PY, "-m", "llmkit", "-q", "rag", "eval", idx, "--queries",
                                   os.path.join(work, "queries.jsonl"), "--qrels", os.path.join(work, "qrels.txt"),
                                   "-c", "bm25", "-c", "dense", "-c", "hybrid", "--jsonl",
                                   *(["--limit", limit] if limit else [])])
        out = os.path.join(work, f"eval-{rt}-{p}.jsonl")
        e.stdout = out
        run_once(e)
        nd = {json.loads(x)["config"]: json.loads(x)["ndcg@10"] for x in open(out) if x.strip()}
        evals.append((rt, p, rep, nd, b, e))
    for rt, p, rep, nd, b, e in evals:
        rows.append(Row(f"rag-cranfield-{rt}-{p}", f"Cranfield index ({rt} {p}): chunks/s while indexing; nDCG@10",
                        "–", f"{rep['chunks_indexed']} chunks, {rep['chunks_indexed'] / max(rep['embed_s'], 1e-9):.1f} "
                        f"chunks/s; nDCG@10 " + ", ".join(f"{k} {v:.4f}" for k, v in nd.items()), "–",
                        "one run (quality figure; chunks/s from the index report)", cmds_of(b, e)))
    rows.append(index_process_row(cfg, work, src, {(rt, p): nd for rt, p, _, nd, _, _ in evals}))
    idx = os.path.join(work, "idx-onnx-fp32")
    q = "what similarity laws must be obeyed when constructing aeroelastic models of heated high speed aircraft"
    cases = [("hybrid", "onnx"), ("dense", "onnx"), ("bm25", "onnx"), ("hybrid", "torch")]
    qc = [Cmd(f"--mode {m} --runtime {rt}", [PY, "-m", "llmkit", "-q", "rag", "query", idx, q, "--mode", m, "--runtime",
                                             rt, "-k", 5]) for m, rt in cases]
    runs = compare(qc, cfg)
    w = {c.label: walls(runs[c.label]) for c in qc}
    rows.append(Row("rag-query-process", "`llmkit rag query`, one query, fresh process (ONNX fp32 index)",
                    f"--runtime torch hybrid {w['--mode hybrid --runtime torch'].fmt()}",
                    "; ".join(f"{m} {w[f'--mode {m} --runtime onnx'].fmt()}" for m in ("hybrid", "dense", "bm25")),
                    "hybrid: " + speed(w['--mode hybrid --runtime torch'].median, w['--mode hybrid --runtime onnx'].median,
                                       "torch"), "", cmds_of(*qc)))
    from rag_models import model_rows  # GGUF / ONNX / torch on the same weights, re-ranking, Chinese

    rows += model_rows(cfg, work, src, os.path.join(work, "queries.jsonl"), os.path.join(work, "qrels.txt"))
    rows += serve_rows(cfg, work, idx, w["--mode hybrid --runtime onnx"], qc[0])
    rows += watch_rows(cfg, work, src)
    return rows


def index_process_row(cfg, work: str, docs: str, ndcg: dict) -> Row:
    """The whole `rag index` command on Cranfield into an empty directory, alternating: the torch
    runtime (sentence-transformers) against the ONNX fp32 path, bf16 (OpenVINO) and int8."""
    sides = [("torch", "fp32"), ("onnx", "fp32"), ("onnx", "bf16"), ("onnx", "int8")]
    cmds = []
    for rt, p in sides:
        idx = os.path.join(work, f"proc-{rt}-{p}")
        line = " ".join([PY, "-m", "llmkit", "-q", "rag", "index", idx, docs, "--runtime", rt, "--embed-precision", p])
        cmds.append(Cmd(f"{rt} {p}", ["sh", "-c", f"rm -rf {idx} && exec {line}"]))
    runs = compare(cmds, cfg, warmup=False, min_runs=cfg.pick(3, 3, 1), fast_runs=cfg.pick(3, 3, 1))
    w = {c.label: walls(runs[c.label]) for c in cmds}
    base = w["torch fp32"].median
    default = "bf16" if _native_bf16() else "fp32"
    nd = "; ".join(f"{rt} {p} dense {ndcg[(rt, p)]['dense']:.4f}" for rt, p in sides if (rt, p) in ndcg)
    return Row("rag-index-process", "`rag index` of Cranfield into an empty directory, whole process, 2 threads",
               f"--runtime torch {w['torch fp32'].fmt()}",
               "; ".join(f"{p}{' (default here)' if p == default else ''} {w['onnx ' + p].fmt()}"
                         for p in ("fp32", "bf16", "int8")),
               "; ".join(f"{p} {speed(base, w['onnx ' + p].median, 'torch')}" for p in ("fp32", "bf16", "int8")),
               f"nDCG@10 from the rag-cranfield rows: {nd}" if nd else "", cmds_of(*cmds))


def serve_rows(cfg, work: str, idx: str, fresh, fresh_cmd: Cmd) -> list[Row]:
    """`rag serve`: a warm MCP `search` call vs a fresh `rag query` process on the same index."""
    n_docs = sum(1 for _ in open(os.path.join(work, "docs-small.jsonl" if cfg.smoke else "docs.jsonl")))
    m = Cmd("MCP search (stdio client)", [PY, ME, "mcp", idx, os.path.join(work, "queries.jsonl"),
                                          cfg.pick(225, 100, 10)])
    runs = compare([m], cfg, warmup=False, min_runs=cfg.pick(3, 2, 1), fast_runs=cfg.pick(3, 2, 1))
    p50, p95 = field_stat(runs[m.label], "p50_ms"), field_stat(runs[m.label], "p95_ms")
    rep = runs[m.label][-1].report
    return [Row("rag-mcp-search", f"`rag serve` over stdio: a warm `search` call (hybrid, k 10) through the MCP SDK's "
                f"client, {n_docs}-document Cranfield index, {rep['n']} Cranfield queries per run",
                f"fresh `rag query` process (hybrid) {fresh.fmt()}", f"p50 {p50.fmt('ms', 1)}; p95 {p95.fmt('ms', 1)}",
                speed(fresh.median, p50.median / 1000, "a fresh process"),
                f"top 10 equal to `rag query --jsonl`'s: {rep['same_top10']}/{rep['checked']}; server start + first "
                f"call {rep['start_s']:.1f} s", cmds_of(fresh_cmd, m))]


def watch_rows(cfg, work: str, docs: str) -> list[Row]:
    """`rag index --watch`: one edit -> the first query that finds it; a 200-edit burst -> settled."""
    n_docs, n_edits = cfg.pick(1400, 300, 20), cfg.pick(20, 10, 3)
    c = Cmd("rag index --watch", [PY, ME, "watch", docs, cfg.tmp("watch"), n_docs, n_edits])
    rep = run_once(c).report
    return [Row("rag-watch-edit", f"`rag index --watch` over {rep['n_docs']} Markdown files (Cranfield abstracts): "
                "an edit appended to one file until a query (BM25, through `rag serve`'s generation-following "
                f"Searcher) finds it; {rep['n_edits']} edits one after another", "goal: 3 s",
                f"p50 {rep['edit_p50_s']:.2f} s, max {rep['edit_max_s']:.2f} s (the pass alone: p50 "
                f"{rep['pass_p50_s']:.2f} s)", "–", f"first pass {rep['first_pass_s']:.1f} s", cmds_of(c)),
            Row("rag-watch-burst", f"`rag index --watch`: 200 edits to 25 new files in a burst, until the index holds "
                f"exactly the last text of each ({rep['n_docs']} other files)", "–", f"{rep['burst_s']:.2f} s", "–",
                "every file once, its last text (checked); Ctrl-C exit " + str(rep["exit"]), cmds_of(c))]


def rows(cfg):
    n_chunks = cfg.pick(100_000, 20_000, 2_000)
    n_real = cfg.pick(3000, 1000, 100)
    n_queries = cfg.pick(30, 30, 10)
    work, desc = make_inputs(cfg, n_chunks, n_queries, n_real)
    out = bm25_rows(cfg, work, n_chunks)
    out += dense_rows(cfg, work, n_chunks, n_real)
    out.append(build_row(cfg, work, cfg.pick(300, 50, 10), 6))
    out += cranfield_rows(cfg)
    setup = [f"corpus: {desc}", "BM25 tokens: llmkit's tokenizer applied once in setup; every side gets the same "
             "token lists", "Cranfield: examples/data/cranfield converted by scripts/cranfield.py",
             "faiss with 1 thread (NOTES.md: faster for single queries here)"]
    return "BM25 (rank-bm25, bm25s), dense, hybrid, indexing, Cranfield", setup, out


if __name__ == "__main__":
    child(sys.argv[1:])
