"""The query path opens an index in constant time: BM25 and vectors memory-mapped (a fresh open reads
the same few bytes at any size), metadata filters through the indexed metadata table (the same rows
as json_extract over every chunk), and float16 vector storage within a measured recall of float32 on
real MiniLM vectors."""

import json
import os
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli

pytest.importorskip("faiss")

ROOT = Path(__file__).resolve().parent.parent
LANGS = ["c", "rust", "python", "go"]
WORDS = ("page cache scheduler memory task filesystem mount network socket driver interrupt lock mutex "
         "buffer queue thread process signal timer device").split()


def _records(n: int = 40) -> list[dict]:
    rng = np.random.default_rng(4)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS, 12)) + f". Record {i} explains the {WORDS[i % len(WORDS)]}."
        rec = {"id": f"r{i}", "text": text, "lang": LANGS[i % 4], "year": 2015 + i % 10,
               "score": [0.5, 3, 12.25, -1][i % 4], "date": f"202{i % 6}-0{1 + i % 9}-1{i % 10}",
               "flag": bool(i % 3), "path": ["src/mm/a.c", "src/net/b.py", "docs/c.md", "kernel/d.py"][i % 4],
               "ver": ["10", "9.5", "x1", " 7 "][i % 4]}
        if i % 5 == 0:
            rec["note"] = "special"
        out.append(rec)
    return out


@pytest.fixture(scope="module")
def meta_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("qp")
    (root / "in").mkdir()
    (root / "in" / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
    idx = root / "idx"
    r = run_cli(["rag", "index", str(idx), str(root / "in"), "--no-tune", "--json"])
    assert r.exit_code == 0, r.stderr
    return root, idx


FILTERS = ["lang=rust", "lang!=rust", "lang~US", "path=*.py", "path!=src/*", "source=*r.jsonl#r1?",
           "year>=2020", "year<2018", "score>2", "score<=0.5", "date>=2023-01-01", "date<2021-05-15",
           "flag=1", "flag=true", "ver>=9", "ver=10", "ver=x1", "note=special", "note!=special",
           "id=r7", "nosuch=1"]


def _ids(idx, conds, indexed):
    from llmkit.rag.index.catalog import filter_ids

    con = sqlite3.connect(idx / "chunks.sqlite")
    try:
        return sorted(filter_ids(con, conds, indexed=indexed))
    finally:
        con.close()


def test_filters_read_the_metadata_table_with_the_results_of_json_extract(meta_index):
    from llmkit.rag.retrieve.filters import parse_filter

    _, idx = meta_index
    sizes = []
    for f in FILTERS:
        conds = [parse_filter(f)]
        got = _ids(idx, conds, True)
        assert got == _ids(idx, conds, False), f
        sizes.append(len(got))
    assert 0 in sizes and max(sizes) > 20 and len(set(sizes)) > 5  # the filters select different rows
    for a, b in [("lang=rust", "year>=2020"), ("path=*.py", "flag=1"), ("ver>=9", "lang!=c")]:
        conds = [parse_filter(a), parse_filter(b)]
        assert _ids(idx, conds, True) == _ids(idx, conds, False) != []
    con = sqlite3.connect(idx / "chunks.sqlite")
    plan = " ".join(r[-1] for r in con.execute("EXPLAIN QUERY PLAN SELECT chunk_id FROM chunk_meta WHERE key = ? "
                                                "AND value = ?", ("lang", "rust")))
    con.close()
    assert "SEARCH chunk_meta USING PRIMARY KEY (key=? AND value=?)" in plan  # a seek, not every chunk's JSON


def test_index_without_the_table_is_filtered_the_old_way_and_gets_it_on_the_next_run(meta_index, tmp_path):
    root, idx = meta_index
    old = tmp_path / "old"
    shutil.copytree(idx, old)
    con = sqlite3.connect(old / "chunks.sqlite")
    con.executescript("DROP TRIGGER chunk_meta_add; DROP TRIGGER chunk_meta_gone; DROP TABLE chunk_meta;")
    con.close()
    args = ["kernel task", "--filter", "path=*.py", "--filter", "year>=2018", "--mode", "bm25", "-k", "5", "--jsonl"]
    want = run_cli(["rag", "query", str(idx), *args])
    before = run_cli(["rag", "query", str(old), *args])
    assert want.exit_code == before.exit_code == 0 and want.stdout == before.stdout and want.stdout
    (root / "in2").mkdir(exist_ok=True)
    (root / "in2" / "more.jsonl").write_text(json.dumps({"id": "m1", "text": "A mutex lock guards the queue.",
                                                         "lang": "rust", "path": "src/x.py", "year": 2030}) + "\n")
    r = run_cli(["rag", "index", str(old), str(root / "in2"), "--collection", "more", "--no-tune", "--json"])
    assert r.exit_code == 0, r.stderr
    from llmkit.rag.index.catalog import has_meta_table

    con = sqlite3.connect(old / "chunks.sqlite")
    assert has_meta_table(con)
    n_meta = con.execute("SELECT COUNT(*) FROM chunk_meta WHERE key = 'source'").fetchone()[0]
    assert n_meta == con.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]  # old chunks filled in, new ones added
    con.close()
    hits = [json.loads(x) for x in run_cli(["rag", "query", str(old), "mutex lock queue", "--filter", "year>=2030",
                                            "--mode", "bm25", "--jsonl"]).stdout.splitlines()]
    assert [h["meta"]["doc_id"] for h in hits] == ["m1"]


