"""Concurrent use of an index whose vectors live in an embedded Milvus (`--store milvus+local:`), which
serves its .db file to one process at a time: a writer re-indexes a changing corpus while reader
processes run `rag query` in a loop (every query succeeds, sees one whole generation and equals that
generation queried alone); writers on one index, and on two indexes sharing one .db file, take
turns and lose nothing; a store held too long is refused in one line, the index left as it was.
Bounded: GENERATIONS re-index runs, READERS processes of at most QUERIES queries each."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from conftest import run_subprocess, start_subprocess  # noqa: E402
from queryloop import DOCS, QUERY, ROOT, check_readers, hits_of, marker, start_readers, write_corpus  # noqa: E402

GENERATIONS = 2
READERS = 2
QUERIES = 8


def _cli(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_subprocess(args, timeout=300, env=env, text=True)


def _start(*args) -> subprocess.Popen:
    return start_subprocess(args, text=True)


def _write_corpus(d: Path, gen: int) -> None:
    d.mkdir(exist_ok=True)
    write_corpus(d, gen)


@pytest.mark.slow
def test_queries_during_milvus_reindexing_never_fail(tmp_path):
    corpus, idx, stop = tmp_path / "corpus", tmp_path / "idx", tmp_path / "stop"
    _write_corpus(corpus, 1)
    r = _cli("rag", "index", str(idx), str(corpus), "--store", "milvus+local:v.db")
    assert r.returncode == 0, r.stderr
    ref = {"zqgen1": hits_of(_cli("rag", "query", str(idx), QUERY, "--jsonl", "-k", "10").stdout)}
    assert len(ref["zqgen1"]) == DOCS
    readers = start_readers(tmp_path, idx, stop, QUERIES, READERS)
    t0 = time.monotonic()
    try:
        for gen in range(2, GENERATIONS + 1):
            _write_corpus(corpus, gen)
            r = _cli("rag", "index", str(idx), str(corpus))
            assert r.returncode == 0, r.stderr
            q = _cli("rag", "query", str(idx), QUERY, "--jsonl", "-k", "10")
            assert q.returncode == 0, q.stderr
            ref[f"zqgen{gen}"] = hits_of(q.stdout)
    finally:
        stop.write_text("done")
        results = check_readers(readers, ref)
    # the readers are gone: a run that changes nothing retires every older generation, and what only
    # they had is gone from the engine (generation N-1 stays for readers that opened it before the swap)
    r = _cli("rag", "index", str(idx), str(corpus))
    assert r.returncode == 0, r.stderr
    m = json.loads((idx / "manifest.json").read_text())
    assert sorted(p.name for p in idx.glob("gen-*")) == [f"gen-{GENERATIONS}", f"gen-{GENERATIONS + 1}"]
    code = ("import sys; sys.path.insert(0, %r)\nfrom llmkit.rag.index.milvus import MilvusStore\n"
            "st = MilvusStore(%r, %r)\nprint(st.client.get_collection_stats(%r)['row_count'])\nst.close()\n"
            % (str(ROOT), m["store"], str(idx), m["store"]["collection"]))
    rows = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert rows.returncode == 0, rows.stderr
    assert int(rows.stdout.split()[-1]) == DOCS
    seen = sorted({m for r in results for m in marker(r["hits"])})
    print(f"{len(results)} queries during {GENERATIONS - 1} milvus+local re-index runs "
          f"({time.monotonic() - t0:.0f} s), generations seen {seen}: 0 errors")


def _docs(d: Path, tag: str, n: int = 2) -> None:
    d.mkdir(parents=True)
    for i in range(n):
        (d / f"{tag}{i}.txt").write_text(f"Document {tag}{i} talks about the word zq{tag}{i} and nothing else.\n")


@pytest.mark.slow
def test_writers_sharing_a_milvus_file_take_turns(tmp_path):
    for tag in ("a", "b", "c"):
        _docs(tmp_path / tag, tag)
    shared = tmp_path / "shared.db"  # one .db file, two index directories
    one, two = tmp_path / "one", tmp_path / "two"
    procs = [_start("rag", "index", str(one), str(tmp_path / "a"), "--collection", "alpha", "--store", f"milvus+local:{shared}"),
             _start("rag", "index", str(two), str(tmp_path / "c"), "--store", f"milvus+local:{shared}")]
    time.sleep(0.3)
    procs.append(_start("rag", "index", str(one), str(tmp_path / "b"), "--collection", "beta", "--store",
                        f"milvus+local:{shared}"))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e[-1500:] for _, e in outs]
    m1 = json.loads((one / "manifest.json").read_text())
    assert m1["generation"] == 2 and m1["collections"]["alpha"]["docs"] == 2 and m1["collections"]["beta"]["docs"] == 2
    m2 = json.loads((two / "manifest.json").read_text())
    assert m2["store"]["collection"] != m1["store"]["collection"]
    for idx, tags in ((one, ("a0", "a1", "b0", "b1")), (two, ("c0", "c1"))):
        for tag in tags:
            q = _cli("rag", "query", str(idx), f"zq{tag}", "--mode", "dense", "-k", "1", "--jsonl")
            assert q.returncode == 0, q.stderr
            assert json.loads(q.stdout)["doc"].endswith(f"{tag}.txt")


def test_a_store_held_too_long_is_refused_in_one_line(tmp_path):
    _docs(tmp_path / "a", "a", 1)
    _docs(tmp_path / "b", "b", 1)
    idx = tmp_path / "idx"
    r = _cli("rag", "index", str(idx), str(tmp_path / "a"), "--store", "milvus+local:v.db")
    assert r.returncode == 0, r.stderr
    before = (idx / "manifest.json").read_text()
    code = ("import sys, time; sys.path.insert(0, %r)\nfrom llmkit.rag.index.milvus import MilvusStore\n"
            "st = MilvusStore(%r, %r)\nprint('held', flush=True); time.sleep(60)\n"
            % (str(ROOT), json.loads(before)["store"], str(idx)))
    holder = subprocess.Popen([sys.executable, "-W", "ignore", "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        env = {"LLMKIT_STORE_WAIT_SECONDS": "1"}
        r = _cli("rag", "index", str(idx), str(tmp_path / "b"), env=env)
        assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"stayed in use by process {holder.pid} for 1 s" in r.stderr and "LLMKIT_STORE_WAIT_SECONDS" in r.stderr
        assert (idx / "manifest.json").read_text() == before
        q = _cli("rag", "query", str(idx), "zqa0", "--mode", "dense", "-k", "1", env=env)
        assert q.returncode == 1 and "stayed in use" in q.stderr
        assert _cli("rag", "query", str(idx), "zqa0", "--mode", "bm25", "-k", "1", env=env).returncode == 0
    finally:
        holder.kill()
        holder.wait()
    r = _cli("rag", "index", str(idx), str(tmp_path / "b"))  # the holder died: its lock went with it
    assert r.returncode == 0, r.stderr
    q = _cli("rag", "query", str(idx), "zqb0", "--mode", "dense", "-k", "1", "--jsonl")
    assert q.returncode == 0 and json.loads(q.stdout)["doc"].endswith("b0.txt")
