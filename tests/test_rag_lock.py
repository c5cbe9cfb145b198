"""Two writers on one index: the second waits for the first (or fails at once with --no-wait);
every document of every run ends up indexed and every collection listed; readers never block."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli, start_subprocess

ROOT = Path(__file__).parent.parent


def _docs(d: Path, tag: str, n: int = 3) -> None:
    d.mkdir(parents=True)
    for i in range(n):
        (d / f"{tag}{i}.txt").write_text(f"Document {tag}{i} talks about the word zq{tag}{i} and nothing else.\n")


def _index(idx, src, coll):
    return start_subprocess(["rag", "index", idx, src, "--collection", coll])


@pytest.mark.parametrize("offset", [0.0, 0.4, 1.5])
def test_concurrent_writers_lose_nothing(tmp_path, offset):
    _docs(tmp_path / "a", "a")
    _docs(tmp_path / "b", "b")
    idx = tmp_path / "idx"  # does not exist yet: both runs race to create it
    p1 = _index(idx, tmp_path / "a", "alpha")
    time.sleep(offset)
    p2 = _index(idx, tmp_path / "b", "beta")
    out1, err1 = p1.communicate(timeout=300)
    out2, err2 = p2.communicate(timeout=300)
    assert p1.returncode == 0, err1.decode()
    assert p2.returncode == 0, err2.decode()
    m = json.loads((idx / "manifest.json").read_text())
    assert m["collections"]["alpha"]["docs"] == 3 and m["collections"]["beta"]["docs"] == 3
    assert m["generation"] == 2
    for tag in ("a0", "a1", "a2", "b0", "b1", "b2"):
        r = run_cli(["rag", "query", str(idx), f"zq{tag}", "--mode", "bm25", "-k", "1", "--jsonl"])
        assert r.exit_code == 0, r.stderr
        assert json.loads(r.stdout)["doc"].endswith(f"{tag}.txt")


def test_no_wait_fails_at_once_and_readers_do_not_block(tmp_path):
    from llmkit.rag.index.manifest import writer_lock

    _docs(tmp_path / "a", "a", 1)
    idx = tmp_path / "idx"
    assert run_cli(["rag", "index", str(idx), str(tmp_path / "a")]).exit_code == 0
    with writer_lock(str(idx)):
        t = time.time()
        r = run_cli(["rag", "index", str(idx), str(tmp_path / "a"), "--no-wait"])
        assert r.exit_code == 1 and "is being written by another process" in r.stderr
        q = run_cli(["rag", "query", str(idx), "zqa0", "--mode", "bm25", "-k", "1"])
        assert q.exit_code == 0 and "a0.txt" in q.stdout
        assert time.time() - t < 30
    # the lock is free again (a holder that exits releases it)
    assert run_cli(["rag", "index", str(idx), str(tmp_path / "a"), "--no-wait"]).exit_code == 0


def test_killed_writer_leaves_nothing_locked(tmp_path):
    _docs(tmp_path / "a", "a", 1)
    idx = tmp_path / "idx"
    code = ("import sys, time; sys.path.insert(0, %r)\nfrom llmkit.rag.index.manifest import writer_lock\n"
            "with writer_lock(%r):\n    print('held', flush=True); time.sleep(60)\n") % (str(ROOT), str(idx))
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == b"held"
    holder.kill()
    holder.wait()
    r = run_cli(["rag", "index", str(idx), str(tmp_path / "a"), "--no-wait"])
    assert r.exit_code == 0, r.stderr
