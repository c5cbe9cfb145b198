"""The defaults of issue 18: English BM25 analysis, units sized in the embedding model's tokens,
documents ranked as documents (`--chunks` for raw chunks), auto-tuning at the end of `rag index`
(too-small corpora, interruption), `--graph` that cannot hurt a tuned index, and indexes made
before all this keeping their analysis and units."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli
from ragold import as_format1

ROOT = Path(__file__).parent.parent


# -- analysis ----------------------------------------------------------------------------------------

def test_english_analysis_known_answers():
    from llmkit.rag.index.analysis import doc_terms, is_english, query_groups, query_terms

    assert doc_terms("The flows of air over the wings were measured.") == ["flow", "air", "over", "wing", "were",
                                                                           "measur"]
    assert doc_terms("Die Katze ist auf dem Tisch und schläft.") == ["die", "katze", "ist", "auf", "dem", "tisch",
                                                                     "und", "schläft"]
    assert doc_terms("台灣大學 is in the city") == ["台灣", "灣大", "大學", "citi"]  # CJK keeps its bigrams
    assert doc_terms("The flows", "plain") == ["the", "flows"] and doc_terms("The flows", "porter") == ["the", "flow"]
    # a query word gives its stem and its plain form, so English and other chunks both match it
    assert query_terms("the flows of katze") == ["flow", "flows", "katz", "katze"]
    assert query_groups("flows katze") == [("flow", "flows"), ("katz", "katze")]
    assert query_terms("to be or not to be") == ["to", "be", "or", "not", "to", "be"]  # only stop words: kept
    assert is_english("def parse_config path return open".split())  # code: no other language's words
    assert not is_english("le chat est sur la table et le chien dort".split())


def test_stemmer_equals_snowball_english():
    import Stemmer

    from llmkit.rag.index.analysis import stem

    ref = Stemmer.Stemmer("english")
    words = ["generalizations", "oscillators", "ponies", "relational", "hopping", "flexibly", "analogies", "as"]
    assert [stem(w) for w in words] == ref.stemWords(words)


# -- units in model tokens ---------------------------------------------------------------------------

def test_token_spans_known_answer_and_bound():
    import numpy as np

    from llmkit.rag.chunk.spans import recursive_spans

    text = "One two. Three four five."
    assert [s.text for s in recursive_spans(text, 3, 0, np.array([0, 4, 9, 15, 20]))] == ["One two.",
                                                                                        "Three four five."]
    assert [s.text for s in recursive_spans(text, 5, 0, np.array([0, 4, 9, 15, 20]))] == [text]  # fits: one
    words = " ".join(f"w{i}." if i % 7 == 6 else f"w{i}" for i in range(300))
    starts = np.array([i for i, ch in enumerate(words) if ch == "w"])
    spans = recursive_spans(words, 40, 5, starts)
    for s in spans:  # at most 40 tokens each, ending at a sentence when one lies in the second half
        n = int(((starts >= s.start) & (starts < s.end)).sum())
        assert n <= 40 and (s.text.endswith(".") or s.end == len(words))
    assert spans[0].start == 0 and spans[-1].end == len(words)


@pytest.fixture(scope="module")
def paragraphs(kernel_docs):
    return [p.strip() for p in kernel_docs.read_text(encoding="utf-8").split("\n\n")
            if 300 < len(p.strip()) < 700 and p.count(". ") >= 2]


def test_units_fit_the_window_and_documents_rank_as_documents(tmp_path, paragraphs):
    from llmkit.rag.embed.embedder import load_embedder

    long_doc = " ".join(paragraphs[:8])  # ~1000+ model tokens
    docs = [{"id": "short", "text": paragraphs[20]}, {"id": "long", "text": long_doc}]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in docs))
    idx = tmp_path / "idx"
    r = run_cli(["rag", "index", str(idx), str(src), "--json"])
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["over_window"] == 0 and rep["window"] == 254 and "too small to tune" in rep["tune"]["why"]
    emb = load_embedder()
    from llmkit.rag.index.reader import Index

    ix = Index(str(idx))
    texts = ix.texts(range(ix.n))
    per_doc = dict(ix.con.execute("SELECT json_extract(meta, '$.doc_id'), COUNT(*) FROM chunks GROUP BY 1"))
    assert per_doc["short"] == 1 and per_doc["long"] >= 4  # a section that fits is one chunk
    assert all(emb.count_tokens(t) <= 254 for t in texts)
    m = json.loads((idx / "manifest.json").read_text())
    assert m["collections"]["default"]["unit"] == "tokens" and m["collections"]["default"]["tokens"] == 254
    assert m["analysis"] == "english" and m["ranking"] == "documents"
    # one hit per document (its best chunk, with offsets and the document id); --chunks: raw chunks
    q = paragraphs[3].split(". ")[0]
    r = run_cli(["rag", "query", str(idx), q, "-k", "5", "--jsonl"])
    hits = [json.loads(x) for x in r.stdout.splitlines()]
    assert [h["meta"]["doc_id"] for h in hits] == ["long", "short"]
    assert "char_start" in hits[0]["meta"] and q[:40] in hits[0]["text"]
    r = run_cli(["rag", "query", str(idx), q, "-k", "5", "--jsonl", "--chunks"])
    assert [json.loads(x)["meta"]["doc_id"] for x in r.stdout.splitlines()].count("long") >= 4
    # characters on request; a chunk longer than the window is counted and reported
    r = run_cli(["rag", "index", str(tmp_path / "chars"), str(src), "--size", "5000", "--parent-size", "0",
                 "--no-tune"])
    assert r.exit_code == 0 and "longer than the embedding model's window (254 tokens)" in r.stderr


def test_dense_unit_score_leans_toward_the_first_chunk(tmp_path, paragraphs):
    """Dense lists of units: a unit's score is its best chunk's moved LEAD of the way toward its first
    chunk's (checked against scores computed here from the model), and `rag query` ranks by it."""
    import numpy as np

    from llmkit.rag.embed.embedder import load_embedder
    from llmkit.rag.index.reader import Index
    from llmkit.rag.retrieve.pipeline import LEAD, lead_blend, lead_blend_all

    docs = [{"id": f"long{j}", "text": " ".join(paragraphs[8 * j:8 * j + 8])} for j in range(3)]
    docs += [{"id": f"short{j}", "text": paragraphs[30 + j]} for j in range(6)]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in docs))
    idx = tmp_path / "idx"
    assert run_cli(["rag", "index", str(idx), str(src), "--no-tune"]).exit_code == 0
    ix = Index(str(idx))
    emb = load_embedder()
    query = paragraphs[13].split(". ")[0]  # a sentence deep inside long1
    q = emb.queries([query])[0]
    chunk_s = emb.passages(ix.texts(range(ix.n))) @ q
    meta = [json.loads(m) for (m,) in ix.con.execute("SELECT meta FROM chunks ORDER BY id")]
    by_doc: dict = {}
    for row in range(ix.n):
        by_doc.setdefault(meta[row]["doc_id"], []).append((meta[row]["char_start"], chunk_s[row]))
    want = {d: max(s for _, s in v) - LEAD * (max(s for _, s in v) - min(v)[1]) for d, v in by_doc.items()}
    assert len(by_doc["long1"]) >= 3 and want["long1"] < max(s for _, s in by_doc["long1"])
    rows, scores = ix.dense_list(q, 100)
    got_rows, got = lead_blend(ix, q, rows, scores)
    got_docs = [meta[r]["doc_id"] for r in got_rows]
    assert sorted(got_docs) == sorted(want) and np.allclose(got, [want[d] for d in got_docs], atol=1e-5)
    assert got == sorted(got, reverse=True)
    # rag tune scores every row at once: the same units, order and scores
    all_rows, all_s = lead_blend_all(ix, np.asarray(ix.vectors(), np.float64) @ q, 100)
    assert all_rows == got_rows and np.allclose(all_s, got, atol=1e-6)
    # each unit keeps its best chunk as its hit
    assert all(chunk_s[r] == max(chunk_s[x] for x in range(ix.n) if meta[x]["doc_id"] == meta[r]["doc_id"])
               for r in got_rows)
    r = run_cli(["rag", "query", str(idx), query, "--mode", "dense", "-k", "9", "--jsonl"])
    assert [json.loads(x)["meta"]["doc_id"] for x in r.stdout.splitlines()] == \
        sorted(want, key=lambda d: -want[d])


