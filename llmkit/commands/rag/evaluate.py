"""`rag eval`: measure retrieval configurations on judged queries (and the deprecated `rag cranfield`,
now scripts/cranfield.py)."""

from __future__ import annotations

import click

from llmkit.commands._common import Output
from llmkit.commands.rag.options import judged_option
from llmkit.commands.deprecated import Renamed, renamed
from llmkit.commands.plot_option import plot_option


def parse_config(spec: str, llm_path: str | None = None):
    """A --config value as the library's QueryOptions; a spec it cannot read is a usage mistake."""
    from llmkit.errors import OptionError
    from llmkit.rag.retrieve.options import parse_config as parse

    try:
        return parse(spec, llm_path)
    except OptionError as e:
        raise click.BadParameter(e.spelled({"config": "configuration", "weights": "weights like"}),
                                 param_hint="--config") from None


@renamed(Renamed("-m", "--llm"), Renamed("-c", "--config"))
@click.command("eval")
@click.argument("index_dir", type=click.Path(file_okay=False))
@judged_option(required=True, queries_help="Queries (JSONL id/text or TSV).",
               qrels_help="TREC qrels: query 0 doc relevance.")
@click.option("--config", "configs", multiple=True,
              help="MODE[:bm25=W,dense=W[,graph=W]][+fusion=rrf|cc][+norm=N][+rrf-k=K][+expand[=N]][+parents]"
                   "[+graph[=W]][+chunks][+rerank=SPEC][+hyde][+rewrite=N]; MODE is bm25, dense, hybrid (built-in fusion) or "
                   "tuned (the index's `rag tune` choice); repeatable (default: bm25, dense, hybrid, and tuned "
                   "when the index has one).")
@click.option("--recall-k", default=100, show_default=True, type=click.IntRange(min=1),
              help="Recall is measured over this many hits per query.")
@click.option("--llm", "llm_path", help="Local GGUF model, or OpenAI-compatible chat endpoint URL[#MODEL], for "
              "configurations that need one.")
@click.option("--limit", default=0, type=int, help="Only the first N queries.")
@click.option("--jsonl", is_flag=True, help="One JSON object per configuration (with its recall curve).")
@plot_option("nDCG@10 per configuration and each one's Recall@k curve")
def eval_cmd(index_dir, judged, configs, recall_k, llm_path, limit, jsonl, plot_path):
    """Evaluate retrieval configurations on judged queries: nDCG@10, Recall@k, MRR, latency.

    \b
    python scripts/cranfield.py -o cran     # the Cranfield copy in examples/data/cranfield (or pass a directory)
    llmkit rag index cran-idx cran/docs.jsonl
    llmkit rag eval cran-idx --queries cran/queries.jsonl --qrels cran/qrels.txt --config bm25 --config dense --config hybrid
    llmkit rag eval cran-idx --queries cran/queries.jsonl --qrels cran/qrels.txt --plot eval.svg
    """
    from rich.table import Table

    from llmkit.rag.evaluate.datasets import load_qrels, load_queries
    from llmkit.rag.evaluate.metrics import default_configs, evaluate_configs

    out = Output(jsonl=jsonl)
    queries = load_queries(judged[0])[:limit or None]
    qrels = load_qrels(judged[1])
    default = default_configs(index_dir)  # (also refuses a missing index before anything else)
    specs = configs or default
    rows = []
    for row in evaluate_configs(index_dir, ((s, parse_config(s, llm_path)) for s in specs), queries, qrels, recall_k):
        rows.append(row)
        if jsonl:
            out.record(row.to_dict())
        else:
            out.info(f"{row.config}: nDCG@10 {row.ndcg10:.4f}")
    if plot_path:
        from llmkit.plot import draw
        from llmkit.rag.evaluate.metrics import eval_chart

        draw(plot_path, eval_chart(rows), columns=2)
    if not jsonl:
        t = Table(title=f"{rows[0].queries} judged queries")
        for col in ("config", "nDCG@10", f"Recall@{recall_k}", "MRR", "ms/query"):
            t.add_column(col, justify="left" if col == "config" else "right")
        for r in rows:
            t.add_row(r.config, f"{r.ndcg10:.4f}", f"{r.recall:.4f}", f"{r.mrr:.4f}", f"{r.latency_ms:.1f}")
        out.table(t)


@click.command("cranfield", hidden=True)
@click.argument("src", type=click.Path(file_okay=False, exists=True))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Directory to write.")
def cranfield_cmd(src, out_dir):
    """Convert the Cranfield collection in SRC into docs.jsonl, queries.jsonl and qrels.txt (deprecated:
    scripts/cranfield.py)."""
    from llmkit.commands.deprecated import REMOVED_IN
    from llmkit.rag.evaluate.datasets import import_cranfield

    click.echo(f"Note: `llmkit rag cranfield` leaves the CLI in llmkit {REMOVED_IN}; use `python scripts/cranfield.py "
               "SRC -o DIR` (same files).", err=True)
    counts = import_cranfield(src, out_dir)
    Output().info(f"{out_dir}: {counts['docs']} documents, {counts['queries']} queries, {counts['judgments']} judgments")
