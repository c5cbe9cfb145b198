"""A small update publishes segments (segments.py): the base's BM25 postings and vectors are the
previous generation's files, hard-linked, dead rows are never answered, a delta holds the new rows,
and every score equals a full build's of the same files; past the threshold the run compacts."""

import json
import os
import time

import numpy as np
import pytest

from conftest import run_cli

pytest.importorskip("faiss")
pytest.importorskip("sentence_transformers")

OLD = time.time() - 3 * 3600  # well before any run: a stat taken now is not "racy"
WORDS = ("pump valve pipe tank gauge filter boiler fan motor belt gear shaft seal bearing nozzle hose "
         "clamp bolt flange weld rivet spring lever piston cylinder turbine rotor stator coil relay").split()
QUERIES = ["pump valve", "turbine rotor coil", "shared words everywhere", "seal bearing nozzle hose",
           "zebra giraffe", "gear", "flange weld rivet spring common"]


@pytest.fixture(scope="module")
def st32(tmp_path_factory):
    from tinyst import write_tiny_models

    return str(write_tiny_models(tmp_path_factory.mktemp("tiny"))["st32"])


def _para(seed: int) -> str:
    rng = np.random.default_rng(seed)
    # a few words in every paragraph: their idf is negative in a small corpus (rank-bm25's epsilon rule)
    return "Shared words everywhere common. " + " ".join(rng.choice(WORDS, 12 + seed % 7)) + "."


def _write(d, name, seeds):
    (d / name).write_text("\n\n".join(_para(s) for s in seeds) + "\n")
    os.utime(d / name, (OLD, OLD))


def _tree(d, n=12):
    d.mkdir()
    for i in range(n):
        _write(d, f"f{i:02d}.txt", range(10 * i, 10 * i + 4))


def _index(idx, d, st32, *extra):
    r = run_cli(["rag", "index", str(idx), str(d), "--model", st32, "--size", "200", "--no-tune", "--json", *extra])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def _gen(idx):
    return idx / f"gen-{json.loads((idx / 'manifest.json').read_text())['generation']}"


def _bm25(idx):
    """Per query: the top 20 (text, BM25 score), and every chunk's score keyed by its text."""
    from llmkit.rag.index.reader import Index

    ix = Index(str(idx))
    try:
        out = []
        for q in QUERIES:
            toks = ix.tok(q)
            top = ix.bm25.top_k(toks, 20)
            texts = ix.texts([r for r, _ in top])
            every = dict(zip(ix.texts(range(ix.n)), ix.bm25.scores(toks).tolist()))
            out.append(([(t, s) for t, (_, s) in zip(texts, top)], every))
        return out
    finally:
        ix.close()


def _hybrid(idx, queries):
    hits = []
    for q in queries:
        r = run_cli(["rag", "query", str(idx), q, "-k", "8", "--jsonl"])
        assert r.exit_code == 0, r.stderr
        hits.append([(h["doc"], h["text"]) for h in map(json.loads, r.stdout.splitlines())])
    return hits


def _same_as_clean(idx, d, st32, tmp_path, ordered=False, extra=()):
    """BM25 scores of every chunk and the top lists equal a full build's of the same files. Rows are
    numbered in the order chunks were added, so where an edit moved a file's chunks after others
    only tied scores may order otherwise; with `ordered` (the rows in the full build's order) the
    BM25 and hybrid result lists are the same lists."""
    clean = tmp_path / f"clean-{len(list(tmp_path.iterdir()))}"
    _index(clean, d, st32, *extra)
    for q, (top, every), (ctop, cevery) in zip(QUERIES, _bm25(idx), _bm25(clean)):
        assert every.keys() == cevery.keys()
        np.testing.assert_allclose([every[t] for t in cevery], list(cevery.values()), rtol=0, atol=1e-9)
        np.testing.assert_allclose([s for _, s in top], [s for _, s in ctop], rtol=0, atol=1e-9)
        cut = ctop[-1][1] + 1e-9 if len(ctop) == 20 and not ordered else -np.inf
        assert [t for t, s in top if s > cut] == [t for t, s in ctop if s > cut] or not ordered and (
            {t for t, s in top if s > cut} == {t for t, s in ctop if s > cut}), q
    if ordered:
        assert _hybrid(idx, QUERIES) == _hybrid(clean, QUERIES)


