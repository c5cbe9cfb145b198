"""`rag index` at the size of a code base: unchanged files recognised by their stat without being read,
boilerplate found from a bounded sample, texts tokenized per batch, a long run's chunks searchable by
BM25 before they are embedded, and a run killed with SIGKILL while embedding resumed by the next one
(its vectors kept batch by batch), ending equal to a clean run."""

import json
import os
import signal
import sqlite3
import subprocess
import time

import numpy as np
import pytest

from conftest import run_cli, start_subprocess

pytest.importorskip("faiss")
pytest.importorskip("sentence_transformers")

OLD = time.time() - 3 * 3600  # well before any run: a stat taken now is not "racy"
TOPICS = ["pumps move water", "valves stop flow", "pipes carry gas", "tanks store oil", "gauges read pressure",
          "filters catch dirt", "boilers heat steam", "fans cool air"]


@pytest.fixture(scope="module")
def st32(tmp_path_factory):
    from tinyst import write_tiny_models

    return str(write_tiny_models(tmp_path_factory.mktemp("tiny"))["st32"])


def _corpus(d, records=True):
    d.mkdir()
    footer = "Copyright Zorblax Corporation, all rights reserved."
    for i, t in enumerate(TOPICS):
        (d / f"t{i}.txt").write_text(f"Notes on {t} in the plant number {i}. Check it weekly.\n\n{footer}\n")
    if records:
        (d / "rows.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "text": f"Record {i} on {t}."}) + "\n"
                                              for i, t in enumerate(TOPICS)))
    for p in d.iterdir():
        os.utime(p, (OLD, OLD))


def _index(idx, d, *extra):
    r = run_cli(["rag", "index", str(idx), str(d), "--size", "200", "--no-tune", "--json", *extra])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def reads(monkeypatch):
    """The files `rag index` opens for their contents, in order."""
    from llmkit.rag.index import build

    opened = []
    real = build.read_input

    def spy(path):
        opened.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(build, "read_input", spy)
    return opened


def test_unchanged_files_are_recognised_by_their_stat_without_reading(tmp_path, st32, reads):
    d = tmp_path / "d"
    _corpus(d)
    idx = tmp_path / "idx"
    first = _index(idx, d, "--model", st32)
    n_docs = len(TOPICS) * 2
    assert first["docs_added"] == n_docs and first["generation"] == 1
    before = _top(idx, "valves stop flow")
    reads.clear()
    again = _index(idx, d)
    assert reads == []  # nothing opened, nothing parsed
    assert again["docs_unchanged"] == n_docs and again["docs_added"] == again["docs_removed"] == 0
    assert again["generation"] == 2 and again["embedded"] == 0 and again["chunks_indexed"] == first["chunks_indexed"]
    # nothing rebuilt: the new generation's files are the live one's (rows.npy copied: readers lock it)
    assert os.path.samefile(idx / "gen-1" / "vectors.npy", idx / "gen-2" / "vectors.npy")
    assert not os.path.samefile(idx / "gen-1" / "rows.npy", idx / "gen-2" / "rows.npy")
    assert _top(idx, "valves stop flow") == before  # and answers as the live one did
    # touched, content identical: read once (the hash says unchanged), then its new stat is kept
    os.utime(d / "t3.txt", (OLD + 60, OLD + 60))
    os.utime(d / "rows.jsonl", (OLD + 60, OLD + 60))
    reads.clear()
    touched = _index(idx, d)
    assert sorted(reads) == ["rows.jsonl", "t3.txt"]
    assert touched["docs_unchanged"] == n_docs and touched["docs_added"] == 0 and touched["embedded"] == 0
    reads.clear()
    assert _index(idx, d)["docs_unchanged"] == n_docs and reads == []
    # an edit of the same size is seen by its new mtime
    text = (d / "t5.txt").read_text().replace("weekly", "hourly")
    (d / "t5.txt").write_text(text)
    os.utime(d / "t5.txt", (OLD + 120, OLD + 120))
    reads.clear()
    edited = _index(idx, d)
    assert reads == ["t5.txt"] and edited["docs_added"] == 1 and edited["embedded"] == 1
    hit = run_cli(["rag", "query", str(idx), "hourly", "--mode", "bm25", "--jsonl", "-k", "1"])
    assert json.loads(hit.stdout)["doc"].endswith("t5.txt")
    # a file modified just now is read again next time (an edit within its mtime tick could go unseen)
    (d / "t6.txt").write_text("Fresh notes on fans cool air, written a moment ago in the plant.\n")
    assert _index(idx, d)["docs_added"] == 1
    reads.clear()
    fresh = _index(idx, d)
    assert reads == ["t6.txt"] and fresh["docs_added"] == 0 and fresh["embedded"] == 0
    # a removed file is found by the walk, without reading the others
    (d / "t0.txt").unlink()
    reads.clear()
    gone = _index(idx, d)
    assert gone["docs_removed"] == 1 and reads in ([], ["t6.txt"])
    assert sorted(p.name for p in idx.glob("gen-*")) == [f"gen-{gone['generation'] - 1}", f"gen-{gone['generation']}"]


