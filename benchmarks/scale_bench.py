"""Past one machine, measured on one (not a test):

    python benchmarks/scale_bench.py --parts store,ray,batch

store  faiss (the anchor: the default store) vs Milvus (embedded Milvus Lite engine) on the same
       real MiniLM vectors of kernel-doc paragraphs: insert time, in-process query latency, top-10
       agreement of the exact (FLAT) indexes, recall@10 of the ANN indexes (faiss HNSW, Milvus
       IVF_FLAT: Milvus Lite has no HNSW) against flat, and `llmkit rag query` wall time from a
       fresh process on both index kinds.
ray    embedding throughput: the local ONNX embedder (2 threads) vs Ray Data with 2 actors of 1
       thread each on a local Ray runtime (start-up timed apart), same passages.
batch  llama-server with a real model (SmolLM2-135M, packaged): sequential requests (the anchor:
       one request at a time) vs `generate --batch` on a server with 1 and with 4 parallel slots.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def paragraphs(n: int) -> list[str]:
    with open(os.path.join(ROOT, "tests/fixtures/kernel-docs.txt.gz"), "rb") as f:
        text = gzip.decompress(f.read()).decode("utf-8")
    out = [p.strip() for p in text.split("\n\n") if 150 < len(p.strip()) < 1500]
    return out[:n]


def llmkit(*args, capture=True) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "llmkit", "-q", *args], check=True, capture_output=capture, text=True,
                       env={**os.environ, "PYTHONPATH": ROOT})
    return time.perf_counter() - t, p.stdout if capture else ""


def part_store(work: str, n: int) -> None:
    import faiss

    from llmkit.rag.index.milvus import MilvusStore, parse_store

    paras = paragraphs(n + 200)
    docs, queries = paras[:n], [p.split(". ")[0] for p in paras[n:n + 200]]
    with open(os.path.join(work, "docs.jsonl"), "w") as f:
        for i, t in enumerate(docs):
            f.write(json.dumps({"id": i, "text": t}) + "\n")
    fa, mv = os.path.join(work, "faiss"), os.path.join(work, "milvus")
    t_fa, _ = llmkit("rag", "index", fa, os.path.join(work, "docs.jsonl"))
    t_mv, _ = llmkit("rag", "index", mv, os.path.join(work, "docs.jsonl"), "--store", "milvus+local:")
    print(f"rag index of {n} paragraphs (embedding included): faiss {t_fa:.1f} s, milvus+local {t_mv:.1f} s")
    man = json.load(open(os.path.join(fa, "manifest.json")))
    vecs = np.load(os.path.join(fa, f"gen-{man['generation']}", "vectors.npy"))
    from llmkit.rag.embed.embedder import load_embedder

    q = load_embedder().queries(queries)
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(vecs)
    _, truth = flat.search(q, 10)
    hnsw = faiss.IndexHNSWFlat(vecs.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = 80
    hnsw.add(vecs)
    hnsw.hnsw.efSearch = 64
    _, got = hnsw.search(q, 10)
    rec_h = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, got)])
    st = MilvusStore(parse_store("milvus+local:bench.db", work), work)
    ids = np.arange(len(vecs))
    res = {}
    for kind in ("flat", "hnsw"):
        name = f"b_{kind}"
        st.drop(name)
        engine = st.create(name, vecs.shape[1], kind, len(vecs))
        t = time.perf_counter()
        st.upsert(name, ids, vecs, 1)
        t_ins = time.perf_counter() - t
        lat, hits = [], []
        for qi in q:
            t = time.perf_counter()
            h, _ = st.search(name, qi, 10, 1)
            lat.append(time.perf_counter() - t)
            hits.append(h)
        rec = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, hits)])
        res[kind] = (engine, t_ins, statistics.median(lat), rec)
    lat_f = []
    for qi in q:
        t = time.perf_counter()
        flat.search(qi.reshape(1, -1), 10)
        lat_f.append(time.perf_counter() - t)
    st.close()
    print(f"\n| store / index | insert {n} vectors | query latency (median, in-process) | recall@10 vs exact |")
    print("|---|---|---|---|")
    print(f"| faiss IndexFlatIP | – | {1e3 * statistics.median(lat_f):.2f} ms | 1.000 |")
    print(f"| faiss HNSW (M 32, efSearch 64) | – | – | {rec_h:.3f} |")
    for kind, (engine, t_ins, lat, rec) in res.items():
        print(f"| Milvus Lite {engine} | {t_ins:.2f} s | {1e3 * lat:.2f} ms | {rec:.3f} |")
    walls = {"faiss": [], "milvus": []}
    for _ in range(3):
        for name, d in (("faiss", fa), ("milvus", mv)):
            walls[name].append(llmkit("rag", "query", d, queries[0], "-k", "5")[0])
    print(f"\n`llmkit rag query` (hybrid, fresh process, median of 3): faiss {statistics.median(walls['faiss']):.2f} s, "
          f"milvus+local {statistics.median(walls['milvus']):.2f} s")


def part_ray(work: str, n: int) -> None:
    import ray

    from llmkit.rag.embed.embedder import load_embedder
    from llmkit.rag.embed.ray_embed import embed_on_ray

    texts = paragraphs(n)
    emb = load_embedder(threads=2)
    emb.passages(texts[:16])
    t = time.perf_counter()
    local = emb.passages(texts)
    t_local = time.perf_counter() - t
    t = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False)
    t_init = time.perf_counter() - t
    try:
        t = time.perf_counter()
        vec, _ = embed_on_ray(texts, None, "onnx", "fp32", "", "", address="auto", workers=2, batch_size=64)
        t_ray = time.perf_counter() - t
    finally:
        ray.shutdown()
    print(f"\nembedding {n} paragraphs: local ONNX 2 threads {n / t_local:.1f} passages/s ({t_local:.1f} s); "
          f"Ray Data 2 actors x 1 thread {n / t_ray:.1f} passages/s ({t_ray:.1f} s, actor start-up and model "
          f"loads included) + ray.init {t_init:.1f} s; max |difference| {np.abs(vec - local).max():.2e}")


def part_batch(work: str, n_items: int, n_predict: int) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from serverutil import start_server, stop_server

    from llmkit.llama.runtime import default_model_path

    model = default_model_path()
    prompts = [f"Write a short note about topic number {i}: " for i in range(n_items)]
    path = os.path.join(work, "batch.jsonl")
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": i, "prompt": p}) + "\n")
    rows = []
    for slots in (1, 4):
        proc, url = start_server(model, "-np", str(slots), "-c", str(512 * slots), "-t", "2")
        try:
            if slots == 1:  # the anchor: one request at a time, no batch tool
                from llmkit.llama.batch import Item, Server

                s = Server(url, 600)
                t = time.perf_counter()
                toks = 0
                for i, p in enumerate(prompts):
                    toks += s.run(Item(i, i, 0, p), {"n_predict": n_predict, "temperature": 0, "seed": 1})["stats"]["generated_tokens"]
                rows.append(("sequential requests, 1 slot", toks, time.perf_counter() - t))
            t = time.perf_counter()
            _, out = llmkit("generate", "--server", url, "--batch", path, "-n", str(n_predict), "--temp", "0", "--seed", "1")
            dt = time.perf_counter() - t
            toks = sum(json.loads(x)["stats"]["generated_tokens"] for x in out.splitlines())
            rows.append((f"llmkit generate --batch, {slots} slot(s)", toks, dt))
        finally:
            stop_server(proc)
    print(f"\n{n_items} prompts x {n_predict} tokens, SmolLM2-135M on one llama-server (-t 2):")
    print("| run | tokens | wall | tokens/s |\n|---|---|---|---|")
    for name, toks, dt in rows:
        print(f"| {name} | {toks} | {dt:.1f} s | {toks / dt:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="store,ray,batch")
    ap.add_argument("-n", type=int, default=3000, help="paragraphs for the store part")
    ap.add_argument("--ray-n", type=int, default=600)
    ap.add_argument("--items", type=int, default=16)
    ap.add_argument("--n-predict", type=int, default=64)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="scale-")
    parts = args.parts.split(",")
    if "store" in parts:
        part_store(work, args.n)
    if "ray" in parts:
        part_ray(work, args.ray_n)
    if "batch" in parts:
        part_batch(work, args.items, args.n_predict)


if __name__ == "__main__":
    main()