def test_small_updates_publish_segments_equal_to_a_full_build(tmp_path, st32, monkeypatch):
    from llmkit.rag.index import segments

    monkeypatch.setattr(segments, "RECOUNT_ROWS", 0)  # the alive document frequencies always carried
    d = tmp_path / "d"
    _tree(d)
    idx = tmp_path / "idx"
    first = _index(idx, d, st32)
    assert first["segments"] == {}
    base_docs = _gen(idx) / "bm25" / "docs.npy"
    base_inode = os.stat(base_docs).st_ino  # gen-1 itself is retired two runs later
    # the last file edited, one added after it, one deleted: the rows keep a full build's order
    _write(d, "f11.txt", [110, 111, 999, 113])
    _write(d, "zz-new.txt", [500, 501])
    (d / "f07.txt").unlink()
    gone = [_para(s) for s in range(70, 74)]
    r = _index(idx, d, st32)
    seg = r["segments"]
    # the edited and the deleted file's chunks are dead; the edited and the new file's are the delta
    assert seg["base_rows"] == first["chunks_indexed"] and seg["dead"] > 0 and seg["delta_rows"] > 0
    assert r["chunks_indexed"] == seg["base_rows"] - seg["dead"] + seg["delta_rows"]
    assert 0 < r["embedded"] < seg["delta_rows"]  # an edited file's unchanged text keeps its vector
    g = _gen(idx)
    assert os.path.samefile(g / "base" / "bm25" / "docs.npy", base_docs)  # the base is linked, not rebuilt
    assert os.path.samefile(g / "base" / "vectors.npy", base_docs.parent.parent / "vectors.npy")
    _same_as_clean(idx, d, st32, tmp_path, ordered=True)
    # a deleted file's chunks are in no list
    from llmkit.rag.index.reader import Index

    ix = Index(str(idx))
    try:
        rows, _ = ix.dense_list(np.ones(32, np.float32), ix.n + 10)
        assert sorted(rows) == list(range(ix.n))
        texts = ix.texts(range(ix.n))
        assert not any(p in t for p in gone for t in texts)
        assert ix.bm25.n_docs == ix.n == r["chunks_indexed"]
        assert "pump" in ix.bm25.vocab and "zebra" not in ix.bm25.vocab  # as BM25Index's vocabulary answers
    finally:
        ix.close()
    # a second and a third small update: the delta is rebuilt from its alive rows and the new ones
    _write(d, "zz-new.txt", [501, 502])
    _write(d, "f01.txt", [10, 11, 12, 13, 777])
    r2 = _index(idx, d, st32)
    assert r2["segments"]["base_rows"] == first["chunks_indexed"] and r2["segments"]["dead"] > seg["dead"]
    (d / "f11.txt").unlink()  # its chunks were delta rows: the delta shrinks, the base loses no row
    r3 = _index(idx, d, st32)
    assert r3["segments"]["dead"] == r2["segments"]["dead"] and r3["segments"]["delta_rows"] < r2["segments"]["delta_rows"]
    assert os.stat(_gen(idx) / "base" / "bm25" / "docs.npy").st_ino == base_inode
    _same_as_clean(idx, d, st32, tmp_path)
    hit = run_cli(["rag", "query", str(idx), "zebra", "--mode", "bm25", "--jsonl"])
    assert hit.exit_code == 0 and hit.stdout == ""


def test_a_duplicate_of_a_deleted_chunk_comes_back_in_the_delta(tmp_path, st32):
    d = tmp_path / "d"
    _tree(d, 6)
    _write(d, "f02b.txt", [20, 300])  # paragraph 20 repeats f02's first: deduplicated away
    idx = tmp_path / "idx"
    first = _index(idx, d, st32)
    assert first["exact_duplicates"] >= 1
    (d / "f02.txt").unlink()
    r = _index(idx, d, st32)
    assert r["segments"]["delta_rows"] >= 1 and r["exact_duplicates"] < first["exact_duplicates"]
    g = _gen(idx)
    base, delta = np.load(g / "base" / "row_of.npy"), np.load(g / "delta" / "row_of.npy")
    assert delta.min() < base.max()  # live again, between base rows (f02b's chunk id is below f03's)
    _same_as_clean(idx, d, st32, tmp_path)


