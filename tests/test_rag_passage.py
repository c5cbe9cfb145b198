"""The passage a document hit shows is the document's best chunk under the fused score: the same
fusion run over the chunk lists (what `--chunks` ranks), not the best-ranked chunk of whichever
retriever's list comes first."""

import gzip
import json

import pytest

from conftest import FIXTURES, run_cli

QUERIES = ["how do I install llmkit", "speculative decoding with a draft model", "quantize a model with an imatrix",
           "which vector store keeps the embeddings", "what does the test suite cover"]


@pytest.fixture(scope="module")
def readme_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("passage")
    doc = root / "README.md"
    doc.write_bytes(gzip.decompress((FIXTURES / "readme-0.1.md.gz").read_bytes()))
    idx = root / "idx"
    r = run_cli(["rag", "index", str(idx), str(doc), "--no-tune"])
    assert r.exit_code == 0, r.stderr
    return idx


def _hits(idx, query, *flags):
    r = run_cli(["rag", "query", str(idx), query, "--jsonl", *flags])
    assert r.exit_code == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_install_question_shows_the_install_section(readme_index):
    (hit,) = _hits(readme_index, "how do I install llmkit", "-k", "3")
    assert hit["meta"]["section"] == "Install"
    # BM25's best chunk is another section, so the old rule (best chunk of the first list) showed that one
    (bm25_best,) = _hits(readme_index, "how do I install llmkit", "--mode", "bm25", "--chunks", "-k", "1")
    assert bm25_best["meta"]["section"] != "Install" and bm25_best["chunk_id"] != hit["chunk_id"]
    (dense_best,) = _hits(readme_index, "how do I install llmkit", "--mode", "dense", "--chunks", "-k", "1")
    assert bm25_best["chunk_id"] != dense_best["chunk_id"]


@pytest.mark.parametrize("fusion", [[], ["--fusion", "cc", "--norm", "z"], ["--weights", "bm25=0.3,dense=0.7"]])
def test_the_shown_chunk_is_the_first_of_the_same_fusion_over_chunks(readme_index, fusion):
    differs = 0
    for q in QUERIES:
        (hit,) = _hits(readme_index, q, *fusion)
        chunks = _hits(readme_index, q, "--chunks", "-k", "100", *fusion)
        assert hit["chunk_id"] == chunks[0]["chunk_id"], q
        assert hit["text"] == chunks[0]["text"]
        (bm25_best,) = _hits(readme_index, q, "--mode", "bm25", "--chunks", "-k", "1")
        differs += bm25_best["chunk_id"] != hit["chunk_id"]
    assert differs  # a case where the first list's best chunk is not the fused best


def test_answer_sources_are_the_shown_passages(readme_index):
    from llmkit.rag.answer.cite import gather_sources
    from llmkit.rag.retrieve.options import QueryOptions
    from llmkit.rag.retrieve.pipeline import build_pipeline

    pipe, _ = build_pipeline(str(readme_index), QueryOptions(k=4))
    sources = gather_sources(pipe, None, "how do I install llmkit")
    (hit,) = _hits(readme_index, "how do I install llmkit", "-k", "4")
    assert sources.texts == [hit["text"]] and sources.refs == [f"{hit['doc']} § Install"]
