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


def _write_format1(idx: BM25Index, directory) -> None:
    """The layout format 1 wrote: vocab.json (term -> id in first-seen order) beside float64 arrays."""
    import json

    directory.mkdir()
    terms = sorted(idx.vocab, key=lambda t: (t[::-1], t))  # ids in an order that is not sorted
    old_of_new = np.array([idx.vocab[t] for t in terms])
    counts = np.diff(idx.indptr)[old_of_new]
    take = np.concatenate([np.arange(idx.indptr[t], idx.indptr[t + 1]) for t in old_of_new])
    arrays = {"indptr": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), "docs": idx.docs[take],
              "tfs": idx.tfs[take].astype(np.float64), "doc_len": idx.doc_len.astype(np.float64),
              "idf": idx.idf[old_of_new]}
    for name, a in arrays.items():
        np.save(directory / f"{name}.npy", a)
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(terms)}))
    (directory / "params.json").write_text(json.dumps({"format": "llmkit-bm25", "version": 1, "k1": 1.5,
                                                       "b": 0.75, "epsilon": 0.25}))


def test_saved_index_is_mapped_not_parsed_and_scores_equal_rank_bm25(corpus, tmp_path):
    ref = rank_bm25.BM25Okapi(corpus)
    BM25Index.build(corpus).save(str(tmp_path / "bm25"))
    assert not (tmp_path / "bm25" / "vocab.json").exists()
    ix = BM25Index.load(str(tmp_path / "bm25"))
    for name in ("indptr", "docs", "tfs", "doc_len", "idf"):
        assert isinstance(getattr(ix, name), np.memmap), name
    assert isinstance(ix.vocab.data, np.memmap) and isinstance(ix.vocab.offsets, np.memmap)
    for q in QUERIES:
        toks = tokenize(q)
        np.testing.assert_allclose(ix.scores(toks), ref.get_scores(toks), rtol=1e-12, atol=1e-12)
    # every term is found at its place in the table, and nothing else is
    terms = sorted({t for doc in corpus for t in doc})
    assert len(ix.vocab) == len(terms) and [ix.vocab.get(t) for t in terms[::97]] == list(range(0, len(terms), 97))
    assert ix.vocab.get("zzzz-not-a-term") is None and ix.vocab.get("") is None and "memory" in ix.vocab


def test_top_k_scores_only_matching_documents_as_the_full_scores_would(corpus):
    idx = BM25Index.build(corpus)
    rng = np.random.default_rng(0)
    allowed = rng.random(idx.n_docs) < 0.5
    for q in QUERIES:
        toks = tokenize(q) + ["the"]
        weights = [1.0] * (len(toks) - 1) + [0.0]  # a weight-0 term unmatches its documents
        full = idx.scores(toks, weights)
        matched = np.zeros(idx.n_docs, bool)
        for t in toks[:-1]:
            matched[idx.postings(t)] = True
        matched[idx.postings("the")] = False
        matched &= allowed
        want = sorted(np.flatnonzero(matched).tolist(), key=lambda d: (-full[d], d))[:7]
        got = idx.top_k(toks, 7, allowed, weights)
        assert [d for d, _ in got] == want and [s for _, s in got] == [full[d] for d in want]


def test_format1_index_is_still_read_and_saved_as_format2(corpus, tmp_path):
    idx = BM25Index.build(corpus)
    _write_format1(idx, tmp_path / "old")
    old = BM25Index.load(str(tmp_path / "old"))
    assert isinstance(old.vocab, dict)
    for q in QUERIES:
        toks = tokenize(q)
        np.testing.assert_allclose(old.scores(toks), idx.scores(toks), rtol=1e-12)
        assert old.top_k(toks, 10) == idx.top_k(toks, 10)
    old.save(str(tmp_path / "new"))
    new = BM25Index.load(str(tmp_path / "new"))
    for q in QUERIES:
        assert new.top_k(tokenize(q), 10) == idx.top_k(tokenize(q), 10)


def test_newer_format_is_refused(corpus, tmp_path):
    import json

    from llmkit.errors import BadFileFormat

    BM25Index.build(corpus[:50]).save(str(tmp_path / "bm25"))
    p = tmp_path / "bm25" / "params.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "version": 99}))
    with pytest.raises(BadFileFormat, match="format 99; upgrade llmkit"):
        BM25Index.load(str(tmp_path / "bm25"))
    (tmp_path / "bm25" / "params.json").write_text(json.dumps({**json.loads(p.read_text()), "version": 2}))
    (tmp_path / "bm25" / "terms.npy").unlink()
    with pytest.raises(BadFileFormat, match="not a readable BM25 index"):
        BM25Index.load(str(tmp_path / "bm25"))
