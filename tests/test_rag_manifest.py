"""The index manifest's format version: every older layout the suite can build (tests/ragold.py)
opens and answers as it did, the next writer run upgrades it without losing a chunk, a run that
dies midway leaves the old index usable, and a newer format is refused naming both versions."""

import json
import shutil
import subprocess
import sys

import pytest

from conftest import run_cli
from ragold import ERAS, as_format1

QUERIES = ["filesystem mount options", "kernel memory pages", "how are patches submitted", "parseConfig"]


@pytest.fixture(scope="module")
def corpus(kernel_docs, tmp_path_factory):
    root = tmp_path_factory.mktemp("manifest")
    paras = [p.strip() for p in kernel_docs.read_text(encoding="utf-8").split("\n\n") if 200 < len(p.strip()) < 1500]
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": p}) + "\n" for i, p in enumerate(paras[:60])))
    (root / "more.jsonl").write_text("".join(json.dumps({"id": f"m{i}", "text": p}) + "\n"
                                             for i, p in enumerate(paras[60:66])))
    built = root / "built"
    r = run_cli(["rag", "index", str(built), str(docs), "--analysis", "plain", "--no-tune"])
    assert r.exit_code == 0, r.stderr
    return root, built


def _answers(idx):
    out = []
    for q in QUERIES:
        r = run_cli(["rag", "query", str(idx), q, "-k", "8", "--jsonl"])
        assert r.exit_code == 0, r.stderr
        out.append([(h["chunk_id"], round(h["score"], 5), h["text"]) for h in map(json.loads, r.stdout.splitlines())])
    return out


def _chunks(idx):
    from llmkit.rag.index.reader import Index

    ix = Index(str(idx))
    try:
        return sorted(ix.rows.tolist()), ix.n
    finally:
        ix.close()


@pytest.mark.parametrize("era", ERAS)
def test_each_older_layout_opens_answers_the_same_and_is_upgraded_by_the_next_run(corpus, tmp_path, era):
    from llmkit.rag.index.manifest import VERSION, read_manifest, stored_version

    root, built = corpus
    idx = tmp_path / era
    shutil.copytree(built, idx)
    old = as_format1(idx, era)
    m = read_manifest(str(idx))  # read as the current version, nothing written
    assert m["version"] == VERSION and stored_version(str(idx)) == 1
    assert m["analysis"] == "plain" and m["ranking"] == ("documents" if era == "v1" else "chunks")
    assert m["bm25_idents"] is (era != "v1-words") and "stem" not in m
    before, rows = _answers(idx), _chunks(idx)
    assert json.loads((idx / "manifest.json").read_text()) == old
    info = run_cli(["rag", "info", str(idx)])
    assert info.exit_code == 0 and "stored as v1: the next write upgrades it" in info.stdout
    r = run_cli(["rag", "index", str(idx), str(root / "docs.jsonl"), "--no-tune"])  # nothing changed
    assert r.exit_code == 0, r.stderr
    assert stored_version(str(idx)) == VERSION and _chunks(idx) == rows
    assert _answers(idx) == before
    written = json.loads((idx / "manifest.json").read_text())
    assert written["generation"] == old["generation"] + 1 and written["analysis"] == "plain"
    # extended after the upgrade: its analysis and ranking stay what the old index had
    r = run_cli(["rag", "index", str(idx), str(root / "more.jsonl"), "--no-tune"])
    assert r.exit_code == 0, r.stderr
    ids, n = _chunks(idx)
    assert set(rows[0]) < set(ids) and read_manifest(str(idx))["ranking"] == m["ranking"]


def test_a_tuned_fusion_keeps_its_settings(corpus, tmp_path):
    from llmkit.rag.index.manifest import read_manifest

    _, built = corpus
    idx = tmp_path / "tuned"
    shutil.copytree(built, idx)
    path = idx / "manifest.json"
    m = json.loads(path.read_text())
    m["fusion"] = {"method": "rrf", "rrf_k": 20, "weights": {"bm25": 0.3, "dense": 0.7}, "norm": "minmax",
                   "expand": 0, "parents": False, "tuned": {"source": "judged", "label": "rrf k20"}}
    path.write_text(json.dumps(m))
    as_format1(idx, "v1")
    assert json.loads(path.read_text())["fusion"]["k"] == 20
    assert read_manifest(str(idx))["fusion"]["rrf_k"] == 20
    r = run_cli(["rag", "query", str(idx), "kernel memory", "--explain"])
    assert r.exit_code == 0 and "fusion (tuned): rrf k 20 bm25 0.3, dense 0.7" in r.stderr


CRASH = """
import os, sys
from llmkit.rag.index import publish
from llmkit.rag.index.build import IndexOptions, build

def die(*a, **kw):
    os._exit(9)  # the process dies after its generation is written, before the manifest swap

publish._swap = die
build(sys.argv[1], [sys.argv[2]], IndexOptions())
"""


def test_a_run_that_dies_midway_leaves_the_old_index_usable(corpus, tmp_path):
    from llmkit.rag.index.manifest import stored_version

    root, built = corpus
    idx = tmp_path / "crash"
    shutil.copytree(built, idx)
    as_format1(idx, "v1-chunks")
    manifest = (idx / "manifest.json").read_bytes()
    before, rows = _answers(idx), _chunks(idx)
    p = subprocess.run([sys.executable, "-c", CRASH, str(idx), str(root / "more.jsonl")], capture_output=True,
                       timeout=300)
    assert p.returncode == 9, p.stderr.decode()
    assert (idx / "manifest.json").read_bytes() == manifest and stored_version(str(idx)) == 1
    assert _answers(idx) == before and _chunks(idx) == rows
    r = run_cli(["rag", "index", str(idx), str(root / "more.jsonl"), "--no-tune"])  # the next run finishes it
    assert r.exit_code == 0, r.stderr
    assert stored_version(str(idx)) == 2 and set(rows[0]) < set(_chunks(idx)[0])


def test_a_newer_format_is_refused_in_one_line_naming_both_versions(corpus, tmp_path):
    from llmkit.rag.index.manifest import VERSION

    _, built = corpus
    idx = tmp_path / "newer"
    shutil.copytree(built, idx)
    m = json.loads((idx / "manifest.json").read_text())
    m["version"] = VERSION + 1
    (idx / "manifest.json").write_text(json.dumps(m))
    for args in (["query", str(idx), "x"], ["info", str(idx)], ["index", str(idx), str(idx / "manifest.json")]):
        r = run_cli(["rag", *args])
        assert r.exit_code == 1 and "Traceback" not in r.stderr
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and f"format version {VERSION + 1}" in lines[0] and f"({VERSION})" in lines[0], lines
    m["version"] = "two"
    (idx / "manifest.json").write_text(json.dumps(m))
    r = run_cli(["rag", "query", str(idx), "x"])
    assert r.exit_code == 1 and "no readable format version" in r.stderr