def test_past_the_threshold_a_run_compacts(tmp_path, st32, monkeypatch):
    from llmkit.rag.index import segments

    d = tmp_path / "d"
    _tree(d)
    idx = tmp_path / "idx"
    _index(idx, d, st32)
    _write(d, "f05.txt", [50, 51, 52, 600])
    assert _index(idx, d, st32)["segments"]["delta_rows"] >= 1
    monkeypatch.setattr(segments, "DELTA_MIN", 2)
    monkeypatch.setattr(segments, "DELTA_FRACTION", 0.01)
    _write(d, "f06.txt", [601, 602, 603])
    r = _index(idx, d, st32)
    assert r["segments"] == {} and r["embedded"] >= 1
    g = _gen(idx)
    assert (g / "bm25" / "docs.npy").exists() and not (g / "base").exists()
    _same_as_clean(idx, d, st32, tmp_path)
    monkeypatch.setattr(segments, "DELTA_MIN", 1000)
    _write(d, "f08.txt", [80, 81, 82, 604])  # the compacted generation is the next base
    r = _index(idx, d, st32)
    assert r["segments"]["delta_rows"] >= 1 and os.path.samefile(_gen(idx) / "base" / "bm25" / "docs.npy",
                                                                 g / "bm25" / "docs.npy")
    _same_as_clean(idx, d, st32, tmp_path)


def _rows_like(idx):
    """Each row's (text, collection, parent text, the texts of its unit, its unit's lead text) and
    the manifest's fields, collections and counts: what the per-row arrays say, keyed by text."""
    from llmkit.rag.index.reader import Index

    ix = Index(str(idx))
    try:
        texts = ix.texts(range(ix.n))
        unit, lead = np.asarray(ix.unit), np.asarray(ix.lead)
        members = {}
        for r, u in enumerate(unit.tolist()):
            members.setdefault(u, set()).add(texts[r])
        parents = dict(ix.con.execute("SELECT id, text FROM parents"))
        rows = sorted((texts[r], ix.collections[int(ix.collection[r])], parents[int(ix.parent[r])],
                       tuple(sorted(members[u])), texts[int(lead[u])]) for r, u in enumerate(unit.tolist()))
        m = ix.manifest
        return rows, m["fields"], m["collection_order"], {k: (c["docs"], c["chunks"]) for k, c in m["collections"].items()}
    finally:
        ix.close()


