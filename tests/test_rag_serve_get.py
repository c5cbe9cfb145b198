"""`rag serve`'s `get` and `multi_get`: an agent reads what `search` found, through the MCP SDK's own
stdio client against the command started as a subprocess. A hit's `lines` opened with `get` give the
hit's text; ranges past the end and byte budgets are kept and said; paths the index does not hold
(`..`, absolute paths elsewhere) are tool errors."""

import hashlib
import json

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from conftest import llmkit_argv, llmkit_env, run_cli
from ragfixtures import kernel_paragraphs

CODE = '''import os


class Pages:
    """Pages handed out by order."""

    def allocate_pages(self, order):
        """Allocate 2**order contiguous pages from the buddy allocator."""
        return 1 << order

    def free_pages(self, page):
        return None


def mount_filesystem(device, point):
    """Mount the filesystem on device at point."""
    return os.system(f"mount {device} {point}")
'''


@pytest.fixture(scope="module")
def indexed(kernel_docs, tmp_path_factory):
    """Markdown guides of several sections (hits fall mid-document), a Python file, a JSONL file,
    indexed in 400-character chunks; beside them a file that is not indexed."""
    root = tmp_path_factory.mktemp("get")
    corpus = root / "corpus"
    (corpus / "guides").mkdir(parents=True)
    paras = kernel_paragraphs(kernel_docs)
    for g in range(4):
        part = paras[g * 12:(g + 1) * 12]
        body = "".join(f"## Part {s}\n\n" + "\n\n".join(part[s * 3:(s + 1) * 3]) + "\n\n" for s in range(4))
        (corpus / "guides" / f"guide{g}.md").write_text(f"# Guide {g}\n\n{body}")
    (corpus / "pages.py").write_text(CODE)
    (corpus / "notes.jsonl").write_text("".join(json.dumps({"id": f"n{i}", "text": t}) + "\n"
                                                for i, t in enumerate(paras[60:64])))
    (root / "secret.txt").write_text("not indexed")
    idx = root / "idx"
    r = run_cli(["rag", "index", str(idx), str(corpus), "--no-tune", "--size", "400"])
    assert r.exit_code == 0, r.stderr
    return root, idx


def _session(idx, calls):
    """Run `calls(session)` against `llmkit rag serve IDX` over stdio and return what it returns."""
    command, *args = llmkit_argv("rag", "serve", idx)

    async def main():
        params = StdioServerParameters(command=command, args=args, env=llmkit_env())
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            return await calls(s)

    return anyio.run(main)


def _ok(res) -> dict:
    assert not res.is_error, res.content
    return res.structured_content


def _source_lines(text: str) -> str:
    """A code hit's text without the comment line naming its definition (not a line of the file)."""
    first, _, rest = text.partition("\n")
    return rest if first.startswith("# ") and "." in first else text


def test_search_then_get_returns_the_hits_lines(indexed):
    root, idx = indexed
    queries = ["allocate contiguous pages from the buddy allocator", "kernel memory pages", "mount a filesystem",
               "submitting patches", "power management of devices", "scheduler latency"]

    async def calls(s):
        names = {t.name for t in (await s.list_tools()).tools}
        out = []
        for q in queries:
            for hit in _ok(await s.call_tool("search", {"query": q, "k": 3, "chunks": True}))["hits"]:
                a, b = hit["lines"]
                got = _ok(await s.call_tool("get", {"path": hit["path"], "from_line": a, "max_lines": b - a + 1}))
                out.append((hit, got))
        return names, out

    names, pairs = _session(idx, calls)
    assert {"search", "get", "multi_get", "answer", "describe_index"} == names
    code = prose = middle = 0
    for hit, got in pairs:
        a, b = hit["lines"]
        assert got["lines"] == [a, b] and got["path"] == hit["path"] and not got["past_end"]
        assert got["file"] == "unchanged" and got["next_line"] is None
        if hit["path"].endswith(".py"):  # code: exactly the file's lines
            code += 1
            assert hit["line"] == a
            assert got["text"] == _source_lines(hit["text"])
            assert got["text"].split("\n") == CODE.split("\n")[a - 1:b]
        else:  # prose: the hit starts on the first line returned and ends on the last
            prose += 1
            at = got["text"].find(hit["text"])
            assert at >= 0, (hit, got)
            assert "\n" not in got["text"][:at] and "\n" not in got["text"][at + len(hit["text"]):]
            middle += a > 1
    assert code and prose and middle  # hits inside documents, not only their first lines