def test_old_index_keeps_its_analysis_and_units(tmp_path, paragraphs):
    """An index made before token units, English analysis and document ranking (its manifest has none
    of them) is queried and extended exactly as it was built."""
    from llmkit.rag.index.reader import Index

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"id": f"a{i}", "text": p + " The flows were measured."}) + "\n"
                         for i, p in enumerate(paragraphs[:6])))
    b.write_text(json.dumps({"id": "b0", "text": " ".join(paragraphs[10:14])}) + "\n")
    idx = tmp_path / "idx"
    assert run_cli(["rag", "index", str(idx), str(a), "--size", "800", "--analysis", "plain", "--no-tune"]).exit_code == 0
    as_format1(idx, "v1-chunks")  # a format-1 index from before analyses and document ranking
    ix = Index(str(idx))
    assert ix.analysis == "plain" and ix.unit is None and "flows" in ix.bm25.vocab
    r = run_cli(["rag", "info", str(idx)])
    assert "BM25 analysis: plain" in r.stdout and "hits are chunks" in r.stdout
    r = run_cli(["rag", "index", str(idx), str(b), "--no-tune"])  # extended: its chunking and analysis stay
    assert r.exit_code == 0 and "chunking changed" not in r.stderr
    ix = Index(str(idx))
    sizes = {json.loads(meta)["chunk_size"] for (meta,) in ix.con.execute("SELECT meta FROM chunks")}
    assert sizes == {800} and ix.analysis == "plain" and "flows" in ix.bm25.vocab and ix.unit is None
    r = run_cli(["rag", "index", str(idx), str(b), "--tokens", "128", "--no-tune"])  # says what changed
    assert "chunking changed: unit chars -> tokens" in r.stderr
    r = run_cli(["rag", "index", str(idx), str(b), "--analysis", "english"])
    assert r.exit_code == 1 and "analyses BM25 terms as plain, not english" in r.stderr


