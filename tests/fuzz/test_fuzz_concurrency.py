"""Readers never see a half-written index: a writer re-indexes a changing corpus while several
processes run `rag query` in a loop (each query opens the index afresh). Every query succeeds, all
of its hits come from one generation, and its results equal those of that generation queried alone.
Bounded: GENERATIONS re-index runs, READERS processes of at most QUERIES queries each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATIONS = 3
READERS = 3
QUERIES = 10
DOCS = 4

READER = r'''
import json, os, sys
sys.path.insert(0, sys.argv[4])
from click.testing import CliRunner
from llmkit.cli import main
idx, stop, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    if os.path.exists(stop):
        break
    runner, code = CliRunner(), 0
    with runner.isolation() as (out, err, *_):
        try:  # the real entry point, error mapping included, as `llmkit rag query` runs it
            main(["rag", "query", idx, "zqshared kernel pages", "--jsonl", "-k", "10"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        sys.stdout.flush()
        text, errors = out.getvalue().decode(), err.getvalue().decode()
    hits = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    print(json.dumps({"code": code, "err": errors[-400:] if code else "", "hits": [[h["doc"], h["text"]] for h in hits]}),
          flush=True)
'''


def _write_corpus(d: Path, gen: int) -> None:
    for i in range(DOCS):
        (d / f"doc{i}.md").write_text(f"# Doc {i}\nzqshared kernel pages, marker zqgen{gen}, topic {i} "
                                      f"{'memory' if i % 2 else 'scheduler'}.\n")


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmkit", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _marker(hits) -> set[str]:
    import re

    return {m for _, text in hits for m in re.findall(r"zqgen\d+", text)}


@pytest.mark.slow
def test_queries_during_reindexing_see_one_whole_generation(tmp_path):
    pytest.importorskip("faiss")
    pytest.importorskip("sentence_transformers")
    corpus, idx, stop = tmp_path / "corpus", tmp_path / "idx", tmp_path / "stop"
    corpus.mkdir()
    _write_corpus(corpus, 1)
    ref = {}
    r = _cli("rag", "index", str(idx), str(corpus))
    assert r.returncode == 0, r.stderr
    q = _cli("rag", "query", str(idx), "zqshared kernel pages", "--jsonl", "-k", "10")
    ref["zqgen1"] = [[h["doc"], h["text"]] for h in map(json.loads, q.stdout.splitlines())]
    script = tmp_path / "reader.py"
    script.write_text(READER)
    readers = [subprocess.Popen([sys.executable, str(script), str(idx), str(stop), str(QUERIES), str(ROOT)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(READERS)]
    t0 = time.monotonic()
    try:
        for gen in range(2, GENERATIONS + 1):
            _write_corpus(corpus, gen)
            r = _cli("rag", "index", str(idx), str(corpus))
            assert r.returncode == 0, r.stderr
            q = _cli("rag", "query", str(idx), "zqshared kernel pages", "--jsonl", "-k", "10")
            ref[f"zqgen{gen}"] = [[h["doc"], h["text"]] for h in map(json.loads, q.stdout.splitlines())]
    finally:
        stop.write_text("done")
        outs = [p.communicate(timeout=300) for p in readers]
    results = [json.loads(line) for out, _ in outs for line in out.splitlines() if line.startswith("{")]
    assert all(p.returncode == 0 for p in readers), [e[-2000:] for _, e in outs]
    errors = [r["err"] for r in results if r["code"] != 0]
    assert not errors, errors[:3]
    assert results, "no query ran"
    for r in results:
        marks = _marker(r["hits"])
        assert len(marks) == 1, marks  # never a mix of two generations
        assert r["hits"] == ref[marks.pop()]
    seen = sorted({m for r in results for m in _marker(r["hits"])})
    print(f"{len(results)} queries during {GENERATIONS - 1} re-index runs ({time.monotonic() - t0:.0f} s), "
          f"generations seen {seen}: 0 errors")