def test_get_past_the_end_and_within_a_byte_budget(indexed):
    root, idx = indexed
    path = str(root / "corpus" / "guides" / "guide1.md")

    async def calls(s):
        whole = _ok(await s.call_tool("get", {"path": path, "max_bytes": 1_000_000}))
        n = whole["total_lines"]
        tail = _ok(await s.call_tool("get", {"path": path, "from_line": n - 1, "max_lines": 10}))
        beyond = _ok(await s.call_tool("get", {"path": path, "from_line": n + 5}))
        pieces, at = [], 1
        while at is not None:  # read it back 300 bytes at a time
            part = _ok(await s.call_tool("get", {"path": path, "from_line": at, "max_bytes": 300}))
            assert len(part["text"].encode()) <= 300
            pieces.append(part["text"])
            at = part["next_line"]
        return whole, tail, beyond, pieces

    whole, tail, beyond, pieces = _session(idx, calls)
    n = whole["total_lines"]
    assert whole["lines"] == [1, n] and n > 20 and not whole["past_end"] and "note" not in whole
    assert tail["lines"] == [n - 1, n] and tail["past_end"] and "runs past its end" in tail["note"]
    assert tail["text"].split("\n") == whole["text"].split("\n")[n - 2:]
    assert beyond["lines"] == [] and beyond["text"] == "" and beyond["past_end"]
    assert f"has {n} lines" in beyond["note"]
    assert len(pieces) > 3 and "\n".join(pieces) == whole["text"]


def test_multi_get_stays_within_its_budget(indexed):
    root, idx = indexed
    guides = sorted(str(p) for p in (root / "corpus" / "guides").glob("*.md"))

    async def calls(s):
        texts = {p: _ok(await s.call_tool("get", {"path": p, "max_bytes": 1_000_000}))["text"] for p in guides}
        budget = len(texts[guides[0]].encode()) + len(texts[guides[1]].encode()) + 10  # two guides, not three
        some = _ok(await s.call_tool("multi_get", {"pattern": "**/guides/*.md", "max_bytes": budget}))
        heads = _ok(await s.call_tool("multi_get", {"pattern": "**/guides/*.md", "max_lines": 2}))
        records = _ok(await s.call_tool("multi_get", {"pattern": "**/notes.jsonl"}))
        return texts, budget, some, heads, records

    texts, budget, some, heads, records = _session(idx, calls)
    got = [d["path"] for d in some["documents"]]
    assert some["matched"] == 4 and got == guides[:2]
    assert some["bytes"] == sum(len(d["text"].encode()) for d in some["documents"]) <= budget
    assert all(not d["truncated"] and d["lines"] == [1, d["total_lines"]] and d["text"] == texts[d["path"]]
               for d in some["documents"])
    assert some["left_out"] == 2 and [d["path"] for d in some["left_out_documents"]] == guides[2:]
    assert all("bytes left of the budget" in d["reason"] for d in some["left_out_documents"])
    # the budget is spent at the first document that does not fit: the rest are listed, not built
    assert "total_lines" in some["left_out_documents"][0] and "not read" in some["left_out_documents"][1]["reason"]
    assert [d["path"] for d in heads["documents"]] == guides and heads["left_out"] == 0
    assert all(d["lines"] == [1, 2] and d["truncated"] and d["text"].split("\n") == texts[d["path"]].split("\n")[:2]
               for d in heads["documents"])
    assert [d["path"].rsplit("#", 1)[1] for d in records["documents"]] == ["n0", "n1", "n2", "n3"]
    assert all(d["file"] == "unchanged" for d in records["documents"])


def test_paths_outside_the_index_are_tool_errors(indexed):
    root, idx = indexed
    corpus = root / "corpus"
    outside = ["../x", "../secret.txt", str(root / "secret.txt"), f"{corpus}/../secret.txt", "/etc/passwd",
               str(corpus), "guides/guide0.md", str(idx / "chunks.sqlite")]

    async def calls(s):
        gets = [await s.call_tool("get", {"path": p}) for p in outside]
        globs = [await s.call_tool("multi_get", {"pattern": p}) for p in ("../*", "/etc/*", f"{root}/*.txt", " ")]
        bad = [await s.call_tool("get", {"path": str(corpus / "pages.py"), **a})
               for a in ({"max_bytes": 0}, {"max_bytes": 2_000_000}, {"from_line": 0}, {"max_lines": 0})]
        ok = await s.call_tool("get", {"path": str(corpus / "pages.py"), "max_lines": 1})
        return gets, globs, bad, ok

    gets, globs, bad, ok = _session(idx, calls)
    for res in gets:
        assert res.is_error and "is not a document of this index" in res.content[0].text, res.content
    assert "not indexed" not in "".join(r.content[0].text for r in gets)
    assert all(r.is_error for r in globs) and "no document of this index matches" in globs[0].content[0].text
    assert all(r.is_error for r in bad)
    assert "max_bytes must be between 1 and 1000000" in bad[0].content[0].text
    assert "from_line must be at least 1" in bad[2].content[0].text
    assert _ok(ok)["text"] == "import os"


