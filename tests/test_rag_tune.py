"""`rag tune`: the choice rule on constructed scores, pseudo-query determinism, an end-to-end choice on a
corpus built so that one retriever is useless, the stored choice used by queries (flags override,
re-indexing keeps it, --reset drops it), bad input, and an interrupted tune leaving the index alone."""

import json
import signal
import time

import numpy as np
import pytest

from conftest import run_cli, start_subprocess


def test_choose_prefers_simple_within_noise_and_guards_with_heldout():
    from llmkit.rag.evaluate.tune import DEFAULT, Config, choose

    rng = np.random.default_rng(0)
    n = 200
    base = rng.random(n)
    fancy = Config("cc", 0.6, 60, "z", 10, True)
    simple = Config("rrf", 0.7, 60)
    idx_t, idx_h = np.arange(0, 100), np.arange(100, 200)
    # fancy is better by less than the noise of the paired differences: the simpler one wins
    scores = {DEFAULT: base - 0.05, simple: base.copy(), fancy: base + rng.normal(0.002, 0.05, n)}
    chosen, kept = choose(scores, list(scores), idx_t, idx_h)
    assert chosen == simple and not kept
    # clearly better: chosen even though it is complex
    scores[fancy] = base + 0.1
    assert choose(scores, list(scores), idx_t, idx_h)[0] == fancy
    # better on the tuning half, clearly worse than the default on the held-out half: keep the default
    scores[fancy] = np.concatenate([base[:100] + 0.1, base[100:] - 0.3])
    scores[simple] = base - 0.1
    chosen, kept = choose(scores, list(scores), idx_t, idx_h)
    assert chosen == DEFAULT and kept


