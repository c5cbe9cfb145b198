"""Shared by the concurrent-use tests (tests/fuzz/test_fuzz_concurrency.py for faiss,
tests/test_rag_concurrency_milvus.py for Milvus Lite): a corpus whose every chunk carries its
generation's marker, reader processes that run `rag query` in a loop through the real entry point,
and the check that each result comes from one generation and equals that generation queried alone."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = 4
QUERY = "zqshared kernel pages"

READER = r'''
import gc, json, os, sys
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
            main(["rag", "query", idx, sys.argv[5], "--jsonl", "-k", "10"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        sys.stdout.flush()
        text, errors = out.getvalue().decode(), err.getvalue().decode()
    gc.collect()  # the query's index view goes, and with it any store it opened (as when `rag query` exits)
    hits = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    print(json.dumps({"code": code, "err": errors[-400:] if code else "", "hits": [[h["doc"], h["text"]] for h in hits]}),
          flush=True)
'''


def write_corpus(d: Path, gen: int) -> None:
    for i in range(DOCS):
        (d / f"doc{i}.md").write_text(f"# Doc {i}\nzqshared kernel pages, marker zqgen{gen}, topic {i} "
                                      f"{'memory' if i % 2 else 'scheduler'}.\n")


def cli(*args) -> subprocess.CompletedProcess:
    from conftest import run_subprocess

    return run_subprocess(args, timeout=300, text=True)


def hits_of(stdout: str) -> list:
    return [[h["doc"], h["text"]] for h in map(json.loads, stdout.splitlines())]


def marker(hits) -> set[str]:
    return {m for _, text in hits for m in re.findall(r"zqgen\d+", text)}


def start_readers(tmp_path: Path, idx, stop, queries: int, readers: int) -> list[subprocess.Popen]:
    script = tmp_path / "reader.py"
    script.write_text(READER)
    return [subprocess.Popen([sys.executable, str(script), str(idx), str(stop), str(queries), str(ROOT), QUERY],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(readers)]


def check_readers(readers: list[subprocess.Popen], ref: dict) -> list[dict]:
    """Wait for the readers; every query succeeded and saw exactly one generation, equal to `ref`'s."""
    outs = [p.communicate(timeout=300) for p in readers]
    results = [json.loads(line) for out, _ in outs for line in out.splitlines() if line.startswith("{")]
    assert all(p.returncode == 0 for p in readers), [e[-2000:] for _, e in outs]
    errors = [r["err"] for r in results if r["code"] != 0]
    assert not errors, errors[:3]
    assert results, "no query ran"
    for r in results:
        marks = marker(r["hits"])
        assert len(marks) == 1, marks  # never a mix of two generations
        assert r["hits"] == ref[marks.pop()]
    return results
