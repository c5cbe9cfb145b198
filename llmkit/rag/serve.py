"""`rag serve`: one index answered over the Model Context Protocol (the official `mcp` SDK), so an
agent or a chat client searches it without starting a process per query.

`Searcher` keeps the index open between calls (the embedding model loaded, BM25 and vectors
memory-mapped) and follows new generations that another process publishes: before each call it
looks at the manifest (one `stat`) and, when it was replaced, opens the generation it names, pins it
and lets the old one go. A call made while a writer rewrites the index is answered from the last
complete generation, the one the manifest still names (a writer never retires a pinned one). Calls
may come from several worker threads; they run one at a time.

Tools (`make_server`): `search` (hits with path, line, symbol, score and text, as `rag query --jsonl`
ranks them), `answer` (a local GGUF model answers from the hits it cites, as `rag answer`) and
`describe_index`. Bad arguments come back as tool errors: the schema's checks (types, the mode's
values) from the SDK, the rest from `QueryOptions.validate`, worded with the tool's argument names.
"""

import os
import threading
from dataclasses import replace

from llmkit.errors import LlmkitError, OptionError
from llmkit.rag.index.manifest import MANIFEST, stored_version
from llmkit.rag.index.reader import Index
from llmkit.rag.retrieve.options import FilterOptions, QueryOptions
from llmkit.rag.retrieve.pipeline import build_pipeline


QUERY_THREADS = 1  # one query at a time: a second thread costs more in hand-offs than it saves (rag-defaults.md)


def hit_record(hit, rank: int) -> dict:
    """One search hit as a tool returns it."""
    m = hit.meta
    return {"rank": rank, "path": hit.source, "line": m.get("line_start"), "symbol": m.get("symbol"),
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
            return {"query": query, "generation": ix.manifest["generation"], "notes": res.notes,
                    "hits": [hit_record(h, r) for r, h in enumerate(res.hits, 1)]}

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
            return {"question": question, "answer": ans.text, "generation": ix.manifest["generation"],
                    "sources": [{**hit_record(h, n), "ref": ref}
                                for n, (h, ref) in enumerate(zip(sources.hits, sources.refs), 1)]}

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
                    "updated": m["updated"]}

    def close(self) -> None:
        with self._lock:
            if self._index is not None:
                self._index.close()
                self._index = None


INSTRUCTIONS = ("Search a local document and code index built with `llmkit rag index`: `search` returns the best "
                "passages (path, line, symbol, score, text); `answer` has a local model answer with cited sources; "
                "`describe_index` says what the index holds.")


def make_server(searcher: Searcher, name: str = "llmkit-rag"):
    """An MCPServer with the index's tools (mcp.server.mcpserver.MCPServer; run it with `.run()`)."""
    from typing import Annotated, Any, Literal

    from pydantic import Field

    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer(name, instructions=INSTRUCTIONS, log_level="WARNING")
    Mode = Literal["bm25", "dense", "hybrid"] | None
    Strings = list[str] | None

    def tool_error(e: LlmkitError) -> ToolError:
        return ToolError(e.spelled({}) if isinstance(e, OptionError) else str(e))

    @server.tool(description="Search the index: the best passages for a query, best first (one per document "
                             "unless chunks is true), each with its path, line and symbol (code), section, "
                             "score and text.")
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
        try:
            return searcher.search(query, k, mode, filters, collections, must, chunks)
        except LlmkitError as e:
            raise tool_error(e) from None

    @server.tool(description="Answer a question with a local language model from the index's best passages, "
                             "citing them as [1], [2], ...; returns the answer and its sources.")
    def answer(question: Annotated[str, Field(description="The question.")],
               k: Annotated[int, Field(description="Sources given to the model.")] = 4,
               mode: Annotated[Mode, Field(description="How sources are found: bm25, dense or hybrid.")] = None,
               filters: Annotated[Strings, Field(description="Metadata filters, as for search.")] = None,
               collections: Annotated[Strings, Field(description="Only these collections.")] = None,
               n_predict: Annotated[int, Field(description="Most tokens the answer may take.")] = 256,
               ) -> dict[str, Any]:
        try:
            return searcher.answer(question, k, mode, filters, collections, n_predict)
        except LlmkitError as e:
            raise tool_error(e) from None

    @server.tool(description="Describe the index: documents and chunks per collection, metadata fields, "
                             "embedding model, BM25 analysis, fusion, generation.")
    def describe_index() -> dict[str, Any]:
        try:
            return searcher.describe()
        except LlmkitError as e:
            raise tool_error(e) from None

    return server


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
