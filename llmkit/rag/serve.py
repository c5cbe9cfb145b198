"""`rag serve`: one index answered over the Model Context Protocol (the official `mcp` SDK), so an
agent or a chat client searches it without starting a process per query.

`Searcher` keeps the index open between calls (the embedding model loaded, BM25 and vectors
memory-mapped) and follows new generations that another process publishes: before each call it
looks at the manifest (one `stat`) and, when it was replaced, opens the generation it names, pins it
and lets the old one go. A call made while a writer rewrites the index is answered from the last
complete generation, the one the manifest still names (a writer never retires a pinned one). Calls
may come from several worker threads; they run one at a time.

Tools (`make_server`): `search` (hits with path, line range, symbol, score and text, as `rag query
--jsonl` ranks them), `get` (a document a hit named, from a line, bounded in lines and bytes),
`multi_get` (the documents a glob over the index's paths selects, in path order until one does not
fit the byte budget), `answer` (a
local GGUF model answers from the hits it cites, as `rag answer`) and `describe_index`. `get` and
`multi_get` read only the index's own documents, as the index holds them (`stored.py`). Bad arguments
come back as tool errors: the schema's checks (types, the mode's values) from the SDK, the rest from
`QueryOptions.validate` and the tools' bounds, worded with the tool's argument names.
"""

import os
import threading
from dataclasses import replace

from llmkit.errors import BadInput, LlmkitError, OptionError
from llmkit.rag.index.manifest import MANIFEST, stored_version
from llmkit.rag.index.reader import Index
from llmkit.rag.retrieve.options import FilterOptions, QueryOptions
from llmkit.rag.retrieve.pipeline import build_pipeline
from llmkit.rag.stored import chunk_lines, document_text, file_state, find_document, glob_documents, take_lines


QUERY_THREADS = 1  # one query at a time: a second thread costs more in hand-offs than it saves (rag-defaults.md)
GET_BYTES = 32_000  # default text budget of get and multi_get: a few thousand tokens of an agent's context
MAX_BYTES = 1_000_000  # the most either returns in one call, whatever is asked
MULTI_DOCS = 100  # documents multi_get returns at most
MULTI_READ = 500  # documents multi_get reads at most (the rest of a wide glob is counted, not read)
LISTED = 100  # left-out documents named in a multi_get result (the rest are counted)


def hit_record(hit, rank: int, lines: tuple[int, int] | None = None) -> dict:
    """One search hit as a tool returns it; `lines`: its range in the text `get` returns."""
    m = hit.meta
    return {"rank": rank, "path": hit.source, "lines": list(lines) if lines else None,
            "line": m.get("line_start"), "symbol": m.get("symbol"),
            "section": m.get("section"), "score": round(hit.score, 6), "text": hit.text, "chunk_id": hit.chunk_id,
            "ranks": hit.ranks, **({"rerank_score": round(hit.rerank, 6)} if hit.rerank is not None else {})}