def test_an_index_without_file_stats_reads_its_files_once(tmp_path, st32, reads):
    d = tmp_path / "d"
    _corpus(d)
    idx = tmp_path / "idx"
    _index(idx, d, "--model", st32)
    con = sqlite3.connect(idx / "chunks.sqlite")
    con.execute("UPDATE docs SET size = NULL, mtime_ns = NULL, inode = NULL")  # as an older llmkit wrote it
    con.commit()
    con.close()
    reads.clear()
    assert _index(idx, d)["docs_added"] == 0 and len(reads) == len(TOPICS) + 1
    reads.clear()
    assert _index(idx, d)["docs_added"] == 0 and reads == []


def test_boilerplate_from_a_spread_sample(tmp_path, st32, monkeypatch):
    from llmkit.rag.index import build

    d = tmp_path / "d"
    _corpus(d, records=False)
    monkeypatch.setattr(build, "SAMPLE_FILES", 5)  # 5 of the 8 files, spread over the walk
    monkeypatch.setattr(build, "SAMPLE_CHARS", 150)  # most sampled files are read again in the main pass
    rep = _index(tmp_path / "idx", d, "--model", st32)
    assert rep["boilerplate_lines"] == 1 and rep["docs_added"] == len(TOPICS) and rep["skipped"] == []
    r = run_cli(["rag", "query", str(tmp_path / "idx"), "Zorblax", "--mode", "bm25", "--jsonl"])
    assert r.exit_code == 0 and r.stdout == ""


def test_texts_are_tokenized_per_window_with_the_same_vectors(st32, monkeypatch):
    from llmkit.rag.embed import onnx_runtime
    from llmkit.rag.embed.embedder import load_embedder

    emb = load_embedder(st32)
    texts = [f"Note {i}: " + " ".join(TOPICS[: 1 + i % len(TOPICS)]) for i in range(11)]
    whole = emb.passages(texts)
    seen = []
    real = emb.encoder.tokenizer.encode_batch
    monkeypatch.setattr(onnx_runtime, "TOKENIZE_WINDOW", 4)
    monkeypatch.setattr(emb.encoder, "tokenizer", _Spy(emb.encoder.tokenizer, real, seen))
    np.testing.assert_allclose(emb.passages(texts), whole, atol=1e-6)
    assert seen == [4, 4, 3]


class _Spy:
    """A tokenizer that records how many texts each encode_batch call gets."""

    def __init__(self, tok, real, seen):
        self._tok, self._real, self._seen = tok, real, seen

    def encode_batch(self, texts):
        self._seen.append(len(texts))
        return self._real(texts)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def _journal(idx) -> int:
    try:
        con = sqlite3.connect(f"file:{idx / 'chunks.sqlite'}?mode=ro", uri=True, timeout=1)
        try:
            return con.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def _chunks(idx) -> list[tuple[str, str]]:
    """(document path, text) of the live generation's chunks."""
    gen = json.loads((idx / "manifest.json").read_text())["generation"]
    ids = np.load(idx / f"gen-{gen}" / "rows.npy").tolist()
    con = sqlite3.connect(idx / "chunks.sqlite")
    try:
        got = con.execute(f"SELECT d.path, c.text FROM chunks c JOIN docs d ON d.id = c.doc_id "
                          f"WHERE c.id IN ({','.join('?' * len(ids))})", ids).fetchall()
    finally:
        con.close()
    assert len(got) == len(ids)
    return sorted(got)


def _top(idx, q, *extra):
    r = run_cli(["rag", "query", str(idx), q, "-k", "10", "--jsonl", *extra])
    assert r.exit_code == 0, r.stderr
    return [(h["doc"], h["text"]) for h in map(json.loads, r.stdout.splitlines())]