# -- auto-tuning -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tunable(paragraphs, tmp_path_factory):
    root = tmp_path_factory.mktemp("autotune")
    src = root / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": p}) + "\n" for i, p in enumerate(paragraphs[:160])))
    return root, src


def test_index_tunes_at_the_end_and_only_when_the_corpus_changed(tunable, monkeypatch):
    from llmkit.rag.evaluate import tune

    root, src = tunable
    monkeypatch.setattr(tune, "AUTO_SHARE", 0.5)  # a corpus of 160 chunks counts as big enough here
    idx = root / "idx"
    r = run_cli(["rag", "index", str(idx), str(src)])
    assert r.exit_code == 0 and "fusion tuned on" in r.stderr and "of the indexing time" in r.stderr, r.stderr
    tuned = json.loads((idx / "manifest.json").read_text())["fusion"]["tuned"]
    assert tuned["source"] == "pseudo" and tuned["chunks"] >= 150 and tuned["queries"] >= 50
    r = run_cli(["rag", "info", str(idx)])
    assert "fusion (rag index, auto, pseudo queries" in r.stdout
    r = run_cli(["rag", "index", str(idx), str(src)])  # nothing changed: the choice stays
    assert "kept the tuned fusion" in r.stderr


def test_too_small_to_tune_says_so_and_keeps_rrf(tunable):
    root, src = tunable
    idx = root / "small"
    r = run_cli(["rag", "index", str(idx), str(src)])
    assert r.exit_code == 0
    n = json.loads((idx / "manifest.json").read_text())["collections"]["default"]["chunks"]
    assert [ln for ln in r.stderr.splitlines() if "too small to tune" in ln] == [
        f"too small to tune ({n} chunks, 1000 needed): the fusion stays RRF 1:1"]
    assert "fusion" not in json.loads((idx / "manifest.json").read_text())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_interrupted_auto_tune_loses_nothing(tunable, sig):
    root, src = tunable
    idx = root / f"killed-{int(sig)}"
    script = ("import sys; from llmkit.rag.evaluate import tune; tune.AUTO_SHARE = 0.5; "
              "from llmkit.cli import main; main(sys.argv[1:])")
    p = subprocess.Popen([sys.executable, "-c", script, "rag", "index", str(idx), str(src)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    path = idx / "manifest.json"
    deadline = time.time() + 120
    while time.time() < deadline and not (path.exists() and json.loads(path.read_text() or "{}").get("generation")):
        time.sleep(0.02)
    p.send_signal(sig)  # the generation is published: the process is tuning now
    p.communicate(timeout=60)
    assert p.returncode in ((143, 0) if sig == signal.SIGTERM else (-9, 0))
    m = json.loads(path.read_text())
    assert m["generation"] == 1 and m["collections"]["default"]["docs"] == 160
    r = run_cli(["rag", "query", str(idx), "memory pages", "-k", "3"])
    assert r.exit_code == 0 and r.stdout.count("docs.jsonl#") == 3
    r = run_cli(["rag", "index", str(idx), str(src), "--no-tune"])  # nothing to redo
    assert r.exit_code == 0 and "160 unchanged" in r.stderr and "0 new chunk(s)" in r.stderr


# -- the graph list ----------------------------------------------------------------------------------

def test_graph_on_a_tuned_index_does_not_hurt(tmp_path, paragraphs):
    """Judged queries (half the words of a paragraph's first sentence); the index tuned on them, and
    a tuned score fusion like the one that used to collapse under --graph (cc 0.5 / 0.5)."""
    docs = paragraphs[:120]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": p}) + "\n" for i, p in enumerate(docs)))
    queries = [" ".join(p.split(". ")[0].split()[::2]) for p in docs]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"id": str(i), "text": q}) + "\n"
                                              for i, q in enumerate(queries)))
    (tmp_path / "qrels.txt").write_text("".join(f"{i} 0 d{i} 1\n" for i in range(len(docs))))
    idx = tmp_path / "idx"
    assert run_cli(["rag", "index", str(idx), str(src), "--graph"]).exit_code == 0
    judged = ["--queries", str(tmp_path / "q.jsonl"), "--qrels", str(tmp_path / "qrels.txt")]

    def ndcg(*configs):
        r = run_cli(["rag", "eval", str(idx), *judged, "--jsonl", *[x for c in configs for x in ("--config", c)]])
        assert r.exit_code == 0, r.stderr
        return [json.loads(x)["ndcg@10"] for x in r.stdout.splitlines()]

    assert run_cli(["rag", "tune", str(idx), *judged]).exit_code == 0
    without, with_graph = ndcg("tuned", "tuned+graph")
    assert with_graph >= without - 0.005
    m = json.loads((idx / "manifest.json").read_text())
    m["fusion"] = {"method": "cc", "rrf_k": 60, "weights": {"bm25": 0.5, "dense": 0.5}, "norm": "minmax", "expand": 0,
                   "parents": False, "tuned": {"source": "pseudo", "label": "cc minmax bm25 0.50 dense 0.50"}}
    (idx / "manifest.json").write_text(json.dumps(m))
    without, with_graph, hybrid, hybrid_graph = ndcg("tuned", "tuned+graph", "hybrid", "hybrid+graph")
    assert with_graph >= without - 0.005 and hybrid_graph >= hybrid - 0.005
