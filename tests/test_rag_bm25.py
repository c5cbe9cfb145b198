"""BM25 scores equal rank-bm25's BM25Okapi; the inverted index returns the same top-10; CJK works."""

import numpy as np
import pytest

from llmkit.rag.index.bm25 import BM25Index, tokenize

rank_bm25 = pytest.importorskip("rank_bm25")


@pytest.fixture(scope="module")
def corpus(kernel_small):
    paras = [p for p in kernel_small.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    return [tokenize(p) for p in paras[:1500]]


QUERIES = ["memory management page cache", "filesystem mount options", "kernel module parameters",
           "interrupt handler latency", "submitting patches to the mailing list", "security vulnerability report",
           "power management suspend resume", "the", "nonexistentterm", "cgroup cpu controller limits"]


def test_scores_equal_rank_bm25(corpus):
    ref = rank_bm25.BM25Okapi(corpus)
    idx = BM25Index.build(corpus)
    for q in QUERIES:
        toks = tokenize(q)
        ours, theirs = idx.scores(toks), ref.get_scores(toks)
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)
        top_ref = [d for d in sorted(range(len(theirs)), key=lambda d: (-theirs[d], d))[:10] if theirs[d] > 0]
        assert [d for d, _ in idx.top_k(toks, 10)] == top_ref


def test_save_load_and_filter(corpus, tmp_path):
    idx = BM25Index.build(corpus)
    idx.save(str(tmp_path / "bm25"))
    again = BM25Index.load(str(tmp_path / "bm25"))
    q = tokenize("filesystem mount options")
    assert again.top_k(q, 5) == idx.top_k(q, 5)
    allowed = np.zeros(idx.n_docs, dtype=bool)
    allowed[::2] = True  # filter inside retrieval: only even documents may be returned
    hits = idx.top_k(q, 5, allowed)
    assert len(hits) == 5 and all(d % 2 == 0 for d, _ in hits)


def test_traditional_chinese_query_finds_its_document():
    docs = ["國立臺灣大學位於臺北市，是臺灣的頂尖大學。", "The university library opens at nine.",
            "北京大学是中国的一所大学。", "台北的天氣今天很好。"]
    idx = BM25Index.build([tokenize(d) for d in docs])
    (best, score), *_ = idx.top_k(tokenize("臺灣大學在哪裡"), 2)
    assert best == 0 and score > 0


def test_tiny_corpus_still_finds_matches():
    # with one or two documents every idf is negative (rank-bm25's formula); matches still rank
    idx = BM25Index.build([tokenize("the quick brown fox"), tokenize("a lazy dog sleeps")])
    ref = rank_bm25.BM25Okapi([tokenize("the quick brown fox"), tokenize("a lazy dog sleeps")])
    np.testing.assert_allclose(idx.scores(["fox"]), ref.get_scores(["fox"]))
    assert [d for d, _ in idx.top_k(["fox"], 5)] == [0]
    assert idx.top_k(["cat"], 5) == []