def test_without_dedupe_a_small_update_carries_the_rows_and_reads_only_the_changed_chunks(tmp_path, st32, monkeypatch):
    from llmkit.rag.index import db, segments

    monkeypatch.setattr(segments, "RECOUNT_ROWS", 0)

    d = tmp_path / "d"
    _tree(d)
    (d / "tool.py").write_text("def pump_valve():\n    return 'pump valve gauge'\n\n\n"
                               "def turbine():\n    return 'turbine rotor coil'\n")
    os.utime(d / "tool.py", (OLD, OLD))
    other = tmp_path / "other"
    other.mkdir()
    _write(other, "o.txt", [900, 901])
    idx = tmp_path / "idx"
    _index(idx, d, st32, "--dedupe", "off")
    r = run_cli(["rag", "index", str(idx), str(other), "--collection", "other", "--dedupe", "off", "--no-tune", "--json"])
    assert r.exit_code == 0, r.stderr
    fields = json.loads((idx / "manifest.json").read_text())["fields"]
    assert "line_start" in fields  # only the code file's chunks have it

    def no_full_read(*a):
        raise AssertionError("every live chunk read")

    monkeypatch.setattr(db, "live_chunks", no_full_read)
    monkeypatch.setattr(db, "live_field_counts", no_full_read)
    _write(d, "f03.txt", [30, 31, 888, 33])  # edited in the middle: its chunks come after the others
    _write(d, "zz-new.txt", [500, 501])
    (d / "tool.py").unlink()  # the last chunks with line numbers: the field goes
    r = _index(idx, d, st32, "--dedupe", "off")
    assert r["segments"]["delta_rows"] > 0 and r["segments"]["dead"] > 0
    rows, fields, order, counts = _rows_like(idx)
    assert "line_start" not in fields and order == ["default", "other"]
    (other / "o.txt").unlink()  # the other collection's last document: the collection has no rows
    r = run_cli(["rag", "index", str(idx), str(other), "--collection", "other", "--dedupe", "off", "--no-tune", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["segments"]["dead"] > 0
    monkeypatch.undo()
    clean = tmp_path / "clean"
    _index(clean, d, st32, "--dedupe", "off")
    got, want = _rows_like(idx), _rows_like(clean)
    assert got[0] == want[0] and got[1] == want[1] and got[2] == want[2] == ["default"]
    assert got[3]["default"] == want[3]["default"] and got[3]["other"] == (0, 0)
    _same_as_clean(idx, d, st32, tmp_path, extra=("--dedupe", "off"))


def test_an_hnsw_base_never_returns_dead_rows_and_ranks_as_exact_search(tmp_path, st32, monkeypatch):
    from llmkit.rag.index import vectors
    from llmkit.rag.index.reader import Index

    monkeypatch.setattr(vectors, "EXACT_BELOW", 0)  # masked searches go through the graph's ID selector
    d = tmp_path / "d"
    _tree(d)
    idx = tmp_path / "idx"
    assert _index(idx, d, st32, "--index-type", "hnsw")["index_type"] == "hnsw"
    _write(d, "f04.txt", [40, 41, 444])
    (d / "f09.txt").unlink()
    r = _index(idx, d, st32, "--index-type", "hnsw")
    assert r["segments"]["dead"] > 0 and r["segments"]["delta_rows"] > 0
    assert (_gen(idx) / "base" / "faiss.index").exists()
    ix = Index(str(idx))
    try:
        every = ix.vector_store.of_rows(np.arange(ix.n))
        rng = np.random.default_rng(0)
        for q in rng.normal(size=(8, every.shape[1])).astype(np.float32):
            for depth, allowed in ((10, None), (ix.n + 5, None), (10, rng.random(ix.n) < 0.5)):
                rows, scores = ix.dense_list(q, depth, allowed)
                s = every @ q
                ok = np.ones(ix.n, bool) if allowed is None else allowed
                want = [int(i) for i in np.lexsort((np.arange(ix.n), -s)) if ok[i]][:depth]
                assert len(set(rows)) == len(rows) and all(0 <= r < ix.n and ok[r] for r in rows)
                assert rows == want  # a graph over a few dozen vectors with efSearch 64 is exact
                np.testing.assert_allclose(scores, s[want], rtol=1e-5, atol=1e-6)
        texts = ix.texts(range(ix.n))
        assert not any(_para(s) in t for s in range(90, 94) for t in texts)
    finally:
        ix.close()


def _long(seed: int, swap: int = 0) -> str:
    """A 40-word paragraph; `swap` words at its end changed: a near-duplicate of the paragraph."""
    words = list(np.random.default_rng(seed).choice(WORDS, 40))
    for i in range(swap):
        words[-1 - 2 * i] = "zebra" if words[-1 - 2 * i] != "zebra" else "giraffe"
    return " ".join(words) + "."


def _texts_file(d, name, paras):
    (d / name).write_text("\n\n".join(paras) + "\n")
    os.utime(d / name, (OLD, OLD))


def test_dedupe_of_a_small_update_equals_a_full_pass(tmp_path, st32, monkeypatch):
    from llmkit.rag.index import carry, db
    from llmkit.rag.index.reader import Index

    def kept(idx):
        ix = Index(str(idx))
        try:
            return ix.texts(range(ix.n))
        finally:
            ix.close()

    def step(edit):
        """Apply `edit` to both trees; index one with small updates, the other with full passes."""
        out = []
        for name, full in (("inc", False), ("full", True)):
            edit(tmp_path / f"d-{name}")
            with monkeypatch.context() as m:
                if full:
                    m.setattr(carry, "carried", lambda *a: None)
                elif (tmp_path / f"idx-{name}").exists():
                    m.setattr(db, "live_chunks", lambda *a: (_ for _ in ()).throw(AssertionError("a full read")))
                r = _index(tmp_path / f"idx-{name}", tmp_path / f"d-{name}", st32, "--size", "400")  # a chunk a paragraph
            out.append((kept(tmp_path / f"idx-{name}"), r["exact_duplicates"], r["near_duplicates"]))
        assert out[0] == out[1]
        return out[0]

    def first(d):
        d.mkdir()
        _texts_file(d, "f00.txt", [_long(1), _long(2)])
        _texts_file(d, "f01.txt", [_long(1, 1), _long(3)])  # a near-duplicate of f00's first
        _texts_file(d, "f02.txt", [_long(1, 2), _long(4).upper()])  # nearer to f01's than to f00's
        _texts_file(d, "f03.txt", [_long(4), _long(5)])  # an exact duplicate of f02's second (case)
        _texts_file(d, "f04.txt", [_long(4, 1), _long(6)])  # a near-duplicate of that key's first

    texts, exact, near = step(first)
    assert exact >= 1 and near >= 2
    texts, exact2, near2 = step(lambda d: (d / "f00.txt").unlink())  # f01's comes back, f02's may follow it
    assert _long(1, 1) in "\n".join(texts)
    texts, exact3, near3 = step(lambda d: (d / "f02.txt").unlink())  # f03's copy is now first of its key
    assert exact3 < exact2 and any(_long(4) in t for t in texts)
    step(lambda d: _texts_file(d, "f05.txt", [_long(5, 1), _long(7), _long(7)]))  # new near and exact duplicates
    step(lambda d: _texts_file(d, "f01.txt", [_long(8), _long(3)]))  # edited
