"""Past one machine, on real engines run locally: vectors in Milvus (the embedded Milvus Lite engine
behind the same pymilvus client a Milvus server uses) must answer exactly as faiss does, through
updates and filters; embedding on a real local Ray runtime must give a local run's vectors."""

import json

import numpy as np
import pytest

from conftest import run_cli
from serverutil import free_port

pytest.importorskip("pymilvus")


@pytest.fixture(scope="module")
def docs(tmp_path_factory, kernel_docs):
    root = tmp_path_factory.mktemp("scale")
    paras = [p.strip() for p in kernel_docs.read_text(encoding="utf-8").split("\n\n")
             if 200 < len(p.strip()) < 900][:120]
    d = root / "docs"
    d.mkdir()
    for i in range(0, len(paras), 10):
        (d / f"part{i // 10}.jsonl").write_text("".join(
            json.dumps({"id": f"d{j}", "text": paras[j], "topic": "even" if j % 2 == 0 else "odd"}) + "\n"
            for j in range(i, min(i + 10, len(paras)))))
    return root


QUERIES = ["how does the scheduler pick the next task", "memory allocation with kmalloc", "interrupt handlers",
           "file system locking"]


def _hits(idx, q, *extra):
    r = run_cli(["rag", "query", str(idx), q, "--mode", "dense", "-k", "10", "--jsonl", *extra])
    assert r.exit_code == 0, r.stderr
    return [(h["chunk_id"], h["meta"].get("topic")) for h in map(json.loads, r.stdout.splitlines())]


def _dense_scores(idx, q):
    from llmkit.rag.index.reader import Index

    ix = Index(str(idx))
    rows, scores = ix.dense_list(ix.embedder().queries([q])[0], 10)
    return [int(ix.rows[r]) for r in rows], np.array(scores)


def _index(idx, *paths, extra=()):
    r = run_cli(["rag", "index", str(idx), *map(str, paths), *extra])
    assert r.exit_code == 0, r.stderr
    return r


def test_milvus_answers_as_faiss_through_updates_and_filters(docs, tmp_path):
    fa, mv = tmp_path / "faiss", tmp_path / "milvus"
    _index(fa, docs / "docs")
    _index(mv, docs / "docs", extra=["--store", "milvus+local:"])
    m = json.loads((mv / "manifest.json").read_text())
    assert m["store"]["engine"] == "milvus" and m["store"]["collection"].startswith("llmkit_milvus_")
    assert not (mv / f"gen-{m['generation']}" / "faiss.index").exists()
    assert "milvus+local:milvus.db collection llmkit_milvus_" in run_cli(["rag", "info", str(mv)]).stdout
    for q in QUERIES:
        a, b = _dense_scores(fa, q), _dense_scores(mv, q)
        assert a[0] == b[0], q
        np.testing.assert_allclose(a[1], b[1], atol=1e-5)
        assert _hits(fa, q, "--filter", "topic=even") == _hits(mv, q, "--filter", "topic=even")
    # the vectors of chosen rows (a unit's first chunk in dense lists) read from the engine as from faiss
    from llmkit.rag.index.reader import Index

    fx, mx = Index(str(fa)), Index(str(mv))
    rows = np.array([7, 0, 3, mx.n - 1])
    assert fx.texts(rows) == mx.texts(rows)
    np.testing.assert_allclose(mx.vector_store.of_rows(rows), fx.vector_store.of_rows(rows), atol=1e-6)
    np.testing.assert_array_equal(mx.vector_store.of_rows(rows), np.asarray(mx.vectors())[rows])
    # incremental: one file changed, one removed; the engine loses the removed rows
    part0 = docs / "docs" / "part0.jsonl"
    lines = part0.read_text().splitlines()
    changed = tmp_path / "docs2"
    changed.mkdir()
    for p in sorted((docs / "docs").glob("part*.jsonl"))[1:-1]:
        (changed / p.name).write_text(p.read_text())
    (changed / "part0.jsonl").write_text("\n".join(lines[:5]) + "\n" + json.dumps(
        {"id": "new", "text": "The scheduler picks the next task from the red-black tree of runnable tasks.",
         "topic": "even"}) + "\n")
    for idx in (fa, mv):
        _index(idx, changed)  # the paths differ: everything under docs/ is gone, docs2/ is new
        _index(idx, changed)  # nothing changed: nothing embedded
    for q in QUERIES:
        a, b = _dense_scores(fa, q), _dense_scores(mv, q)
        assert a[0] == b[0], q
    from llmkit.rag.index.reader import Index

    ix = Index(str(mv))
    st = ix.vstore
    stats = st.client.get_collection_stats(ix.manifest["store"]["collection"])
    assert int(stats["row_count"]) == ix.n  # rows of removed documents were deleted from the engine
    r = run_cli(["rag", "index", str(mv), str(changed), "--json"])
    assert json.loads(r.stdout)["embedded"] == 0


