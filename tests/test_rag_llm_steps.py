"""RAG query steps asserted on their output: the cross-encoder's order against its own predict(),
LLM rewrites / sub-queries / HyDE (llmkit's real LocalLLM on a tiny GGUF) reaching the retrievers
exactly, compression's known answer, and score normalisation (--norm) against rank-bm25's scores."""

import json
import re

import numpy as np
import pytest

from conftest import run_cli
from ragfixtures import tiny_gguf  # noqa: F401 - a pytest fixture

pytest.importorskip("faiss")
pytest.importorskip("sentence_transformers")

DOCS = {
    "mem.txt": "The kernel manages physical memory in pages. Bananas are yellow. Each page is tracked by a struct page.\n",
    "sched.txt": ("The scheduler picks the next task to run. Runnable tasks wait in a red-black tree.\n\n"
                  "Real-time tasks always run before normal tasks.\n"),
    "fs.md": "Use the mount command to attach a filesystem. The noatime option reduces writes to the disk.\n",
    "net.txt": "Packets arrive at the network card. The kernel copies each packet into a socket buffer in memory.\n",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Tiny random models (tests/tinyst.py) and an index of DOCS built with the 32-d one."""
    from tinyst import write_tiny_models

    root = tmp_path_factory.mktemp("steps")
    tiny = write_tiny_models(root)
    corpus = root / "corpus"
    corpus.mkdir()
    for name, text in DOCS.items():
        (corpus / name).write_text(text)
    idx = root / "idx"
    r = run_cli(["rag", "index", str(idx), str(corpus), "--model", str(tiny["st32"]), "--size", "60", "--overlap", "0"])
    assert r.exit_code == 0, r.stderr
    return {"root": root, "idx": idx, "ce": tiny["ce"]}


def query(idx, *args):
    r = run_cli(["rag", "query", str(idx), *args, "--jsonl"])
    assert r.exit_code == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()], r.stderr


def test_cross_encoder_order_equals_its_own_predict(env):
    """Every chunk is a candidate (depth >> corpus): the top k must be the CrossEncoder's own top k."""
    from sentence_transformers import CrossEncoder

    from llmkit.rag.index.reader import Index

    q = "kernel memory pages"
    ix = Index(str(env["idx"]))
    texts = ix.texts(range(ix.n))
    theirs = CrossEncoder(str(env["ce"]), device="cpu").predict([(q, t) for t in texts], show_progress_bar=False)
    assert np.ptp(theirs) > 0.05  # a head that separates the pairs, so the order means something
    want = [texts[i] for i in np.argsort(-theirs, kind="stable")[:4]]
    hits, _ = query(env["idx"], q, "--chunks", "-k", "4", "--rerank", f"cross-encoder:{env['ce']}", "--rerank-depth", "50")
    assert [h["text"] for h in hits] == want
    by_text = dict(zip(texts, theirs.tolist()))
    assert [h["rerank_score"] for h in hits] == pytest.approx([by_text[t] for t in want], abs=1e-5)
    plain, _ = query(env["idx"], q, "--chunks", "-k", "4")
    assert [h["text"] for h in plain] != want  # without the re-ranker the order differs: the test can tell


def test_llm_steps_reach_the_retrievers_exactly(env, tiny_gguf):
    """Rewrites and sub-queries are searched as the LLM wrote them, by BM25 and dense alike; HyDE's
    passage is embedded as a passage and added to the query vector (then normalised)."""
    pytest.importorskip("llama_cpp")
    from llmkit.rag.index.reader import Index
    from llmkit.rag.llm import LocalLLM
    from llmkit.rag.retrieve.options import LLMSteps, QueryOptions
    from llmkit.rag.retrieve.pipeline import Pipeline

    llm = LocalLLM(str(tiny_gguf))
    said = {"lines": [], "complete": []}
    real_lines, real_complete = llm.lines, llm.complete

    def lines(*a, **kw):
        said["lines"].append(real_lines(*a, **kw))
        return said["lines"][-1]

    def complete(*a, **kw):
        out = real_complete(*a, **kw)
        said["complete"].append(out)
        return out

    llm.lines, llm.complete = lines, complete
    ix = Index(str(env["idx"]))
    pipe = Pipeline(ix, QueryOptions(k=3, steps=LLMSteps(rewrite=2, subqueries=True, hyde=True)), llm=llm)
    emb = pipe.embedder()
    seen = {"bm25": [], "dense": [], "passages": [], "queries": []}
    real_tok, real_dense, real_passages, real_queries = ix.tok, ix.dense_list, emb.passages, emb.queries
    real_bm25 = ix.bm25_list

    def bm25_list(toks, *a, **kw):
        seen["bm25"].append(list(toks))
        return real_bm25(toks, *a, **kw)

    def dense_list(vec, *a, **kw):
        seen["dense"].append(np.array(vec))
        return real_dense(vec, *a, **kw)

    def passages(texts, *a, **kw):
        seen["passages"].append(list(texts))
        return real_passages(texts, *a, **kw)

    def queries(texts, *a, **kw):
        seen["queries"].append(list(texts))
        return real_queries(texts, *a, **kw)

    ix.bm25_list, ix.dense_list, emb.passages, emb.queries = bm25_list, dense_list, passages, queries
    q = "kernel memory pages"
    res = pipe.run(q)
    rewrites, subs = said["lines"]
    (hyde,) = said["complete"][-1:]
    assert rewrites and subs and hyde  # the tiny model wrote something for every step
    variants = [q, *rewrites, *subs]
    assert res.variants == variants
    assert seen["bm25"] == [real_tok(v) for v in variants]  # each variant's own BM25 tokens, none lost or edited
    assert seen["queries"] == [list(dict.fromkeys(variants))]  # embedded as queries, each once
    assert seen["passages"] == [[hyde]]  # the HyDE passage, verbatim, embedded as a passage
    qv = real_queries(variants)
    v0 = qv[0] + real_passages([hyde])[0]
    want = [v0 / np.linalg.norm(v0), *qv[1:]]
    assert len(seen["dense"]) == len(variants)
    for got, exp in zip(seen["dense"], want):
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)
    assert f"rewrites: {rewrites}" in res.notes and f"sub-queries: {subs}" in res.notes
    assert f"HyDE passage: {hyde!r}" in res.notes

    # the CLI (same greedy model) reports the same steps and returns the same hits
    hits, err = query(env["idx"], q, "-k", "3", "-m", str(tiny_gguf), "--rewrite", "2", "--subqueries", "--hyde",
                      "--explain")
    assert f"rewrites: {rewrites}" in err and f"sub-queries: {subs}" in err and f"HyDE passage: {hyde!r}" in err
    assert [h["chunk_id"] for h in hits] == [h.chunk_id for h in res.hits]


