"""`rag index` options asserted on what ends up in the index (--include/--exclude, --meta,
--text-field/--id-field, --graph-llm) and `rag cranfield`'s conversion as a known answer, then
evaluated end to end. Indexes use a tiny random 32-d model (tests/tinyst.py): fast, no download."""

import json
import math
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import run_cli

ROOT = Path(__file__).parent.parent

pytest.importorskip("faiss")
pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def st32(tmp_path_factory):
    from tinyst import write_tiny_models

    return str(write_tiny_models(tmp_path_factory.mktemp("tiny"))["st32"])


def index(idx, *args):
    r = run_cli(["rag", "index", str(idx), *args, "--json"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def hits(idx, q, *args):
    r = run_cli(["rag", "query", str(idx), q, "--mode", "bm25", "--jsonl", "-k", "50", *args])
    assert r.exit_code == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_globs_and_meta(tmp_path, st32):
    d = tmp_path / "docs"
    (d / "notes").mkdir(parents=True)
    for rel in ("a.md", "b.txt", "notes/c.txt", "notes/d.txt"):
        (d / rel).write_text(f"kernel memory notes from {rel}\n")
    rep = index(tmp_path / "idx", str(d), "--model", st32, "--glob", "*.txt", "--glob", "!c.*",
                "--meta", "team=kernel", "--meta", "year=2024")
    assert rep["docs_added"] == 2
    got = hits(tmp_path / "idx", "kernel memory")
    assert sorted(h["doc"].rsplit("docs/", 1)[1] for h in got) == ["b.txt", "notes/d.txt"]
    assert all(h["meta"]["team"] == "kernel" and str(h["meta"]["year"]) == "2024" for h in got)
    assert len(hits(tmp_path / "idx", "kernel memory", "--filter", "team=kernel")) == 2
    assert hits(tmp_path / "idx", "kernel memory", "--filter", "team=other") == []
    # a glob that matches no file would empty the collection: refused, the index untouched
    r = run_cli(["rag", "index", str(tmp_path / "idx"), str(d), "--model", st32, "--glob", "*.rst"])
    assert r.exit_code == 1 and "--glob '*.rst' matches none of the 4 files under" in r.stderr
    assert len(hits(tmp_path / "idx", "kernel memory")) == 2


def test_text_field_and_id_field(tmp_path, st32):
    recs = [{"key": "doc-a", "body": "zebras graze on the savanna", "text": "decoy words only"},
            {"key": "doc-b", "body": "penguins swim in cold water", "text": "decoy words only"}]
    f = tmp_path / "recs.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    index(tmp_path / "idx", str(f), "--model", st32, "--text-field", "body", "--id-field", "key")
    (zebra,) = hits(tmp_path / "idx", "zebras savanna")
    assert zebra["text"] == "zebras graze on the savanna" and "doc-a" in zebra["doc"]
    assert hits(tmp_path / "idx", "decoy") == []  # the default "text" field was not indexed
    assert "penguins" in hits(tmp_path / "idx", "penguins")[0]["text"] and "doc-b" in hits(tmp_path / "idx", "penguins")[0]["doc"]


CRAN_DOCS = """.I 1
.T
wing in a slipstream .
.A
brenckman,m.
.B
j. ae. scs. 25, 1958, 324.
.W
wing in a slipstream .
  an experimental study of a wing in a propeller slipstream .
.I 2
.T
heat transfer in hypersonic flow .
.A
smith,j.
.W
heat transfer in hypersonic flow .
  measurements of heat transfer to a cone .
.I 3
.T
title only record .
"""
CRAN_QRY = """.I 001
.W
what is the lift of a wing in a
propeller slipstream .
.I 004
.W
heat transfer to a cone in hypersonic flow .
"""
CRAN_QREL = "1 1 2\n1 3 -1\n2 2 1\n2 1 4\n"


def test_cranfield_conversion_known_answer_and_eval(tmp_path, st32):
    src = tmp_path / "cran"
    src.mkdir()
    (src / "cran.all.1400").write_text(CRAN_DOCS)
    (src / "cran.qry").write_text(CRAN_QRY)
    (src / "cranqrel").write_text(CRAN_QREL)
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "cranfield.py"), str(src), "-o", str(out)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and "3 documents, 2 queries, 3 judgments" in p.stderr, p.stderr
    old = run_cli(["rag", "cranfield", str(src), "-o", str(tmp_path / "old")])  # deprecated spelling: same files
    assert old.exit_code == 0 and "scripts/cranfield.py" in old.stderr
    assert (tmp_path / "old" / "qrels.txt").read_text() == (out / "qrels.txt").read_text()
    docs = [json.loads(line) for line in (out / "docs.jsonl").read_text().splitlines()]
    assert docs == [
        {"id": "1", "title": "wing in a slipstream .", "author": "brenckman,m.",
         "text": "wing in a slipstream . an experimental study of a wing in a propeller slipstream ."},
        {"id": "2", "title": "heat transfer in hypersonic flow .", "author": "smith,j.",
         "text": "heat transfer in hypersonic flow . measurements of heat transfer to a cone ."},
        {"id": "3", "title": "title only record .", "author": "", "text": "title only record ."}]
    queries = [json.loads(line) for line in (out / "queries.jsonl").read_text().splitlines()]
    assert queries == [{"id": "1", "text": "what is the lift of a wing in a propeller slipstream ."},
                       {"id": "2", "text": "heat transfer to a cone in hypersonic flow ."}]  # ids in file order, not .I
    assert (out / "qrels.txt").read_text() == "1 0 1 3\n2 0 2 4\n2 0 1 1\n"  # codes 1..4 -> grades 4..1, -1 dropped
    idx = tmp_path / "idx"
    index(idx, str(out / "docs.jsonl"), "--model", st32)
    r = run_cli(["rag", "eval", str(idx), "--queries", str(out / "queries.jsonl"), "--qrels", str(out / "qrels.txt"),
                 "--config", "bm25", "--jsonl"])
    assert r.exit_code == 0, r.stderr
    (row,) = [json.loads(line) for line in r.stdout.splitlines()]
    ndcg = next(v for k, v in row.items() if k.lower().startswith("ndcg"))
    # query 1: its one judged document first (1.0); query 2: grade 4 first, the grade-1 document shares no
    # term with the query and is not retrieved: DCG 4 of the ideal 4 + 1/log2(3) (linear gains)
    assert ndcg == pytest.approx((1 + 4 / (4 + 1 / math.log2(3))) / 2, abs=1e-4)
    r = run_cli(["rag", "eval", str(idx), "--queries", str(out / "queries.jsonl"), "--qrels", str(out / "qrels.txt"),
                 "--config", "bm25", "--limit", "1", "--jsonl"])
    (row,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert next(v for k, v in row.items() if k.lower().startswith("ndcg")) == pytest.approx(1.0)  # query 1 only


def test_graph_llm_adds_the_models_entities(tmp_path, st32):
    """Each chunk's stored entities are the extractor's plus what llmkit's LocalLLM (greedy) lists."""
    pytest.importorskip("llama_cpp")
    from ggufmake import write_tiny_llama
    from llmkit.rag.index.graph import entities, llm_entities
    from llmkit.rag.llm import LocalLLM

    gguf = write_tiny_llama(tmp_path / "tiny.gguf", seed=3, n_ctx=2048)
    texts = ["Ludwig Prandtl studied the boundary layer on a flat plate.",
             "The boundary layer separates behind a cylinder in cross flow."]
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    index(tmp_path / "idx", str(f), "--model", st32, "--graph-llm", str(gguf))
    con = sqlite3.connect(tmp_path / "idx" / "chunks.sqlite")
    rows = con.execute("SELECT c.text, e.entity, e.tf FROM chunk_entities e JOIN chunks c ON c.id = e.chunk_id").fetchall()
    stored: dict[str, Counter] = {}
    for text, ent, tf in rows:
        stored.setdefault(text, Counter())[ent] += tf
    llm = LocalLLM(str(gguf))
    for t in texts:
        from_llm = llm_entities(llm, t)
        assert from_llm and set(from_llm) - set(entities(t))  # the model contributed entities of its own
        assert stored[t] == entities(t) + from_llm


def test_window_chunker_and_code_size(tmp_path, st32):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text(" ".join(f"w{i}" for i in range(20)) + "\n")
    body = "".join(f"    x = x + {i}  # step {i}\n" for i in range(12))
    (d / "code.py").write_text("def short():\n    return 1\n\n\ndef long_one(x):\n" + body + "    return x\n")
    idx = tmp_path / "idx"
    index(idx, str(d), "--model", st32, "--chunker", "window", "--size", "5", "--overlap", "0", "--code-size", "120")
    words = sorted(h["text"] for h in hits(idx, "w0 w5 w10 w15", "--chunks"))
    assert words == ["w0 w1 w2 w3 w4", "w10 w11 w12 w13 w14", "w15 w16 w17 w18 w19", "w5 w6 w7 w8 w9"]
    code = [h for h in hits(idx, "short long_one step", "--chunks") if h["doc"].endswith("code.py")]
    pieces = [h for h in code if h["meta"].get("symbol") == "long_one"]
    assert [h["text"] for h in code if h["meta"].get("symbol") == "short"] == ["def short():\n    return 1"]
    assert len(pieces) >= 2 and all(len(h["text"]) <= 120 for h in pieces)  # the long definition was split
    idx2 = tmp_path / "idx2"
    index(idx2, str(d), "--model", st32, "--code-size", "2000")
    whole = [h for h in hits(idx2, "short long_one step", "--chunks") if h["meta"].get("symbol") == "long_one"]
    assert len(whole) == 1 and whole[0]["text"].startswith("def long_one") and whole[0]["text"].endswith("return x")


def test_dedupe_boilerplate_and_gitignore_flags(tmp_path, st32):
    d = tmp_path / "d"
    d.mkdir()
    footer = "Copyright Zorblax Corporation, all rights reserved."
    topics = ["pumps move water", "valves stop flow", "pipes carry gas", "tanks store oil", "gauges read pressure",
              "filters catch dirt"]
    for i, t in enumerate(topics):
        (d / f"t{i}.txt").write_text(f"Notes on {t} in the plant number {i}.\n\n{footer}\n")
    (d / "copy.txt").write_text((d / "t0.txt").read_text())  # an exact duplicate
    (d / ".gitignore").write_text("secret.txt\n")
    (d / "secret.txt").write_text("the launch code is quuxbaz\n")
    rep = index(tmp_path / "a", str(d), "--model", st32)
    assert rep["exact_duplicates"] >= 1 and rep["boilerplate_lines"] >= 1 and rep["ignored"] == 1
    assert hits(tmp_path / "a", "Zorblax") == [] and hits(tmp_path / "a", "quuxbaz") == []
    rep = index(tmp_path / "b", str(d), "--model", st32, "--dedupe", "off", "--no-boilerplate", "--no-gitignore")
    assert rep["exact_duplicates"] == 0 and rep["boilerplate_lines"] == 0 and rep["ignored"] == 0
    assert len({h["doc"] for h in hits(tmp_path / "b", "Zorblax")}) == len(topics) + 1
    assert "quuxbaz" in hits(tmp_path / "b", "quuxbaz")[0]["text"]
    near = d / "near.txt"
    near.write_text("Notes on pumps move water in the plant number 0 today.\n")
    loose = index(tmp_path / "c", str(d), "--model", st32, "--dedupe", "0.3")
    strict = index(tmp_path / "e", str(d), "--model", st32, "--dedupe", "0.99")
    assert loose["near_duplicates"] > strict["near_duplicates"] == 0
    r = run_cli(["rag", "index", str(tmp_path / "f"), str(d), "--dedupe", "1.5"])
    assert r.exit_code == 1 and "--dedupe takes off or a similarity in (0, 1], not '1.5'" in r.stderr


def test_prompts_shape_the_vectors_and_index_type(tmp_path, st32):
    """--query-prompt/--passage-prompt: dense scores are the cosines of sentence-transformers' own
    vectors of the prefixed texts; --index-type hnsw gives the same answers as flat on a tiny index."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    d = tmp_path / "d"
    d.mkdir()
    for i, t in enumerate(["pumps move water", "valves stop flow", "pipes carry gas", "tanks store oil"]):
        (d / f"{i}.txt").write_text(t + "\n")
    idx = tmp_path / "idx"
    rep = index(idx, str(d), "--model", st32, "--query-prompt", "query: ", "--passage-prompt", "passage: ",
                "--index-type", "hnsw")
    assert rep["index_type"] == "hnsw"
    r = run_cli(["rag", "query", str(idx), "water pumps", "--mode", "dense", "--chunks", "-k", "4", "--fusion", "cc",
                 "--norm", "tmm", "--jsonl"])
    got = {h["text"]: h["score"] for h in map(json.loads, r.stdout.splitlines())}
    st = SentenceTransformer(st32, device="cpu")
    texts = sorted(got)

    def tmm(cos):  # --norm tmm of a dense list: (s - (-1)) / (max - (-1))
        return ((cos + 1) / (cos.max() + 1)).tolist()

    q = st.encode(["query: water pumps"], normalize_embeddings=True)[0]
    p = st.encode(["passage: " + t for t in texts], normalize_embeddings=True)
    assert [got[t] for t in texts] == pytest.approx(tmm(p @ q), abs=1e-5)
    bare = st.encode(texts, normalize_embeddings=True) @ st.encode(["water pumps"], normalize_embeddings=True)[0]
    assert not np.allclose([got[t] for t in texts], tmm(bare), atol=1e-4)
    flat = tmp_path / "flat"
    index(flat, str(d), "--model", st32, "--query-prompt", "query: ", "--passage-prompt", "passage: ", "--index-type", "flat")
    r2 = run_cli(["rag", "query", str(flat), "water pumps", "--mode", "dense", "--chunks", "-k", "4", "--jsonl"])
    assert [json.loads(x)["text"] for x in r2.stdout.splitlines()] == [json.loads(x)["text"] for x in r.stdout.splitlines()]


def test_query_depth_limits_candidates(tmp_path, st32):
    d = tmp_path / "d"
    d.mkdir()
    for i, t in enumerate(["pumps move water", "water pumps and valves", "pipes carry gas", "water tanks store oil",
                           "gauges read pressure", "filters catch dirt", "water flows downhill", "pumps need power"]):
        (d / f"{i}.txt").write_text(t + "\n")
    idx = tmp_path / "idx"
    index(idx, str(d), "--model", st32)

    def ranks(depth):
        r = run_cli(["rag", "query", str(idx), "water pumps", "--chunks", "--jsonl", "-k", "3", "--depth", depth])
        return [v for x in r.stdout.splitlines() for v in json.loads(x)["ranks"].values()]

    assert max(ranks("3")) <= 3  # each retriever handed over only its top 3
    assert max(ranks("100")) > 3  # (with every candidate, a top-3 hit has a worse rank in some list)


def test_beir_qrels_header_is_skipped(tmp_path):
    from llmkit.rag.evaluate.datasets import load_qrels

    p = tmp_path / "test.tsv"
    p.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\nq2\td3\t2\n")
    assert load_qrels(str(p)) == {"q1": {"d1": 1}, "q2": {"d3": 2}}
    bad = tmp_path / "bad.tsv"
    bad.write_text("q1 d1 1\nq1 d2 x\n")
    with pytest.raises(Exception, match="relevance 'x' is not a number"):
        load_qrels(str(bad))


def test_old_index_flag_spellings_work_with_one_note_each(tmp_path, st32):
    """Flags merged to keep `rag index` under 30 options: the 0.1 spellings give the same index, and
    say their new spelling once (until 0.3)."""
    d = tmp_path / "docs"
    (d / "notes").mkdir(parents=True)
    for rel in ("a.md", "b.txt", "notes/c.txt", "notes/d.txt", "notes/e.txt"):
        (d / rel).write_text(f"kernel memory notes from the file {rel}\n")
    new = run_cli(["rag", "index", str(tmp_path / "new"), str(d), "--model", st32, "--glob", "*.txt", "--glob", "!c.*",
                   "--analysis", "porter", "--dedupe", "0.5", "--json", "--no-tune"])
    old = run_cli(["rag", "index", str(tmp_path / "old"), str(d), "--model", st32, "--include", "*.txt", "--exclude",
                   "c.*", "--stem", "--near-dup", "0.5", "--json", "--no-tune"])
    assert new.exit_code == old.exit_code == 0, old.stderr
    keep = ("docs_added", "chunks_indexed", "exact_duplicates", "near_duplicates")
    assert {k: json.loads(old.stdout)[k] for k in keep} == {k: json.loads(new.stdout)[k] for k in keep}
    assert json.loads((tmp_path / "old" / "manifest.json").read_text())["analysis"] == "porter"
    for old_flag, new_flag in (("--include", "--glob"), ("--exclude GLOB", "--glob '!GLOB'"),
                               ("--stem", "--analysis=porter"), ("--near-dup", "--dedupe")):
        assert old.stderr.count(f"`llmkit rag index {old_flag}` is now `{new_flag}`") == 1, old.stderr
    assert "Note:" not in new.stderr
    off = run_cli(["rag", "index", str(tmp_path / "off"), str(d), "--model", st32, "--no-dedupe", "--json",
                   "--no-tune", "--ray-batch", "8"])
    assert off.exit_code == 0 and json.loads(off.stdout)["exact_duplicates"] == 0
    assert "`llmkit rag index --no-dedupe` is now `--dedupe=off`" in off.stderr
    assert "`llmkit rag index --ray-batch N` is now `--ray ADDRESS,batch=N`" in off.stderr
    r = run_cli(["rag", "index", str(tmp_path / "bad"), str(d), "--ray", "auto,workers=0"])
    assert r.exit_code == 1 and "must be at least 1" in r.stderr
    r = run_cli(["rag", "index", str(tmp_path / "bad"), str(d), "--ray", "auto,threads=2"])
    assert r.exit_code == 2 and "ADDRESS[,workers=N][,batch=N]" in r.stderr


def test_eval_recall_k_must_be_positive(tmp_path):
    r = run_cli(["rag", "eval", str(tmp_path), "--queries", str(tmp_path / "q.jsonl"), "--qrels",
                 str(tmp_path / "qrels.txt"), "--recall-k", "0"])
    assert r.exit_code == 2 and "0 is not in the range x>=1" in r.stderr
