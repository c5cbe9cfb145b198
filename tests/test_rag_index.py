"""End to end through the CLI with the real packaged MiniLM, real faiss and rank-bm25 as the oracle:
indexing (formats, collections, metadata, skipped files, incremental updates, SIGKILL safety) and
querying (hybrid RRF, filters, routing, Chinese, parents, batch, rerank, LLM steps, answer, eval)."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli, start_subprocess
from ragfixtures import tiny_gguf  # noqa: F401 - a pytest fixture

pytest.importorskip("faiss")
pytest.importorskip("sentence_transformers")

MEM = """---
title: Memory guide
date: 2025-02-01
---
# Pages
The kernel manages physical memory in pages. Each page is tracked by a struct page, and the buddy
allocator hands out blocks of contiguous pages.

# Slab
Small objects come from the slab allocator through kmalloc(). Caches keep freed objects for reuse.
"""
SCHED = ("The scheduler picks the next task to run. The completely fair scheduler keeps runnable tasks in a "
         "red-black tree ordered by virtual runtime, so the task that ran least goes next.\n\n"
         "Real-time tasks use the FIFO and round-robin policies and always run before normal tasks.")
HTML = ("<html><head><title>Filesystems</title></head><body><h1>Mounting</h1><p>Use the mount command to attach a "
        "filesystem to a directory. Options such as noatime reduce writes.</p><script>var x=1;</script></body></html>")
CODE = [{"id": "c1", "text": "def parse_config(path): reads the YAML configuration file and returns a dict.", "lang": "python"},
        {"id": "c2", "text": "fn main() starts the HTTP server and listens on port 8080 for requests.", "lang": "rust"}]
TW = "國立臺灣大學位於臺北市，是臺灣歷史最悠久的大學之一。校園裡有著名的椰林大道。"
CN = "北京大学位于北京市海淀区，是中国著名的综合性大学。"


def _write_corpus(root: Path) -> None:
    (root / "articles").mkdir(parents=True)
    (root / "articles" / "mem.md").write_text(MEM)
    (root / "articles" / "sched.txt").write_text(SCHED)
    (root / "articles" / "fs.html").write_text(HTML)
    (root / "articles" / "tw.txt").write_text(TW)
    (root / "articles" / "cn.txt").write_text(CN)
    (root / "articles" / "blob.txt").write_bytes(b"\x00\x01\x02\x03binary")
    (root / "articles" / "empty.txt").write_text("")
    (root / "code").mkdir()
    (root / "code" / "snippets.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CODE))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("rag")
    _write_corpus(root / "corpus")
    idx = root / "idx"
    r1 = run_cli(["rag", "index", str(idx), str(root / "corpus" / "articles"), "--collection", "articles",
                  "--size", "200", "--overlap", "40", "--parent-size", "600", "--json"])
    assert r1.exit_code == 0, r1.stderr
    r2 = run_cli(["rag", "index", str(idx), str(root / "corpus" / "code"), "--collection", "code", "--json"])
    assert r2.exit_code == 0, r2.stderr
    return root, idx, json.loads(r1.stdout), r1.stderr


def query(idx, *args, input=None):
    r = run_cli(["rag", "query", str(idx), *args, "--jsonl"], input=input)
    assert r.exit_code == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()], r.stderr


def test_index_report_counts_and_skips(built):
    _, idx, report, err = built
    assert report["docs_added"] == 5 and report["chunks_indexed"] >= 6
    assert {s["reason"] for s in report["skipped"]} == {"binary", "empty"}
    assert "skipped 2 file(s): 1 .txt (binary), 1 .txt (empty)" in err
    m = json.loads((idx / "manifest.json").read_text())
    assert m["format"] == "llmkit-rag" and m["dim"] == 384 and set(m["collections"]) == {"articles", "code"}
    assert {"source", "title", "section", "date", "lang", "collection"} <= set(m["fields"])


def test_hybrid_query_finds_the_right_chunk_with_both_ranks(built):
    _, idx, _, _ = built
    hits, _ = query(idx, "how does the scheduler order runnable tasks", "-k", "3")
    assert hits[0]["doc"].endswith("sched.txt")
    assert set(hits[0]["ranks"]) == {"bm25", "dense"}
    assert {"query_id", "rank", "chunk_id", "score", "text", "parent_text", "meta"} <= set(hits[0])
    assert hits[0]["meta"]["collection"] == "articles"


def test_bm25_mode_equals_rank_bm25(built):
    rank_bm25 = pytest.importorskip("rank_bm25")
    from llmkit.rag.index.analysis import doc_terms
    from llmkit.rag.index.reader import Index

    _, idx, _, _ = built
    ix = Index(str(idx))
    texts = ix.texts(range(ix.n))
    assert ix.idents and ix.tok_doc("parse_config") == doc_terms("parse_config", "english", idents=True)
    ref = rank_bm25.BM25Okapi([ix.tok_doc(t) for t in texts])
    for q in ("memory pages allocator", "scheduler tasks", "mount filesystem noatime", "parseConfig kmalloc()"):
        theirs = ref.get_scores(ix.tok(q))
        np.testing.assert_allclose(ix.bm25.scores(ix.tok(q)), theirs, rtol=1e-12)
        hits, _ = query(idx, q, "--mode", "bm25", "-k", "3", "--chunks")
        want = [d for d in sorted(range(len(theirs)), key=lambda d: (-theirs[d], d))[:3] if theirs[d] > 0]
        assert [h["chunk_id"] for h in hits] == [int(ix.rows[d]) for d in want]


def test_traditional_chinese_query(built):
    _, idx, _, _ = built
    hits, err = query(idx, "臺灣大學在哪裡", "-k", "2", "--explain")
    assert hits[0]["doc"].endswith("tw.txt")
    assert "dense retriever skipped" in err  # MiniLM maps Chinese to [UNK]


def test_filters_inside_retrieval(built):
    _, idx, _, _ = built
    hits, _ = query(idx, "kernel tasks memory", "--filter", "date>=2025-01-01", "--filter", "source~mem", "-k", "5")
    assert hits and all(h["doc"].endswith("mem.md") for h in hits)
    hits, _ = query(idx, "server configuration", "--filter", "lang=rust", "--mode", "dense")
    assert [h["meta"]["doc_id"] for h in hits] == ["c2"]
    hits, _ = query(idx, "memory", "--collection", "code", "--mode", "dense", "-k", "10")
    assert len(hits) == 2 and all(h["meta"]["collection"] == "code" for h in hits)
    r = run_cli(["rag", "query", str(idx), "memory", "--filter", "colour=red"])
    assert r.exit_code == 1 and "unknown filter field 'colour'" in r.stderr


def test_routing_and_required_terms(built):
    _, idx, _, _ = built
    hits, err = query(idx, "function that reads the YAML configuration file", "--route", "--explain", "-k", "3")
    assert "routing:" in err and "-> code" in err and all(h["meta"]["collection"] == "code" for h in hits)
    hits, err = query(idx, "where do objects come from", "--must", "kmalloc()", "--explain")
    assert hits and all("kmalloc()" in h["text"] for h in hits)
    hits, _ = query(idx, 'tasks in a "red-black tree"', "--auto-must")
    assert hits and all("red-black tree" in h["text"] for h in hits)


def test_parents_small_to_big(built):
    _, idx, _, _ = built
    hits, _ = query(idx, "buddy allocator contiguous pages", "--parents", "-k", "5")
    parents = [h["parent_id"] for h in hits]
    assert len(parents) == len(set(parents))  # one result per parent
    assert hits[0]["text"] in hits[0]["parent_text"] and len(hits[0]["parent_text"]) >= len(hits[0]["text"])


def test_batch_queries_from_stdin(built):
    _, idx, _, _ = built
    lines = '{"id": "q1", "text": "mount a filesystem"}\n{"id": "q2", "text": "slab caches"}\n'
    hits, _ = query(idx, "-", "-k", "1", input=lines)
    assert [(h["query_id"], h["doc"].rsplit("/", 1)[-1]) for h in hits] == [("q1", "fs.html"), ("q2", "mem.md")]


def test_synonyms_and_expansion(built, tmp_path):
    _, idx, _, _ = built
    syn = tmp_path / "syn.txt"
    syn.write_text("# test\ncpu scheduler: completely fair scheduler\n")
    hits, err = query(idx, "cpu scheduler", "--mode", "bm25", "--synonyms", str(syn), "--explain")
    assert "synonyms added" in err and hits[0]["doc"].endswith("sched.txt")
    hits, err = query(idx, "buddy allocator", "--mode", "bm25", "--expand", "3", "--explain")
    assert "expansion terms" in err and hits


def test_info_and_human_output(built):
    _, idx, _, _ = built
    r = run_cli(["rag", "info", str(idx)])
    assert r.exit_code == 0 and "articles:" in r.stdout and "384-d" in r.stdout
    r = run_cli(["rag", "query", str(idx), "mount options"])
    assert r.exit_code == 0 and r.stdout.startswith("1. ") and "fs.html" in r.stdout


def test_incremental_update_and_removal(tmp_path):
    corpus = tmp_path / "c"
    _write_corpus(corpus)
    idx = tmp_path / "idx"
    args = ["rag", "index", str(idx), str(corpus / "articles"), "--json"]
    first = json.loads(run_cli(args).stdout)
    (corpus / "articles" / "sched.txt").write_text(SCHED + "\n\nDeadline tasks are scheduled by earliest deadline.")
    (corpus / "articles" / "fs.html").unlink()
    r = run_cli(args)
    second = json.loads(r.stdout)
    assert second["docs_added"] == 1 and second["docs_unchanged"] == 3 and second["docs_removed"] == 1
    assert second["embedded"] < first["embedded"] and second["vectors_reused"] > 0
    hits, _ = query(idx, "mount filesystem noatime", "--mode", "bm25")
    assert not any(h["doc"].endswith("fs.html") for h in hits)
    hits, _ = query(idx, "earliest deadline", "--mode", "bm25", "-k", "1")
    assert "earliest deadline" in hits[0]["text"]
    third = json.loads(run_cli(args).stdout)
    assert third["docs_added"] == 0 and third["embedded"] == 0


def test_sigkill_mid_index_leaves_previous_index_usable(tmp_path, kernel_small):
    corpus = tmp_path / "c"
    _write_corpus(corpus)
    idx = tmp_path / "idx"
    assert run_cli(["rag", "index", str(idx), str(corpus / "articles")]).exit_code == 0
    before, _ = query(idx, "scheduler red-black tree", "-k", "3")
    big = tmp_path / "big"
    big.mkdir()
    text = kernel_small.read_text()[:120_000]
    for i in range(12):
        (big / f"part{i}.txt").write_text(text[i * 10_000:(i + 1) * 10_000])
    p = start_subprocess(["rag", "index", idx, big], stdout=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (idx / "gen-2").exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.02)  # gen-2 appears after the SQLite commit, before embedding and the manifest swap
    assert p.poll() is None, p.stderr.read().decode()
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    after, _ = query(idx, "scheduler red-black tree", "-k", "3")
    assert after == before
    assert json.loads((idx / "manifest.json").read_text())["generation"] == 1
    rerun = json.loads(run_cli(["rag", "index", str(idx), str(big), "--json"]).stdout)
    assert rerun["generation"] == 2 and rerun["docs_added"] == 12
    assert json.loads(run_cli(["rag", "info", str(idx), "--json"]).stdout)["collections"]["default"]["docs"] == 17


def test_bad_inputs(tmp_path, built):
    _, idx, _, _ = built
    r = run_cli(["rag", "query", str(tmp_path), "x"])
    assert r.exit_code == 1 and "not an llmkit RAG index" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(["rag", "query", str(tmp_path / "nope"), "x"])
    assert r.exit_code == 1 and "does not exist" in r.stderr
    newer = tmp_path / "newer"
    shutil.copytree(idx, newer)
    m = json.loads((newer / "manifest.json").read_text())
    m["version"] = 99
    (newer / "manifest.json").write_text(json.dumps(m))
    r = run_cli(["rag", "query", str(newer), "x"])
    assert r.exit_code == 1 and "newer than this llmkit" in r.stderr
    r = run_cli(["rag", "index", str(tmp_path / "e"), str(tmp_path / "missing.txt")])
    assert r.exit_code == 1 and "does not exist" in r.stderr
    (tmp_path / "only.bin").write_bytes(b"\x00\x00")
    assert run_cli(["rag", "index", str(tmp_path / "empty"), str(tmp_path / "only.bin")]).exit_code == 0
    r = run_cli(["rag", "query", str(tmp_path / "empty"), "anything"])
    assert r.exit_code == 1 and "no chunks" in r.stderr
    r = run_cli(["rag", "query", str(idx), "x", "--weights", "bm25=oops"])
    assert r.exit_code == 1 and "cannot read the weight" in r.stderr
    r = run_cli(["rag", "query", str(idx), "x", "--mode", "sparse"])
    assert r.exit_code == 2
    r = run_cli(["rag", "index", str(tmp_path / "x"), str(tmp_path / "only.bin"), "--size", "300", "--overlap", "200"])
    assert r.exit_code == 1 and "overlap" in r.stderr


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """A random 32-d sentence-transformer and a random CrossEncoder with the MiniLM vocabulary."""
    from tinyst import write_tiny_models

    root = tmp_path_factory.mktemp("tiny")
    write_tiny_models(root, seed=0)
    return root


def test_model_dimension_mismatch(built, tiny_models):
    _, idx, _, _ = built
    r = run_cli(["rag", "query", str(idx), "memory", "--model", str(tiny_models / "st32")])
    assert r.exit_code == 1 and "32-d" in r.stderr and "384-d" in r.stderr
    r = run_cli(["rag", "index", str(idx), str(idx), "--model", str(tiny_models / "st32")])
    assert r.exit_code == 1 and "cannot be mixed" in r.stderr


def test_cross_encoder_rerank(built, tiny_models):
    _, idx, _, _ = built
    hits, _ = query(idx, "kernel memory", "-k", "4", "--rerank", f"cross-encoder:{tiny_models / 'ce'}")
    scores = [h["rerank_score"] for h in hits]
    assert len(hits) == 4 and scores == sorted(scores, reverse=True)


def test_llm_steps_with_local_gguf(built, tiny_gguf):
    pytest.importorskip("llama_cpp")
    _, idx, _, _ = built
    hits, err = query(idx, "kernel memory", "-k", "3", "--rerank", f"llm:{tiny_gguf}")
    assert len(hits) == 3 and all(np.isfinite(h["rerank_score"]) for h in hits)
    assert [h["rerank_score"] for h in hits] == sorted((h["rerank_score"] for h in hits), reverse=True)
    hits, err = query(idx, "kernel memory", "-k", "3", "-m", str(tiny_gguf), "--hyde", "--rewrite", "2", "--explain")
    assert "HyDE passage" in err and "rewrites" in err and len(hits) == 3
    hits, err = query(idx, "kernel memory pages", "-k", "3", "-m", str(tiny_gguf), "--compress-to", "20")
    assert "compressed" in err and all("compressed_text" in h for h in hits)
    r = run_cli(["rag", "answer", str(idx), "How is memory tracked?", "--llm", str(tiny_gguf), "-n", "8", "-k", "2"])
    assert r.exit_code == 0 and "Sources:\n[1] " in r.stdout and "[2] " in r.stdout


def test_eval_table(built, tmp_path):
    idx = built[1]
    (tmp_path / "q.jsonl").write_text('{"id": "1", "text": "scheduler red-black tree"}\n{"id": "2", "text": "mount"}\n')
    root = built[0]
    sched = str(root / "corpus" / "articles" / "sched.txt")
    fs = sched.replace("sched.txt", "fs.html")
    (tmp_path / "qrels").write_text(f"1 0 {sched} 2\n2 0 {fs} 1\n")
    r = run_cli(["rag", "eval", str(idx), "--queries", str(tmp_path / "q.jsonl"), "--qrels", str(tmp_path / "qrels"),
                 "-c", "bm25", "-c", "hybrid:bm25=0.3,dense=0.7+expand=2", "--jsonl", "--recall-k", "5"])
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert rows[0]["config"] == "bm25" and rows[0]["ndcg@10"] == pytest.approx(1.0) and rows[0]["mrr"] == 1.0
    assert rows[1]["queries"] == 2 and 0 < rows[1]["ndcg@10"] <= 1


def test_stemmed_bm25_index(tmp_path):
    rank_bm25 = pytest.importorskip("rank_bm25")
    from llmkit.rag.index.bm25 import tokenize
    from llmkit.rag.index.reader import Index

    corpus = tmp_path / "c"
    _write_corpus(corpus)
    idx = tmp_path / "idx"
    r = run_cli(["rag", "index", str(idx), str(corpus / "articles"), "--analysis", "porter", "--size", "200",
                 "--overlap", "40"])
    assert r.exit_code == 0, r.stderr
    hits, _ = query(idx, "allocating objects", "--mode", "bm25", "-k", "1")
    assert "allocator" in hits[0]["text"]  # allocating / allocator -> alloc
    ix = Index(str(idx))
    ref = rank_bm25.BM25Okapi([tokenize(t, stem=True) for t in ix.texts(range(ix.n))])
    q = tokenize("scheduling runnable tasks", stem=True)
    np.testing.assert_allclose(ix.bm25.scores(q), ref.get_scores(q), rtol=1e-12)
    r = run_cli(["rag", "index", str(tmp_path / "plain"), str(corpus / "articles")])
    assert r.exit_code == 0
    r = run_cli(["rag", "index", str(tmp_path / "plain"), str(corpus / "code"), "--stem"])  # the 0.1 spelling
    assert r.exit_code == 1 and "analyses BM25 terms as english, not porter" in r.stderr
    assert "`llmkit rag index --stem` is now `--analysis=porter`" in r.stderr