@pytest.fixture(scope="module")
def corpus(kernel_docs, tmp_path_factory):
    """~160 real paragraphs; each carries a unique nonsense code word that only BM25 can match."""
    root = tmp_path_factory.mktemp("tune")
    paras = [p.strip() for p in kernel_docs.read_text(encoding="utf-8").split("\n\n")
             if 300 < len(p.strip()) < 700 and p.count(". ") >= 2][:160]
    docs, queries, qrels = [], [], []
    for i, p in enumerate(paras):
        code = f"zq{i:03d}x{(i * 7919) % 1000:03d}"
        docs.append({"id": f"d{i}", "text": f"{p} Reference code {code}."})
        queries.append({"id": str(i), "text": code})
        qrels.append(f"{i} 0 d{i} 1")
    (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels.txt").write_text("\n".join(qrels) + "\n")
    idx = root / "idx"
    r = run_cli(["rag", "index", str(idx), str(root / "docs.jsonl")])
    assert r.exit_code == 0, r.stderr
    return root, idx


def test_pseudo_queries_are_deterministic(corpus):
    from llmkit.rag.index.reader import Index
    from llmkit.rag.evaluate.queries import pseudo_queries

    _, idx = corpus
    ix = Index(str(idx))
    a = pseudo_queries(ix, 50, seed=3)
    b = pseudo_queries(ix, 50, seed=3)
    c = pseudo_queries(ix, 50, seed=4)
    assert [(q.text, q.row, q.remainder) for q in a] == [(q.text, q.row, q.remainder) for q in b]
    assert [q.text for q in a] != [q.text for q in c]
    for q in a:  # the query sentence is not in what is matched; about half its words are gone too
        if q.kind == "sentence":
            assert q.text not in q.remainder and q.relevant == {int(ix.unit[q.row]): 1}


def test_tune_with_judged_queries_finds_the_useful_retriever(corpus):
    root, idx = corpus
    r = run_cli(["rag", "tune", str(idx), "--queries", str(root / "q.jsonl"), "--qrels", str(root / "qrels.txt"),
                 "--json", "--no-expand", "--dry-run"])
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["source"] == "judged" and rep["queries"] == 160
    w = rep["chosen"]["weights"]
    assert w["bm25"] > w["dense"]  # code words: dense vectors cannot match them
    assert rep["heldout_score"] > 0.9 and rep["heldout_score"] >= rep["default_heldout"]
    assert "fusion" not in json.loads((idx / "manifest.json").read_text())  # --dry-run stores nothing


def test_stored_choice_is_used_overridden_kept_and_reset(corpus, tmp_path):
    root, idx = corpus
    before = (idx / "manifest.json").read_bytes()
    r = run_cli(["rag", "tune", str(idx), "--pseudo-queries", "60", "--no-expand", "--runtime", "onnx"])
    assert r.exit_code == 0, r.stderr
    assert "chosen:" in r.stdout and "held-out half" in r.stdout
    m = json.loads((idx / "manifest.json").read_text())
    assert m["fusion"]["tuned"]["source"] == "pseudo" and m["fusion"]["method"] in ("rrf", "cc")
    q = run_cli(["rag", "query", str(idx), "scheduler", "-k", "1", "--explain"])
    assert q.exit_code == 0 and "fusion (tuned)" in q.stderr
    q = run_cli(["rag", "query", str(idx), "scheduler", "-k", "1", "--explain", "--fusion", "rrf", "--weights",
                 "bm25=1,dense=1", "--rrf-k", "60"])
    assert "fusion (tuned + flags): rrf k 60 bm25 1, dense 1" in q.stderr
    info = run_cli(["rag", "info", str(idx)])
    assert "fusion (rag tune, pseudo queries" in info.stdout
    # re-indexing (a new document) keeps the choice
    extra = tmp_path / "extra.txt"
    extra.write_text("A new note about interrupt handlers and their bottom halves.")
    assert run_cli(["rag", "index", str(idx), str(extra)]).exit_code == 0
    assert json.loads((idx / "manifest.json").read_text())["fusion"] == m["fusion"]
    r = run_cli(["rag", "tune", str(idx), "--reset"])
    assert r.exit_code == 0 and "dropped" in r.stderr
    m2 = json.loads((idx / "manifest.json").read_text())
    assert "fusion" not in m2 and m2["generation"] == json.loads(before)["generation"] + 1
    q = run_cli(["rag", "query", str(idx), "scheduler", "-k", "1", "--explain"])
    assert "fusion (default): rrf k 60 bm25 1, dense 1" in q.stderr


def test_eval_tuned_config(corpus):
    root, idx = corpus
    assert run_cli(["rag", "tune", str(idx), "--queries", str(root / "q.jsonl"), "--qrels", str(root / "qrels.txt"),
                    "--no-expand"]).exit_code == 0
    r = run_cli(["rag", "eval", str(idx), "--queries", str(root / "q.jsonl"), "--qrels", str(root / "qrels.txt"),
                 "--jsonl"])
    rows = {json.loads(x)["config"]: json.loads(x)["ndcg@10"] for x in r.stdout.splitlines()}
    assert set(rows) == {"bm25", "dense", "hybrid", "tuned"}
    assert rows["tuned"] >= rows["hybrid"] and rows["bm25"] > rows["dense"]
    assert run_cli(["rag", "tune", str(idx), "--reset"]).exit_code == 0


def test_bad_input(corpus, tmp_path):
    root, idx = corpus
    small = tmp_path / "small.txt"
    small.write_text("One short note. It has two sentences.")
    sidx = tmp_path / "sidx"
    assert run_cli(["rag", "index", str(sidx), str(small)]).exit_code == 0
    r = run_cli(["rag", "tune", str(sidx)])
    assert r.exit_code == 1 and "needs at least 30 chunks" in r.stderr and "this index has 0" in r.stderr
    bad = tmp_path / "qrels.txt"
    bad.write_text("1 0 nosuchdoc 1\n")
    r = run_cli(["rag", "tune", str(idx), "--queries", str(root / "q.jsonl"), "--qrels", str(bad)])
    assert r.exit_code == 1 and "name no document of this index" in r.stderr
    r = run_cli(["rag", "tune", str(idx), "--queries", str(root / "q.jsonl")])
    assert r.exit_code == 2


def test_interrupted_tune_leaves_the_index_alone(corpus):
    _, idx = corpus
    before = (idx / "manifest.json").read_bytes()
    p = start_subprocess(["rag", "tune", idx, "--pseudo-queries", "150"])
    time.sleep(3)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    assert p.returncode == 143
    assert (idx / "manifest.json").read_bytes() == before


def test_tune_reset_new_and_old_spelling(corpus):
    _, idx = corpus
    path = idx / "manifest.json"

    def store_choice():
        m = json.loads(path.read_text())
        m["fusion"] = {"method": "cc", "rrf_k": 60, "weights": {"bm25": 0.5, "dense": 0.5}, "norm": "z", "expand": 0,
                       "parents": False, "tuned": {"source": "judged", "label": "cc z"}}
        path.write_text(json.dumps(m))

    store_choice()
    r = run_cli(["rag", "tune-reset", str(idx)])  # the new spelling: no deprecation note
    assert r.exit_code == 0 and "dropped" in r.stderr and "deprecated" not in r.stderr
    assert "fusion" not in json.loads(path.read_text())
    r = run_cli(["rag", "tune-reset", str(idx)])
    assert r.exit_code == 0 and "no tuned fusion was stored" in r.stderr
    store_choice()
    r = run_cli(["rag", "tune", str(idx), "--reset"])  # the old spelling still works, with a one-line note
    assert r.exit_code == 0 and "dropped" in r.stderr and "fusion" not in json.loads(path.read_text())
    notes = [line for line in r.stderr.splitlines() if "deprecated" in line]
    assert len(notes) == 1 and "rag tune-reset" in notes[0]
    assert run_cli(["rag", "tune-reset", "--help"]).exit_code == 0