def test_compress_keeps_the_relevant_sentence(env):
    """BM25 mode, no LLM: sentences ranked by the share of query words, kept within the budget."""
    hits, err = query(env["idx"], "kernel memory pages", "--mode", "bm25", "--chunks", "-k", "3", "--compress-to", "8")
    got = {h["text"]: h["compressed_text"] for h in hits}
    # the 60-character chunks: net.txt's second sentence ends in a chunk of its own, "memory."
    assert got == {"The kernel manages physical memory in pages.": "The kernel manages physical memory in pages.",  # 3/3, 7 tokens
                   "memory.": "memory.",  # 1/3 of the query words, 1 token: fits the remaining budget
                   "Bananas are yellow. Each page is tracked by a struct page.": ""}  # no query word ("page" is not "pages")
    assert re.search(r"compressed 19 -> 8 tokens", err)


def test_compress_with_llm_counts_llm_tokens_and_drops_tokens(env, tiny_gguf):
    """README: `--compress-to N -m model.gguf` = sentence selection + surprisal token dropping, counted
    in the LLM's tokens; what is left is the original text with tokens taken out."""
    pytest.importorskip("llama_cpp")
    from llmkit.rag.llm import LocalLLM

    hits, err = query(env["idx"], "kernel memory", "--chunks", "-k", "3", "-m", str(tiny_gguf), "--compress-to", "40")
    m = re.search(r"compressed (\d+) -> (\d+) tokens", err)
    before, after = int(m.group(1)), int(m.group(2))
    llm = LocalLLM(str(tiny_gguf))
    assert before == sum(llm.count_tokens(h["text"]) for h in hits)
    assert after == sum(llm.count_tokens(h["compressed_text"]) for h in hits) and after <= 40
    kept = [h for h in hits if h["compressed_text"]]
    assert kept and all(_subsequence(h["compressed_text"], h["text"]) for h in kept)
    assert any(h["compressed_text"] not in h["text"] for h in kept)  # tokens dropped inside a sentence


def test_compress_never_drops_query_words(tiny_gguf):
    pytest.importorskip("llama_cpp")
    from llmkit.rag.answer.compress import compress
    from llmkit.rag.llm import LocalLLM

    llm = LocalLLM(str(tiny_gguf))  # a byte-level vocabulary: every word is several tokens
    texts = ["The kernel manages physical memory in pages.", "The kernel copies each packet into memory."]
    c = compress("kernel memory", texts, 40, llm.count_tokens, llm=llm)
    assert c.tokens_after <= 40 and all(_subsequence(o, t) for o, t in zip(c.texts, texts))
    for out in c.texts:
        if out:
            assert "kernel" in out and "memory" in out, out


def _subsequence(a: str, b: str) -> bool:
    it = iter(b)
    return all(ch in it for ch in a)


@pytest.mark.parametrize("norm", ["minmax", "z", "dbsf", "tmm"])
def test_norm_scores_equal_normalised_rank_bm25(env, norm):
    """--fusion cc --norm N over the BM25 list alone: each hit's score is N applied to rank-bm25's scores."""
    rank_bm25 = pytest.importorskip("rank_bm25")
    from llmkit.rag.index.reader import Index

    ix = Index(str(env["idx"]))
    q = "kernel memory tasks"
    s = rank_bm25.BM25Okapi([ix.tok_doc(t) for t in ix.texts(range(ix.n))]).get_scores(ix.tok(q))  # documents as indexed (stemmed)
    pos = np.flatnonzero(s > 0)
    v = s[pos]
    want = {"minmax": (v - v.min()) / (v.max() - v.min()), "z": (v - v.mean()) / v.std(),
            "dbsf": np.clip((v - (v.mean() - 3 * v.std())) / (6 * v.std()), 0, 1), "tmm": v / v.max()}[norm]
    hits, _ = query(env["idx"], q, "--mode", "bm25", "--chunks", "--fusion", "cc", "--norm", norm, "-k", "20")
    got = {h["chunk_id"]: h["score"] for h in hits}
    assert got == pytest.approx({int(ix.rows[d]): float(w) for d, w in zip(pos, want)}, abs=1e-6)