class Searcher:
    """An index kept open across calls that follows the generations other processes publish."""

    def __init__(self, directory: str, model: str | None = None, runtime: str = "onnx", llm_path: str | None = None):
        self.directory, self.model, self.runtime, self.llm_path = directory, model, runtime, llm_path
        self._lock = threading.Lock()
        self._index: Index | None = None
        self._stamp = None
        self._llms: dict = {}  # local models by path, loaded on the first answer
        with self._lock:
            self._current()

    def _manifest_stamp(self):
        st = os.stat(os.path.join(self.directory, MANIFEST))
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _current(self) -> Index:
        """The open view of the newest complete generation (reopened when the manifest was replaced)."""
        try:
            stamp = self._manifest_stamp()
        except OSError:
            stamp = None
        if self._index is not None and stamp == self._stamp:
            return self._index
        try:
            new = Index(self.directory)
        except LlmkitError:
            if self._index is None:
                raise
            return self._index  # the manifest is being replaced or is unreadable: keep the last generation
        if new.n:  # loaded now, so the first call is as quick as the others
            new.embedder(self.model, self.runtime, threads=QUERY_THREADS)
        old, self._index, self._stamp = self._index, new, stamp
        if old is not None:
            old.close()
        return new

    def _options(self, k: int, mode: str | None, filters, collections, must, chunks: bool) -> QueryOptions:
        return QueryOptions(k=k, mode=mode or "hybrid", chunks=chunks, model=self.model, runtime=self.runtime,
                            filters=FilterOptions(filters=tuple(filters or ()), collections=tuple(collections or ()),
                                                  must=tuple(must or ())))

    def search(self, query: str, k: int = 10, mode: str | None = None, filters=(), collections=(), must=(),
               chunks: bool = False) -> dict:
        """The top `k` hits for `query` (documents, or chunks with `chunks`), best first."""
        opts = self._options(k, mode, filters, collections, must, chunks)
        with self._lock:
            ix = self._current()
            pipe, _ = build_pipeline(ix, opts, llms=self._llms)
            res = pipe.run(query)
            lines = chunk_lines(ix.con, [h.chunk_id for h in res.hits])
            return {"query": query, "generation": ix.manifest["generation"], "notes": res.notes,
                    "hits": [hit_record(h, r, lines.get(h.chunk_id)) for r, h in enumerate(res.hits, 1)]}

    def answer(self, question: str, k: int = 4, mode: str | None = None, filters=(), collections=(),
               n_predict: int = 256) -> dict:
        """A local model's answer to `question` from the `k` best sources, which it cites as [n]."""
        from llmkit.rag.answer.cite import answer, gather_sources

        if n_predict < 1:
            raise OptionError("{n_predict} must be at least 1, got {value}.", value=n_predict)
        opts = self._options(k, mode, filters, collections, (), False)
        opts = replace(opts, steps=replace(opts.steps, llm_path=self.llm_path))
        with self._lock:
            ix = self._current()
            pipe, llm = build_pipeline(ix, opts, need_llm=True, llms=self._llms)
            sources = gather_sources(pipe, llm, question)
            ans = answer(llm, sources, n_predict)
            lines = chunk_lines(ix.con, [h.chunk_id for h in sources.hits])
            return {"question": question, "answer": ans.text, "generation": ix.manifest["generation"],
                    "sources": [{**hit_record(h, n, lines.get(h.chunk_id)), "ref": ref}
                                for n, (h, ref) in enumerate(zip(sources.hits, sources.refs), 1)]}

    def get(self, path: str, from_line: int = 1, max_lines: int | None = None, max_bytes: int = GET_BYTES,
            collection: str | None = None) -> dict:
        """Lines of one of the index's documents (named as a hit names it, or by its absolute path),
        from `from_line` (1-based), at most `max_lines` and `max_bytes`; a range past the end gives
        the lines that exist and says so."""
        _check_bounds(max_bytes, max_lines, from_line)
        with self._lock:
            ix = self._current()
            gen = ix.manifest["generation"]
            doc = find_document(ix.con, gen, path, collection)
            if doc is None:
                where = f" in collection '{collection}'" if collection is not None else ""
                raise BadInput(f"'{path}' is not a document of this index{where}. Use a path that search or "
                               "multi_get returned.")
            text = document_text(ix.con, doc.id)
        r = take_lines(text, from_line, max_lines, max_bytes)
        out = {"path": doc.source, "collection": doc.collection, "generation": gen,
               "lines": [r.first, r.last] if r.last >= r.first else [], "total_lines": r.total, "text": r.text,
               "past_end": r.past_end, "next_line": r.next_line, "file": file_state(doc)}
        note = r.note(max_bytes)
        return {**out, "note": note} if note else out

    def multi_get(self, pattern: str, max_bytes: int = GET_BYTES, max_lines: int | None = None) -> dict:
        """The documents whose paths match the glob `pattern`, in path order, each whole (or its first
        `max_lines` lines) until one does not fit the `max_bytes` left; the ones left out are named with why."""
        _check_bounds(max_bytes, max_lines)
        if not pattern.strip():
            raise OptionError("{pattern} is empty. Give a glob over the index's paths, such as 'docs/**/*.md'.")
        with self._lock:
            ix = self._current()
            gen = ix.manifest["generation"]
            matched = glob_documents(ix.con, gen, pattern)
            if not matched:
                raise BadInput(f"no document of this index matches '{pattern}'. Use a glob over the paths that "
                               "search returns (* within a folder, ** across folders).")
            docs, left, used = [], [], 0
            for n, d in enumerate(matched):
                if n >= MULTI_READ or len(docs) >= MULTI_DOCS:
                    left.extend((d, None, f"not read: one call reads at most {MULTI_READ} documents and returns at "
                                         f"most {MULTI_DOCS}; narrow the glob") for d in matched[n:])
                    break
                r = take_lines(document_text(ix.con, d.id), 1, max_lines, max_bytes - used)
                if r.next_line is not None or r.cut_line:
                    # the budget is spent: the documents after this one are listed, not built
                    left.append((d, r.total, f"larger than the {max_bytes - used} bytes left of the budget; read "
                                              "it with get"))
                    left.extend((x, None, f"not read: only {max_bytes - used} bytes left of the budget after a "
                                          "document that did not fit; read it with get") for x in matched[n + 1:])
                    break
                used += len(r.text.encode("utf-8"))
                docs.append((d, r))
        states: dict = {}
        return {"pattern": pattern, "generation": gen, "matched": len(matched), "max_bytes": max_bytes, "bytes": used,
                "documents": [{"path": d.source, "collection": d.collection,
                               "lines": [r.first, r.last] if r.last >= r.first else [], "total_lines": r.total,
                               "truncated": r.last < r.total, "text": r.text, "file": file_state(d, states)}
                              for d, r in docs],
                "left_out": len(left),
                "left_out_documents": [{"path": d.source, "collection": d.collection,
                                        **({"total_lines": t} if t is not None else {}), "reason": why}
                                       for d, t, why in left[:LISTED]]}

    def describe(self) -> dict:
        """What the index holds and how it searches."""
        with self._lock:
            ix = self._current()
            m = ix.manifest
            fusion = m.get("fusion")
            return {"index": os.path.abspath(self.directory), "format_version": m["version"],
                    "stored_version": stored_version(self.directory), "generation": m["generation"],
                    "chunks": ix.n, "model": m["model"], "dim": m["dim"], "embed_precision": m["embed_precision"],
                    "analysis": m["analysis"], "ranking": m["ranking"], "graph": bool(m["graph"]),
                    "store": (m["store"] or {}).get("uri", "faiss"), "fields": m["fields"],
                    "collections": {n: {"documents": c.get("docs", 0), "chunks": c.get("chunks", 0)}
                                    for n, c in m["collections"].items()},
                    "fusion": (fusion.get("tuned") or {}).get("label", "tuned") if fusion else "built-in RRF 1:1, k 60",
                    # chunks published before their vectors: BM25 finds them, dense search not yet
                    "pending_vectors": m.get("pending", 0), "updated": m["updated"]}

    def close(self) -> None:
        with self._lock:
            if self._index is not None:
                self._index.close()
                self._index = None