def test_removed_chunks_leave_the_metadata_table(meta_index, tmp_path):
    root, idx = meta_index
    copy = tmp_path / "idx"
    shutil.copytree(idx, copy)
    src = tmp_path / "in"
    src.mkdir()
    (src / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()[:10]))
    for _ in range(3):  # the removal, then two runs after it, so superseded rows are deleted
        r = run_cli(["rag", "index", str(copy), str(src), "--no-tune", "--json"])
        assert r.exit_code == 0, r.stderr
    con = sqlite3.connect(copy / "chunks.sqlite")
    orphans = con.execute("SELECT COUNT(*) FROM chunk_meta WHERE chunk_id NOT IN (SELECT id FROM chunks)").fetchone()
    con.close()
    assert orphans == (0,)


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def test_fresh_bm25_open_reads_the_same_few_bytes_at_any_size(tmp_path):
    from llmkit.rag.index.bm25 import BM25Index

    rng = np.random.default_rng(0)
    vocab = np.array([f"w{i}" for i in range(60_000)])
    reads, sizes = [], []
    for n in (2_000, 40_000):
        docs = vocab[np.minimum(rng.zipf(1.3, (n, 30)), len(vocab)) - 1].tolist()
        BM25Index.build(docs).save(str(tmp_path / str(n)))
        sizes.append(sum(os.path.getsize(tmp_path / str(n) / f) for f in os.listdir(tmp_path / str(n))))
        BM25Index.load(str(tmp_path / str(n))).top_k(["w5", "w77"], 10)  # warm: imports, code paths
        before = _rchar()
        ix = BM25Index.load(str(tmp_path / str(n)))
        top = ix.top_k(["w3", "w40", "w999"], 10)
        reads.append(_rchar() - before)
        assert top and isinstance(ix.docs, np.memmap) and isinstance(ix.vocab.offsets, np.memmap)
    assert sizes[1] > 10 * sizes[0] > 1_000_000
    # the same bytes at both sizes: each file's header (one buffered read), never its data (mapped)
    assert reads[1] <= reads[0] + 4096 and reads[1] < 128 * 1024 < sizes[1] / 8, (reads, sizes)


def test_index_opens_mapped_and_a_bm25_query_never_parses_a_vocabulary(meta_index, monkeypatch):
    from llmkit.rag.index.reader import Index

    _, idx = meta_index
    assert (idx / "gen-1" / "lead.npy").exists()
    loads = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: loads.append(len(s)) or real(s, *a, **k))
    ix = Index(str(idx))
    try:
        rows, _ = ix.bm25_list(ix.tok("scheduler memory"), 5)
        assert rows
        assert all(isinstance(a, np.memmap) for a in (ix.rows, ix.parent, ix.collection, ix.bm25.docs,
                                                      ix.bm25.vocab.data, ix.vector_store.vectors()))
        assert max(loads) < 4096  # the manifest and params.json: no vocabulary, no per-row data
        assert not (Path(ix.gdir) / "faiss.index").exists()  # flat: the mapped vectors are the index
        from llmkit.rag.index.reader import unit_leads

        assert isinstance(ix.lead, np.memmap) and np.array_equal(ix.lead, unit_leads(np.asarray(ix.unit)))
    finally:
        ix.close()


