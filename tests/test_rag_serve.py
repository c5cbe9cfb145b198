"""`rag serve`: an MCP server over one index, driven by the SDK's own client (`stdio_client` +
`ClientSession`) against the command started as a subprocess. Its search answers what `rag query
--jsonl` answers, it follows generations another process publishes, answers from the last complete
generation while one is being written, and turns bad arguments into tool errors."""

import json
import time

import pytest

from conftest import llmkit_argv, llmkit_env, run_cli, run_subprocess, start_subprocess
from ragfixtures import kernel_paragraphs, tiny_gguf, write_jsonl  # noqa: F401 - tiny_gguf is a pytest fixture

pytest.importorskip("mcp")
anyio = pytest.importorskip("anyio")

QUERIES = ["how to mount a filesystem", "kernel memory pages", "submitting patches by email", "scheduler latency",
           "power management of devices"]


@pytest.fixture(scope="module")
def served(kernel_docs, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    paras = kernel_paragraphs(kernel_docs)
    write_jsonl(root / "docs.jsonl", paras[:150])
    write_jsonl(root / "more.jsonl", ["Zanzibar xylophones resonate beside quokka enclosures at dawn.",
                                      *paras[150:155]], prefix="m")
    idx = root / "idx"
    r = run_cli(["rag", "index", str(idx), str(root / "docs.jsonl"), "--no-tune"])
    assert r.exit_code == 0, r.stderr
    return root, idx


def _client(idx, *extra):
    from mcp import StdioServerParameters, stdio_client

    command, *args = llmkit_argv("rag", "serve", idx, *extra)
    return stdio_client(StdioServerParameters(command=command, args=args, env=llmkit_env()))


def _run(fn, *args):
    return anyio.run(fn, *args)


def _query_jsonl(idx, q, *flags):
    r = run_cli(["rag", "query", str(idx), q, "-k", "10", "--jsonl", *flags])
    assert r.exit_code == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def _key(h):
    return h["chunk_id"], h["score"], h["text"]


def test_sdk_client_lists_the_tools_and_gets_rag_querys_top_10(served):
    from mcp import ClientSession

    _, idx = served
    want = {q: [(h["doc"], *_key(h)) for h in _query_jsonl(idx, q)] for q in QUERIES}
    want_bm25 = [(h["doc"], *_key(h)) for h in _query_jsonl(idx, QUERIES[0], "--mode", "bm25", "--chunks")]

    async def session():
        async with _client(idx) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == {"search", "get", "multi_get", "answer", "describe_index"}
            assert {"query", "k", "mode", "filters"} <= set(tools["search"].input_schema["properties"])
            got = {}
            for q in QUERIES:
                res = await s.call_tool("search", {"query": q, "k": 10})
                assert not res.is_error, res.content
                got[q] = [(h["path"], *_key(h)) for h in res.structured_content["hits"]]
                assert [h["rank"] for h in res.structured_content["hits"]] == list(range(1, 11))
            res = await s.call_tool("search", {"query": QUERIES[0], "k": 10, "mode": "bm25", "chunks": True})
            got_bm25 = [(h["path"], *_key(h)) for h in res.structured_content["hits"]]
            desc = (await s.call_tool("describe_index", {})).structured_content
            return got, got_bm25, desc

    got, got_bm25, desc = _run(session)
    assert got == want and got_bm25 == want_bm25
    assert desc["chunks"] >= 150 and desc["collections"]["default"]["documents"] == 150
    assert desc["format_version"] == 2 and desc["ranking"] == "documents"


def test_bad_arguments_are_tool_errors_and_the_server_keeps_answering(served):
    from mcp import ClientSession

    _, idx = served
    bad = [{"query": "x", "k": "ten"}, {"k": 3}, {"query": "x", "k": 0}, {"query": "   "},
           {"query": "x", "mode": "fuzzy"}, {"query": "x", "filters": ["no operator"]},
           {"query": "x", "filters": "source=a"}, {"query": "x", "collections": ["nope"]}]

    async def session():
        async with _client(idx) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            errors = []
            for args in bad:
                res = await s.call_tool("search", args)
                errors.append((res.is_error, res.content[0].text))
            ok = await s.call_tool("search", {"query": "kernel memory pages", "k": 3})
            return errors, ok

    errors, ok = _run(session)
    assert all(is_error for is_error, _ in errors), errors
    texts = [t for _, t in errors]
    assert "k and depth must be positive" in texts[2] and "the query is empty" in texts[3]
    assert "cannot read the filter" in texts[5] and "Traceback" not in "".join(texts)
    assert not ok.is_error and len(ok.structured_content["hits"]) == 3


def test_the_server_follows_generations_another_process_writes(served, tmp_path):
    import shutil

    from mcp import ClientSession

    root, built = served
    idx = tmp_path / "idx"
    shutil.copytree(built, idx)

    async def session():
        async with _client(idx, "--runtime", "onnx") as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            before = (await s.call_tool("search", {"query": "zanzibar xylophones quokka", "k": 1})).structured_content
            docs = (await s.call_tool("describe_index", {})).structured_content["collections"]["default"]["documents"]
            r = run_cli(["rag", "index", str(idx), str(root / "more.jsonl"), "--no-tune"])  # another writer
            assert r.exit_code == 0, r.stderr
            after = (await s.call_tool("search", {"query": "zanzibar xylophones quokka", "k": 1})).structured_content
            desc = (await s.call_tool("describe_index", {})).structured_content
            return before, after, desc, docs

    before, after, desc, docs = _run(session)
    assert before["hits"][0]["path"] != f"{root / 'more.jsonl'}#m0"
    assert after["generation"] == before["generation"] + 1
    assert docs == 150 and desc["collections"]["default"]["documents"] == 156
    assert after["hits"][0]["path"].endswith("more.jsonl#m0") and "Zanzibar" in after["hits"][0]["text"]


def test_a_query_during_a_rewrite_is_answered_from_the_last_complete_generation(served, tmp_path):
    """In-process: a search made while a writer has written its generation but not yet swapped the
    manifest gets the old generation's answer; the next one the new generation's."""
    import shutil

    from llmkit.rag.index.build import IndexOptions, build
    from llmkit.rag.serve import Searcher

    root, built = served
    idx = tmp_path / "idx"
    shutil.copytree(built, idx)
    s = Searcher(str(idx))
    q = "zanzibar xylophones quokka"
    old = s.search(q, 5)
    during = []

    def progress(stage, done, total):
        if stage == "BM25":  # the new generation's vectors are written; its manifest is not
            during.append(s.search(q, 5))

    build(str(idx), [str(root / "more.jsonl")], IndexOptions(tune=False), progress=progress)
    assert during and all(d == old for d in during)
    new = s.search(q, 5)
    assert new["generation"] == old["generation"] + 1 and "Zanzibar" in new["hits"][0]["text"]
    # the generation the server held was pinned while it answered; the next writer may retire it now
    build(str(idx), [str(root / "more.jsonl")], IndexOptions(tune=False))
    assert s.search(q, 5)["hits"] == new["hits"]
    s.close()
    assert not (idx / f"gen-{old['generation']}").exists()


def test_answer_tool_cites_its_sources(served, tiny_gguf):
    pytest.importorskip("llama_cpp")
    from mcp import ClientSession

    _, idx = served

    async def session():
        async with _client(idx, "--llm", tiny_gguf) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            res = await s.call_tool("answer", {"question": "how are kernel memory pages tracked?", "k": 2,
                                               "n_predict": 8})
            bad = await s.call_tool("answer", {"question": "x", "n_predict": 0})
            return res, bad

    res, bad = _run(session)
    assert not res.is_error, res.content
    got = res.structured_content
    assert isinstance(got["answer"], str) and [x["rank"] for x in got["sources"]] == [1, 2]
    want = _query_jsonl(idx, "how are kernel memory pages tracked?")[:2]
    assert [x["chunk_id"] for x in got["sources"]] == [h["chunk_id"] for h in want]
    assert bad.is_error and "n_predict must be at least 1" in bad.content[0].text


def test_streamable_http_on_a_local_port(served):
    import subprocess

    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from serverutil import free_port

    _, idx = served
    port = free_port()
    proc = start_subprocess(["rag", "serve", idx, "--port", port], stdout=subprocess.DEVNULL)

    async def session():
        deadline = time.time() + 120
        while True:
            try:
                async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (r, w), ClientSession(r, w) as s:
                    await s.initialize()
                    names = {t.name for t in (await s.list_tools()).tools}
                    res = await s.call_tool("search", {"query": QUERIES[1], "k": 10})
                    return names, res
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    raise
                await anyio.sleep(0.5)

    try:
        names, res = _run(session)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert names == {"search", "get", "multi_get", "answer", "describe_index"}
    assert [_key(h) for h in res.structured_content["hits"]] == [_key(h) for h in _query_jsonl(idx, QUERIES[1])]


def test_serve_refuses_a_missing_index_in_one_line(tmp_path):
    import subprocess

    p = run_subprocess(["rag", "serve", tmp_path / "nope"], timeout=120, text=True, stdin=subprocess.DEVNULL)
    assert p.returncode == 1 and "does not exist" in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""