def _check_bounds(max_bytes: int, max_lines: int | None, from_line: int = 1) -> None:
    """get's and multi_get's limits, refused in the tool's own argument names."""
    if not 1 <= max_bytes <= MAX_BYTES:
        raise OptionError("{max_bytes} must be between 1 and {most}, got {value}.", most=MAX_BYTES, value=max_bytes)
    if max_lines is not None and max_lines < 1:
        raise OptionError("{max_lines} must be at least 1, got {value}.", value=max_lines)
    if from_line < 1:
        raise OptionError("{from_line} must be at least 1 (lines count from 1), got {value}.", value=from_line)


INSTRUCTIONS = ("Search a local document and code index built with `llmkit rag index`: `search` returns the best "
                "passages (path, line range, symbol, score, text); `get` reads a document a hit named, from a line "
                "(the hit's `lines`), `multi_get` the documents a glob over the index's paths selects, within a "
                "byte budget; `answer` has a local model answer with cited sources; `describe_index` says what the "
                "index holds.")


def make_server(searcher: Searcher, name: str = "llmkit-rag"):
    """An MCPServer with the index's tools (mcp.server.mcpserver.MCPServer; run it with `.run()`)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(name, instructions=INSTRUCTIONS, log_level="WARNING")
    for add in (_search_tool, _read_tools, _answer_tools):  # in the order clients list them
        add(server, searcher)
    return server


def _answered(call, *args):
    """call(*args), an llmkit error turned into the one-line ToolError the client shows."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return call(*args)
    except LlmkitError as e:
        raise ToolError(e.spelled({}) if isinstance(e, OptionError) else str(e)) from None


def _arg_types():
    """pydantic's Field and the argument types the tools share: a search mode, a list of strings."""
    from typing import Literal

    from pydantic import Field

    return Field, Literal["bm25", "dense", "hybrid"] | None, list[str] | None


