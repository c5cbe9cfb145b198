"""Readers never see a half-written index: a writer re-indexes a changing corpus while several
processes run `rag query` in a loop (each query opens the index afresh). Every query succeeds, all
of its hits come from one generation, and its results equal those of that generation queried alone.
Bounded: GENERATIONS re-index runs, READERS processes of at most QUERIES queries each."""

from __future__ import annotations

import time

import pytest
from queryloop import QUERY, check_readers, cli, hits_of, marker, start_readers, write_corpus

GENERATIONS = 3
READERS = 3
QUERIES = 10


@pytest.mark.slow
def test_queries_during_reindexing_see_one_whole_generation(tmp_path):
    pytest.importorskip("faiss")
    pytest.importorskip("sentence_transformers")
    corpus, idx, stop = tmp_path / "corpus", tmp_path / "idx", tmp_path / "stop"
    corpus.mkdir()
    write_corpus(corpus, 1)
    r = cli("rag", "index", str(idx), str(corpus))
    assert r.returncode == 0, r.stderr
    ref = {"zqgen1": hits_of(cli("rag", "query", str(idx), QUERY, "--jsonl", "-k", "10").stdout)}
    readers = start_readers(tmp_path, idx, stop, QUERIES, READERS)
    t0 = time.monotonic()
    try:
        for gen in range(2, GENERATIONS + 1):
            write_corpus(corpus, gen)
            r = cli("rag", "index", str(idx), str(corpus))
            assert r.returncode == 0, r.stderr
            ref[f"zqgen{gen}"] = hits_of(cli("rag", "query", str(idx), QUERY, "--jsonl", "-k", "10").stdout)
    finally:
        stop.write_text("done")
        results = check_readers(readers, ref)
    seen = sorted({m for r in results for m in marker(r["hits"])})
    print(f"{len(results)} queries during {GENERATIONS - 1} re-index runs ({time.monotonic() - t0:.0f} s), "
          f"generations seen {seen}: 0 errors")
