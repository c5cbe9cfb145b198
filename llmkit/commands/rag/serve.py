"""`rag serve`: answer an index over the Model Context Protocol (stdio, or streamable HTTP on a local port)."""

from __future__ import annotations

import click

from llmkit.commands.rag.options import RUNTIMES


@click.command("serve")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Serve streamable HTTP on 127.0.0.1:PORT (path /mcp) instead of stdio.")
@click.option("--llm", "llm_path", help="Local GGUF model, or OpenAI-compatible chat endpoint URL[#MODEL], for the "
              "answer tool (default: LLMKIT_LLM_URL, else LLMKIT_MODEL or the packaged SmolLM2).")
@click.option("--model", help="Embedding model override for queries (must match the index's dimension); for an "
              "index embedded through an endpoint, the same model served at URL[#MODEL].")
@click.option("--runtime", type=click.Choice(RUNTIMES), default="onnx", show_default=True,
              help="Embedding runtime for queries.")
def serve_cmd(index_dir, port, llm_path, model, runtime):
    """Serve INDEX_DIR to MCP clients (agents, chat apps): tools search, get, multi_get, answer and
    describe_index.

    get and multi_get read back the index's own documents (a hit's path from its line range, or the
    documents a glob selects), as they were indexed, within a byte budget; other paths are refused.

    The index stays open between calls and follows new generations that `rag index` (or `rag index
    --watch`) writes meanwhile. stdio by default: a client starts this command itself.

    \b
    llmkit rag serve idx                 # stdio (Claude Desktop, editors, agents)
    llmkit rag serve idx --port 8765     # http://127.0.0.1:8765/mcp
    """
    from llmkit.commands._common import Output
    from llmkit.rag.serve import serve

    where = "stdio" if port is None else f"http://127.0.0.1:{port}/mcp"
    Output().info(f"serving {index_dir} over MCP ({where}); tools: search, get, multi_get, answer, describe_index")
    serve(index_dir, port=port, model=model, runtime=runtime, llm_path=llm_path)