def _search_tool(server, searcher: Searcher) -> None:
    from typing import Annotated, Any

    Field, Mode, Strings = _arg_types()

    @server.tool(description="Search the index: the best passages for a query, best first (one per document "
                             "unless chunks is true), each with its path, lines (its range in the text get "
                             "returns), line and symbol (code), section, score and text.")
    def search(query: Annotated[str, Field(description="What to look for, in words.")],
               k: Annotated[int, Field(description="How many hits.")] = 10,
               mode: Annotated[Mode, Field(description="bm25 (words), dense (meaning) or hybrid (both; "
                                                        "default).")] = None,
               filters: Annotated[Strings, Field(description="Metadata filters: FIELD=VALUE, FIELD!=V, FIELD>=V, "
                                                             "FIELD<V, FIELD~TEXT (* globs).")] = None,
               collections: Annotated[Strings, Field(description="Only these collections.")] = None,
               must: Annotated[Strings, Field(description="Words or phrases every hit contains.")] = None,
               chunks: Annotated[bool, Field(description="Raw chunks instead of one hit per document.")] = False,
               ) -> dict[str, Any]:
        return _answered(searcher.search, query, k, mode, filters, collections, must, chunks)


def _read_tools(server, searcher: Searcher) -> None:
    from typing import Annotated, Any

    Field, _, _ = _arg_types()

    @server.tool(description="Read one document of the index as it was indexed: the path a search hit gave "
                             "(or the document's absolute path), from a line, at most max_lines lines and "
                             "max_bytes bytes. Returns the text, its line range, the document's total lines, "
                             "next_line when the byte budget stopped it, past_end when the range asked for "
                             "runs past the end, and whether the file changed since it was indexed. Paths "
                             "the index does not hold are refused.")
    def get(path: Annotated[str, Field(description="The document's path as search returned it.")],
            from_line: Annotated[int, Field(description="First line, counted from 1 (a hit's lines[0]).")] = 1,
            max_lines: Annotated[int | None, Field(description="Most lines (default: to the end).")] = None,
            max_bytes: Annotated[int, Field(description=f"Most bytes of text (at most {MAX_BYTES}).")] = GET_BYTES,
            collection: Annotated[str | None, Field(description="The collection, when several hold the "
                                                                "path.")] = None,
            ) -> dict[str, Any]:
        return _answered(searcher.get, path, from_line, max_lines, max_bytes, collection)

    @server.tool(description="Read several documents of the index at once: those whose paths match a glob "
                             "(* within a folder, ** across folders; a JSONL file's name selects its records), "
                             "in path order, each whole (or its first max_lines lines) until one does not fit "
                             "in max_bytes: that one and the rest are listed in left_out_documents with the "
                             "reason.")
    def multi_get(pattern: Annotated[str, Field(description="Glob over the paths search returns, e.g. "
                                                            "docs/**/*.md.")],
                  max_bytes: Annotated[int, Field(description=f"Budget in bytes of text for all documents (at "
                                                              f"most {MAX_BYTES}).")] = GET_BYTES,
                  max_lines: Annotated[int | None, Field(description="Most lines of each document (default: "
                                                                     "whole).")] = None,
                  ) -> dict[str, Any]:
        return _answered(searcher.multi_get, pattern, max_bytes, max_lines)


def _answer_tools(server, searcher: Searcher) -> None:
    from typing import Annotated, Any

    Field, Mode, Strings = _arg_types()

    @server.tool(description="Answer a question with a local language model from the index's best passages, "
                             "citing them as [1], [2], ...; returns the answer and its sources.")
    def answer(question: Annotated[str, Field(description="The question.")],
               k: Annotated[int, Field(description="Sources given to the model.")] = 4,
               mode: Annotated[Mode, Field(description="How sources are found: bm25, dense or hybrid.")] = None,
               filters: Annotated[Strings, Field(description="Metadata filters, as for search.")] = None,
               collections: Annotated[Strings, Field(description="Only these collections.")] = None,
               n_predict: Annotated[int, Field(description="Most tokens the answer may take.")] = 256,
               ) -> dict[str, Any]:
        return _answered(searcher.answer, question, k, mode, filters, collections, n_predict)

    @server.tool(description="Describe the index: documents and chunks per collection, metadata fields, "
                             "embedding model, BM25 analysis, fusion, generation.")
    def describe_index() -> dict[str, Any]:
        return _answered(searcher.describe)


def serve(directory: str, port: int | None = None, model: str | None = None, runtime: str = "onnx",
          llm_path: str | None = None) -> None:
    """Serve the index until the client goes away (stdio) or the process is stopped (HTTP on
    127.0.0.1:`port`, path /mcp)."""
    searcher = Searcher(directory, model, runtime, llm_path)
    server = make_server(searcher)
    try:
        if port is None:
            server.run()
        else:
            server.run("streamable-http", host="127.0.0.1", port=port)
    finally:
        searcher.close()