def test_a_run_killed_while_embedding_is_searchable_then_resumed(tmp_path, kernel_small, st32, monkeypatch):
    big = tmp_path / "big"
    big.mkdir()
    text = kernel_small.read_text()[:60_000]
    for i in range(12):
        (big / f"part{i}.txt").write_text(text[i * 5_000:(i + 1) * 5_000])
    small = tmp_path / "small"
    small.mkdir()
    (small / "a.txt").write_text("The scheduler keeps runnable tasks in a red-black tree ordered by virtual runtime.")
    idx = tmp_path / "idx"
    args = ["--size", "200", "--no-tune", "--model", st32]
    assert run_cli(["rag", "index", str(idx), str(small), *args]).exit_code == 0
    before = _top(idx, "scheduler red-black tree")
    # one chunk per batch: every vector is committed as it is made (and equal to a clean run's, bit for bit)
    monkeypatch.setenv("LLMKIT_INDEX_BATCH", "1")
    p = start_subprocess(["rag", "index", idx, big, *args], stdout=subprocess.DEVNULL)
    deadline = time.time() + 180
    while _journal(idx) < 48 and p.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    assert p.poll() is None, p.stderr.read().decode()
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    kept = _journal(idx)
    assert kept >= 48
    # more chunks than 16 batches: they were published for BM25 before embedding began (generation 2)
    m = json.loads((idx / "manifest.json").read_text())
    assert m["generation"] == 2 and m["pending"] > kept
    assert _top(idx, "scheduler red-black tree")[0] == before[0]
    words = " ".join(text[15_200:15_400].split()[3:12])  # from part3.txt
    bm25 = run_cli(["rag", "query", str(idx), words, "--mode", "bm25", "--jsonl", "-k", "1"])
    assert json.loads(bm25.stdout)["doc"].endswith("part3.txt")  # searchable before its vectors exist
    assert run_cli(["rag", "query", str(idx), words]).exit_code == 0  # hybrid: dense over the embedded rows
    from llmkit.rag.index.reader import Index

    ix = Index(str(idx))
    assert ix.embedded is not None and 0 < ix.embedded.sum() < ix.n  # some rows still wait for their vector
    rows, _ = ix.dense_list(np.ones(int(m["dim"]), np.float32), ix.n)
    assert rows and all(ix.embedded[r] for r in rows)  # a zero vector never enters a dense list
    ix.close()
    info = run_cli(["rag", "info", str(idx)])
    assert f"embedding: {m['pending']} chunk(s) without vectors yet" in info.stdout
    r = run_cli(["rag", "index", str(idx), str(big), *args, "--json"])
    assert r.exit_code == 0, r.stderr
    rerun = json.loads(r.stdout)
    assert rerun["generation"] == 3 and rerun["docs_added"] == 0 and rerun["docs_unchanged"] == 12
    assert rerun["vectors_resumed"] == kept and rerun["embedded"] == m["pending"] - kept  # only the rest
    assert "pending" not in json.loads((idx / "manifest.json").read_text())
    assert rerun["embedded"] + rerun["vectors_reused"] == rerun["chunks_indexed"]
    assert _journal(idx) == 0  # published: the generation holds them
    clean = tmp_path / "clean"
    for src in (small, big):
        r = run_cli(["rag", "index", str(clean), str(src), *args, "--json"])
        assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["embedded"] == m["pending"] and json.loads(r.stdout)["generation"] == 3
    assert _chunks(idx) == _chunks(clean)
    linked = [os.stat(clean / f"gen-{g}" / "bm25" / "params.json").st_ino for g in (2, 3)]
    assert linked[0] == linked[1]  # the clean run's final generation took its first one's BM25 as it was
    gen = {d: json.loads((d / "manifest.json").read_text())["generation"] for d in (idx, clean)}
    np.testing.assert_array_equal(np.load(idx / f"gen-{gen[idx]}" / "vectors.npy"),
                                  np.load(clean / f"gen-{gen[clean]}" / "vectors.npy"))
    for q in ("scheduler red-black tree", "memory allocation with kmalloc", "interrupt handlers",
              "how are locks taken", words):
        assert _top(idx, q) == _top(clean, q), q
        # the clean run's BM25 files are its searchable-first generation's, the resumed one's built anew
        assert _top(idx, q, "--mode", "bm25") == _top(clean, q, "--mode", "bm25"), q


def test_a_file_that_changes_while_it_is_read_is_read_again(tmp_path, st32, monkeypatch):
    from llmkit.rag.index import build

    d = tmp_path / "d"
    _corpus(d, records=False)
    target = d / "t2.txt"
    real, calls = build.read_input, []

    def racing(path):
        data = real(path)
        if path.endswith("t2.txt") and not calls:  # an editor saves while the first read is under way
            calls.append(path)
            target.write_text("Rewritten notes on pipes carry gas, saved during the read.\n")
            os.utime(target, (OLD + 5, OLD + 5))
        return data

    monkeypatch.setattr(build, "read_input", racing)
    assert _index(tmp_path / "idx", d, "--model", st32)["docs_added"] == len(TOPICS)
    r = run_cli(["rag", "query", str(tmp_path / "idx"), "Rewritten saved", "--mode", "bm25", "--jsonl", "-k", "1"])
    assert json.loads(r.stdout)["doc"].endswith("t2.txt")  # the version read after the change
    opened = []
    monkeypatch.setattr(build, "read_input", lambda path: opened.append(path) or real(path))
    assert _index(tmp_path / "idx", d)["docs_added"] == 0 and opened == []  # its stat after the read was kept
