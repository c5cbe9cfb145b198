"""`rag answer` and `rag ask-global`: answers with a GGUF model or an OpenAI-compatible endpoint, from
retrieved sources or from summaries of the entity-graph communities a question touches."""

from __future__ import annotations

import sys

import click

from llmkit.commands._common import Output
from llmkit.commands.rag.query_options import query_options
from llmkit.commands.deprecated import Renamed, renamed


def _question(question: str | None) -> str:
    from llmkit.commands._common import read_prompt

    return read_prompt(question).strip()


def asking(k_help: str):
    """INDEX_DIR, QUESTION, the query options (-k included) and -n, as `rag answer` and `rag ask-global`
    take them."""
    def deco(f):
        f = click.option("-n", "--n-predict", default=256, show_default=True, type=int)(f)
        f = query_options(4, k_help)(f)
        f = click.argument("question", required=False)(f)
        return click.argument("index_dir", type=click.Path(file_okay=False))(f)

    return deco


@renamed(Renamed("-m", "--llm"))
@click.command("answer")
@asking("Sources in the prompt.")
@click.option("--compress-to", default=0, type=int, help="Compress the sources to about N tokens first.")
@click.option("--global", "global_", is_flag=True, help="Deprecated: use `rag ask-global`.")
@click.option("--json", "as_json", is_flag=True)
def answer_cmd(index_dir, question, opts, n_predict, compress_to, global_, as_json):
    """Retrieve sources for QUESTION and stream an answer citing them, with a local GGUF model or a
    chat endpoint (--llm http://host:8080, e.g. a llama-server).

    \b
    llmkit rag answer idx "How are kernel modules loaded?" --llm qwen2.5-1.5b.gguf
    """
    from llmkit.commands._common import stdout_stream
    from llmkit.rag.answer.cite import answer, gather_sources
    from llmkit.rag.retrieve.pipeline import build_pipeline

    out = Output()
    if global_:
        out.warn("`rag answer --global` is deprecated; use `llmkit rag ask-global`.")
        return _ask_global(out, index_dir, _question(question), opts, n_predict, as_json)
    question = _question(question)
    pipe, llm = build_pipeline(index_dir, opts, need_llm=True)
    sources = gather_sources(pipe, llm, question, compress_to)
    c = sources.compressed
    if c is not None:
        out.info(f"sources compressed {c.tokens_before} -> {c.tokens_after} tokens ({c.ratio:.1f}x)")
    ans = answer(llm, sources, n_predict, on_text=stdout_stream(not as_json))
    if as_json:
        out.json(ans.to_dict())
        return
    sys.stdout.write("\n\nSources:\n" + "".join(f"[{i}] {r}\n" for i, r in enumerate(sources.refs, 1)))
    sys.stdout.flush()


@renamed(Renamed("-m", "--llm"))
@click.command("ask-global")
@asking("Communities whose summaries answer the question.")
@click.option("--json", "as_json", is_flag=True)
def ask_global_cmd(index_dir, question, opts, n_predict, as_json):
    """A question about the whole corpus: answer from summaries of the entity-graph communities it
    touches (index built with --graph; summaries cached in the index).

    \b
    llmkit rag ask-global idx "What are the main themes of these documents?" --llm model.gguf
    """
    _ask_global(Output(), index_dir, _question(question), opts, n_predict, as_json)


def _ask_global(out, index_dir, question, opts, n_predict, as_json) -> None:
    """-k counts communities here; the pipeline gathers 40 passages to find them."""
    from dataclasses import replace

    from llmkit.commands._common import stdout_stream
    from llmkit.rag.answer.global_answer import global_answer
    from llmkit.rag.retrieve.pipeline import build_pipeline

    pipe, llm = build_pipeline(index_dir, replace(opts, k=40), need_llm=True)
    ans = global_answer(pipe.index, pipe, llm, question, opts.k, n_predict, on_text=stdout_stream(not as_json))
    if as_json:
        out.json(ans.to_dict())
        return
    sys.stdout.write("\n\nTopics:\n" + "".join(f"[{i}] {', '.join(c.entities[:6])}\n"
                                               for i, c in enumerate(ans.communities, 1)))
    sys.stdout.flush()
    out.info(f"{len(ans.communities)} communities, {ans.cached} summaries from the cache")