def test_store_errors_are_one_sentence(docs, tmp_path):
    r = run_cli(["rag", "index", str(tmp_path / "x"), str(docs / "docs" / "part0.jsonl"), "--store", "redis://h:1"])
    assert r.exit_code == 1 and "unknown --store 'redis://h:1'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()
    r = run_cli(["rag", "index", str(tmp_path / "y"), str(docs / "docs" / "part0.jsonl"), "--store",
                 f"milvus://127.0.0.1:{free_port()}"])
    assert r.exit_code == 1 and "Milvus store" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "y" / "manifest.json").exists()
    fa = tmp_path / "fa"
    _index(fa, docs / "docs" / "part0.jsonl")
    before = (fa / "manifest.json").read_text()
    r = run_cli(["rag", "index", str(fa), str(docs / "docs" / "part1.jsonl"), "--store", "milvus+local:v.db"])
    assert r.exit_code == 1 and "keeps its vectors in faiss" in r.stderr
    assert (fa / "manifest.json").read_text() == before


def test_milvus_collection_of_another_dimension_is_refused(tmp_path):
    from llmkit.errors import BadInput
    from llmkit.rag.index.milvus import MilvusStore, parse_store

    st = MilvusStore(parse_store("milvus+local:v.db", str(tmp_path)), str(tmp_path))
    try:
        st.create("c", 8, "flat")
        with pytest.raises(BadInput, match="holds 8-d vectors but the embedding model gives 384-d"):
            st.create("c", 384, "flat")
    finally:
        st.close()


def test_ray_embedding_equals_a_local_run(docs, tmp_path):
    pytest.importorskip("ray.data")
    local, ray = tmp_path / "local", tmp_path / "ray"
    # fp32: a bf16 index (the default on AMX CPUs) embeds a local bulk call through OpenVINO but Ray's
    # batches of 16 on ONNX Runtime, equal only within bf16 rounding
    _index(local, docs / "docs", extra=["--embed-precision", "fp32"])
    _index(ray, docs / "docs", extra=["--ray", "local,workers=2,batch=16", "--embed-precision", "fp32"])
    g = json.loads((local / "manifest.json").read_text())["generation"]
    a, b = np.load(local / f"gen-{g}" / "vectors.npy"), np.load(ray / f"gen-{g}" / "vectors.npy")
    assert (np.load(local / f"gen-{g}" / "rows.npy") == np.load(ray / f"gen-{g}" / "rows.npy")).all()
    np.testing.assert_allclose(a, b, atol=1e-5)
    for q in QUERIES[:2]:
        assert _hits(local, q) == _hits(ray, q)


def test_failed_remote_write_leaves_the_index_as_it_was(docs, tmp_path):
    mv = tmp_path / "mv"
    _index(mv, docs / "docs" / "part0.jsonl", extra=["--store", "milvus+local:"])
    manifest = json.loads((mv / "manifest.json").read_text())
    before = _hits(mv, QUERIES[0])
    dead = dict(manifest, store=dict(manifest["store"], uri=f"milvus://127.0.0.1:{free_port()}"))
    (mv / "manifest.json").write_text(json.dumps(dead))
    r = run_cli(["rag", "index", str(mv), str(docs / "docs" / "part1.jsonl")])
    assert r.exit_code == 1 and "cannot reach the Milvus store" in r.stderr
    assert json.loads((mv / "manifest.json").read_text()) == dead  # no new generation
    assert not (mv / f"gen-{manifest['generation'] + 1}").exists()
    (mv / "manifest.json").write_text(json.dumps(manifest))
    assert _hits(mv, QUERIES[0]) == before
    r = run_cli(["rag", "index", str(mv), str(docs / "docs" / "part1.jsonl"), "--json"])
    rep = json.loads(r.stdout)
    assert r.exit_code == 0 and rep["docs_added"] == 10 and rep["docs_unchanged"] == 0