@pytest.fixture(scope="module")
def minilm_docs():
    """Real MiniLM vectors of a few hundred paragraphs of this repository's docs, and of 40 queries."""
    from llmkit.rag.embed.embedder import load_embedder

    paras = []
    for path in sorted((ROOT / "docs").rglob("*.md")):
        paras += [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if 80 < len(p.strip()) < 800]
    paras = paras[:360]
    assert len(paras) >= 300
    emb = load_embedder()
    return emb.passages(paras[40:]), emb.queries([p[:120] for p in paras[:40]])


def _recall(truth, got) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(a) for a, b in zip(truth, got)]))


def test_float16_vectors_keep_recall_of_float32_on_minilm(minilm_docs, tmp_path):
    from llmkit.rag.index.vectors import FaissStore, exact_search, write_vectors

    docs, queries = minilm_docs
    truth = [exact_search(docs, q, 10)[0] for q in queries]
    assert truth == [np.argsort(-(docs @ q), kind="stable")[:10].tolist() for q in queries]
    runs = {}
    for kind, dtype in (("flat", "float16"), ("hnsw", "float32"), ("hnsw", "float16")):
        g = tmp_path / f"{kind}-{dtype}"
        g.mkdir()
        np.save(g / "vectors.npy", docs)
        assert write_vectors(str(g), kind, dtype) == kind
        st = FaissStore(str(g), len(docs), kind)
        assert st.vectors().dtype == np.dtype(dtype) and st.exact == (kind == "flat")
        runs[kind, dtype] = _recall(truth, [st.search(q, 10, None)[0] for q in queries])
        assert (g / "faiss.index").exists() == (kind == "hnsw")
    assert runs["flat", "float16"] >= 0.99, runs
    assert runs["hnsw", "float16"] >= 0.97 and runs["hnsw", "float16"] >= runs["hnsw", "float32"] - 0.01, runs


def test_index_type_float16_is_kept_by_later_runs(meta_index, tmp_path):
    root, idx = meta_index
    copy = tmp_path / "idx"
    shutil.copytree(idx, copy)

    def dtype_and_kind():
        m = json.loads((copy / "manifest.json").read_text())
        g = copy / f"gen-{m['generation']}"
        return np.load(g / "vectors.npy", mmap_mode="r").dtype.name, m["index"], (g / "faiss.index").exists()

    want = run_cli(["rag", "query", str(idx), "scheduler task", "--mode", "dense", "-k", "5", "--jsonl"])
    r = run_cli(["rag", "index", str(copy), str(root / "in"), "--index-type", "hnsw,float16", "--no-tune"])
    assert r.exit_code == 0, r.stderr
    assert dtype_and_kind() == ("float16", "hnsw", True)
    got = run_cli(["rag", "query", str(copy), "scheduler task", "--mode", "dense", "-k", "5", "--jsonl"])
    same = [json.loads(x)["chunk_id"] for x in got.stdout.splitlines()]
    assert same == [json.loads(x)["chunk_id"] for x in want.stdout.splitlines()]  # 40 chunks: HNSW finds them all
    (root / "in3").mkdir(exist_ok=True)
    (root / "in3" / "x.jsonl").write_text(json.dumps({"id": "x1", "text": "Sockets carry network buffers."}) + "\n")
    assert run_cli(["rag", "index", str(copy), str(root / "in3"), "--collection", "x", "--no-tune"]).exit_code == 0
    assert dtype_and_kind() == ("float16", "flat", False)  # auto picks flat again; the storage dtype stays
    assert run_cli(["rag", "index", str(copy), str(root / "in3"), "--collection", "x", "--no-tune",
                    "--index-type", "auto,float32"]).exit_code == 0
    assert dtype_and_kind() == ("float32", "flat", False)
    bad = run_cli(["rag", "index", str(copy), str(root / "in3"), "--index-type", "hnsw,int4"])
    assert bad.exit_code == 2 and "'hnsw,int4' is not TYPE[,DTYPE]" in bad.stderr
