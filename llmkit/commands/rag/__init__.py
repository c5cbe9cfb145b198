"""`llmkit rag`: index documents and query them with BM25, dense vectors and hybrid fusion; answer with a
local model; evaluate and tune.

    index.py          rag index (and --watch), rag info
    serve.py          rag serve (an MCP server over one index)
    query.py          rag query
    answer.py         rag answer, rag ask-global
    evaluate.py       rag eval, rag cranfield
    tune.py           rag tune, rag tune-reset, rag adapt
    options.py        shared option decorators (read / chunk / embed / store, judged queries) and the
                      flag spellings of library option names
    query_options.py  the query option decorators (fusion, filters, LLM steps)

Library errors that name an option are spelled as flags by llmkit.cli (this package's `FLAGS` add the
names that are not one command's own flags); the libraries' log records below ERROR (their advice
and chatter on the root logger) are not shown.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import click

from llmkit.commands.rag.answer import answer_cmd, ask_global_cmd
from llmkit.commands.rag.evaluate import cranfield_cmd, eval_cmd
from llmkit.commands.rag.index import index_cmd, info_cmd
from llmkit.commands.rag.options import FLAGS  # noqa: F401 -- read by llmkit.cli to spell option errors
from llmkit.commands.rag.query import query_cmd
from llmkit.commands.rag.serve import serve_cmd
from llmkit.commands.rag.tune import adapt_cmd, tune_cmd, tune_reset_cmd


@contextmanager
def _library_logging():
    """Show only ERROR and above of what libraries log on the root logger while a command runs."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


class RagGroup(click.Group):
    """Runs a rag command with library log records below ERROR hidden. (Option errors are spelled
    by the root CLI, with `FLAGS` for the names that are not one command's own flags.)"""

    def invoke(self, ctx):
        with _library_logging():
            return super().invoke(ctx)


@click.group("rag", cls=RagGroup)
def group():
    """Index documents; query with BM25 + dense retrieval; answer with a local model; evaluate."""


for _cmd in (index_cmd, query_cmd, answer_cmd, ask_global_cmd, eval_cmd, tune_cmd, tune_reset_cmd, adapt_cmd,
             cranfield_cmd, info_cmd, serve_cmd):
    group.add_command(_cmd)
