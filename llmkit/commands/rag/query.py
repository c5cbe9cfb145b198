"""`rag query`: search an index (one query, or a batch from a file or standard input)."""

from __future__ import annotations

import sys

import click

from llmkit.commands._common import Output
from llmkit.commands.rag.query_options import query_options
from llmkit.commands.deprecated import Renamed, renamed


def iter_queries(query, queries_file):
    """(id, text) of the queries to run: a file, the argument, or stdin lines for '-' / a pipe."""
    from llmkit.rag.evaluate.datasets import load_queries, parse_query_line

    if queries_file:
        yield from load_queries(queries_file)
        return
    if query is not None and query != "-":
        yield "1", query
        return
    if query is None and (sys.stdin is None or sys.stdin.isatty()):
        raise click.UsageError("no query given. Pass it as an argument, --queries FILE, or '-' / a pipe (one per line).")
    for n, line in enumerate(sys.stdin, 1):
        if line.strip():
            yield parse_query_line(line.rstrip("\n"), n, "standard input")


def describe(f) -> str:
    """'cc (dbsf) bm25 0.3, dense 0.7; expand 10; parents' for --explain (`f`: a resolved Fusion)."""
    how = f"rrf k {f.rrf_k}" if f.method == "rrf" else f"cc ({f.norm})"
    w = ", ".join(f"{n} {v:g}" for n, v in f.weights.items())
    return how + f" {w}" + (f"; expand {f.expand}" if f.expand else "") + ("; parents" if f.parents else "")


@renamed(Renamed("-m", "--llm"))
@click.command("query")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.argument("query", required=False)
@query_options(5, "Results per query.")
@click.option("--queries", "queries_file", type=click.Path(dir_okay=False),
              help="Batch: one query per line (text, TSV id<TAB>text, or JSONL).")
@click.option("--compress-to", default=0, type=int, help="Compress the returned texts to about N tokens (reports the ratio).")
@click.option("--explain", is_flag=True, help="Say what routing, expansion and rewriting decided (stderr).")
@click.option("--jsonl", is_flag=True, help="One JSON object per hit.")
def query_cmd(index_dir, query, opts, queries_file, compress_to, explain, jsonl):
    """Search INDEX_DIR for QUERY ('-' or a pipe: one query per line, models loaded once).

    \b
    llmkit rag query idx "how do I mount a filesystem" -k 5
    llmkit rag query idx "内存管理" --mode bm25 --filter collection=articles
    cut -f2 questions.tsv | llmkit rag query idx --jsonl > hits.jsonl
    """
    from llmkit.rag.answer.cite import compress_for, shown_texts
    from llmkit.rag.retrieve.pipeline import build_pipeline

    out = Output(jsonl=jsonl)
    # compression counts and drops the model's own tokens when a model is given (--llm)
    pipe, llm = build_pipeline(index_dir, opts, need_llm=bool(compress_to and opts.steps.llm_path))
    if explain:
        out.info(f"fusion ({pipe.fusion_source}): {describe(pipe.fusion)}")
    for qid, text in iter_queries(query, queries_file):
        res = pipe.run(text)
        if explain or not res.hits:
            for note in res.notes:
                out.info(f"[{qid}] {note}")
        if not res.hits:
            out.warn(f"query {qid}: no results.")
        texts = shown_texts(pipe, res.hits)
        if compress_to:
            c = compress_for(pipe, llm, text, texts, compress_to)
            texts = c.texts
            out.info(f"[{qid}] compressed {c.tokens_before} -> {c.tokens_after} tokens ({c.ratio:.1f}x)")
        prefix = f"[{qid}] " if queries_file or query in (None, "-") else ""
        _emit_hits(out, qid, text, res.hits, texts, prefix, compressed=bool(compress_to))
        if not jsonl:
            out.info(f"[{qid}] {len(res.hits)} hit(s) in {res.seconds * 1000:.1f} ms")


def _emit_hits(out: Output, qid: str, query: str, hits, texts, prefix: str, compressed: bool) -> None:
    """One query's hits with the texts shown for them: a JSON record each (the text included when it
    was compressed), or ranked text lines (`prefix` marks the query in a batch)."""
    from llmkit.rag.answer.cite import where

    for rank, (h, shown) in enumerate(zip(hits, texts), 1):
        if out.jsonl:
            rec = {"query_id": qid, "query": query, "rank": rank, **h.to_dict()}
            if compressed:
                rec["compressed_text"] = shown
            out.record(rec)
        else:
            ranks = ", ".join(f"{n} #{r}" for n, r in h.ranks.items())
            rr = f", rerank {h.rerank:.3f}" if h.rerank is not None else ""
            body = " ".join(shown.split())
            out.data(f"{prefix}{rank}. {where(h)}  (score {h.score:.4f}; {ranks}{rr})\n   "
                     f"{body[:400]}{'…' if len(body) > 400 else ''}")