def test_file_state_says_when_the_file_changed_since_indexing(tmp_path):
    from llmkit.rag.stored import StoredDoc, file_state

    f = tmp_path / "a.md"
    f.write_bytes(b"# A\n\nbody\n")
    doc = StoredDoc(1, "default", "a.md", str(f), hashlib.sha256(b"# A\n\nbody\n").hexdigest())
    rec_line = json.dumps({"id": "r1", "text": "one"})
    j = tmp_path / "r.jsonl"
    j.write_text(json.dumps({"id": "r0", "text": "zero"}) + "\n" + rec_line + "\n")
    rec = StoredDoc(2, "default", "r.jsonl#r1", f"{j}#r1", hashlib.sha256(rec_line.encode()).hexdigest())
    assert file_state(doc) == "unchanged" and file_state(rec) == "unchanged"
    f.write_bytes(b"# A\n\nbody, edited\n")
    j.write_text(json.dumps({"id": "r1", "text": "one, edited"}) + "\n")
    assert file_state(doc) == "changed" and file_state(rec) == "changed"
    f.unlink()
    j.unlink()
    assert file_state(doc) == "missing" and file_state(rec) == "missing"
    assert file_state(StoredDoc(3, "default", "<stdin>", "-", "x")) == "unchecked"


def test_stored_stat_spares_reading_and_globs_narrow_by_prefix(tmp_path):
    """A document whose file has the size, mtime and inode indexing kept is 'unchanged' without being
    read; other stats fall back to the hash. A glob selects in SQL by its text before the first
    wildcard, and a glob with too many '*' is refused before it runs."""
    import os

    from llmkit.errors import OptionError
    from llmkit.rag.index import db
    from llmkit.rag.stored import MAX_STARS, file_state, find_document, glob_documents, glob_regex

    f = tmp_path / "a.md"
    f.write_bytes(b"indexed text\n")
    st = os.stat(f)
    con = db.connect(str(tmp_path))
    rows = [("docs/a.md", str(f), hashlib.sha256(b"indexed text\n").hexdigest(), st.st_size, st.st_mtime_ns, st.st_ino),
            ("docs/sub/b.md", str(tmp_path / "b.md"), "0" * 64, None, None, None),
            ("other/c.md", str(tmp_path / "c.md"), "0" * 64, 1, 2, 3)]
    con.executemany("INSERT INTO docs (collection, source, path, hash, meta, gen_added, size, mtime_ns, inode) "
                    "VALUES ('default', ?, ?, ?, '{}', 1, ?, ?, ?)", rows)
    doc = find_document(con, 1, "docs/a.md")
    assert doc.stat == (st.st_size, st.st_mtime_ns, st.st_ino) and find_document(con, 1, "docs/sub/b.md").stat is None
    assert file_state(doc) == "unchanged"
    f.write_bytes(b"indexed text\n")  # a new mtime, the same bytes: the hash says unchanged
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert file_state(doc) == "unchanged"
    f.write_bytes(b"edited text!\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old size and mtime, other bytes: trusted as git does
    assert file_state(doc) == "unchanged"
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    assert file_state(doc) == "changed"
    f.unlink()
    assert file_state(doc) == "missing"
    assert [d.source for d in glob_documents(con, 1, "docs/**/*.md")] == ["docs/a.md", "docs/sub/b.md"]
    assert [d.source for d in glob_documents(con, 1, "*/c.md")] == ["other/c.md"]
    assert [d.source for d in glob_documents(con, 1, f"{tmp_path}/c*")] == ["other/c.md"]
    assert glob_documents(con, 1, "docs/x*") == []
    glob_regex("/".join(["*"] * MAX_STARS))
    with pytest.raises(OptionError, match="more than the 10 a glob may have"):
        glob_regex("*a" * (MAX_STARS + 1))
    con.close()
