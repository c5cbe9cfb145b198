"""The options of `rag query`, `rag answer` and `rag ask-global`, in three bundles that build the
library's request dataclasses: fusion (`FusionRequest`), filters (`FilterOptions`) and LLM steps
(`LLMSteps`); `query_options` adds all three and the embedding override as one `req=QueryRequest`."""

from __future__ import annotations

import functools

import click

from llmkit.commands.rag.options import RUNTIMES, bundle


def _fusion(mode, weights, fusion, norm, rrf_k, graph, chunks, depth, expand, parents):
    from llmkit.rag.retrieve.options import FusionRequest

    return FusionRequest(mode=mode, weights=weights, method=fusion, norm=norm, rrf_k=rrf_k, graph=graph, depth=depth,
                         expand=expand, parents=parents, chunks=chunks)


fusion_options = bundle("fusion", [
    click.option("--mode", type=click.Choice(["bm25", "dense", "hybrid"]), default="hybrid", show_default=True),
    click.option("--weights", default=None, help="Weights per retriever, e.g. bm25=0.3,dense=0.7[,graph=0.2] "
                 "(default: the index's tuned choice, else bm25=1,dense=1)."),
    click.option("--fusion", type=click.Choice(["rrf", "cc"]), default=None,
                 help="rrf: weighted reciprocal rank fusion; cc: weighted sum of normalised scores "
                      "(default: tuned, else rrf)."),
    click.option("--norm", type=click.Choice(["minmax", "z", "dbsf", "tmm"]), default=None,
                 help="Score normalisation for --fusion cc (default: tuned, else minmax)."),
    click.option("--rrf-k", default=None, type=int, help="RRF constant k in w / (k + rank) (default: tuned, else 60)."),
    click.option("--graph", is_flag=True, help="Use the entity-graph list (index built with --graph): at the weight "
                 "`rag tune` chose for it, else only re-ranking inside the fused candidates."),
    click.option("--chunks", is_flag=True, help="Raw chunk hits instead of one hit per document (code: per "
                 "definition)."),
    click.option("--depth", default=100, show_default=True, type=int, help="Candidates per retriever before fusion."),
    click.option("--expand", default=None, type=int, help="Add N pseudo-relevance-feedback terms to the BM25 query "
                 "(default: tuned, else 0)."),
    click.option("--parents/--no-parents", default=None,
                 help="Return parent windows (small-to-big), fused without double counting (default: tuned, else no)."),
], _fusion)


def _filters(filters, collections, route, must, auto_must, synonyms):
    from llmkit.rag.retrieve.options import FilterOptions

    return FilterOptions(filters=tuple(filters), collections=tuple(collections), route=route, must=tuple(must),
                         auto_must=auto_must, synonyms=synonyms)


filter_options = bundle("filters", [
    click.option("--filter", "filters", multiple=True,
                 help="Metadata filter applied inside retrieval: FIELD=VALUE, FIELD!=V, FIELD>=V, FIELD<V, FIELD~TEXT; "
                      "* globs."),
    click.option("--collection", "collections", multiple=True, help="Search only this collection (repeatable)."),
    click.option("--route", is_flag=True, help="Pick the collection(s) that best match the query."),
    click.option("--must", multiple=True, help="Only chunks containing this word or phrase (repeatable)."),
    click.option("--auto-must", is_flag=True, help="Require quoted phrases, identifiers and names found in the query."),
    click.option("--synonyms", type=click.Path(dir_okay=False), help="Synonyms file ('term: a, b' or 'a, b, c' lines)."),
], _filters)


def _steps(rewrite, subqueries, hyde, llm_path, rerank, rerank_depth):
    from llmkit.rag.retrieve.options import LLMSteps

    return LLMSteps(rewrite=rewrite, subqueries=subqueries, hyde=hyde, llm_path=llm_path, rerank=rerank,
                    rerank_depth=rerank_depth)


llm_options = bundle("steps", [
    click.option("--rewrite", default=0, type=int, help="Also search N LLM paraphrases of the query (needs -m)."),
    click.option("--subqueries", is_flag=True, help="Also search LLM sub-queries of the question (needs -m)."),
    click.option("--hyde", is_flag=True, help="Embed the query with an LLM-written hypothetical answer (needs -m)."),
    click.option("--llm", "llm_path", help="Local GGUF model for --rewrite/--subqueries/--hyde/answer "
                 "(default: LLMKIT_MODEL or the packaged SmolLM2)."),
    click.option("--rerank", help="Re-rank the top candidates: cross-encoder:DIR or llm:MODEL.gguf."),
    click.option("--rerank-depth", default=20, show_default=True, type=int),
], _steps)


def query_options(f):
    """Options shared by query, answer and ask-global: fusion, filters and LLM steps, plus the
    embedding model override, passed as one `req=QueryRequest(...)`."""
    @functools.wraps(f)
    def compose(*args, fusion, filters, steps, model, runtime, **kw):
        from llmkit.rag.retrieve.options import QueryRequest

        return f(*args, req=QueryRequest(fusion, filters, steps, model, runtime), **kw)

    g = click.option("--runtime", type=click.Choice(RUNTIMES), default="onnx", show_default=True,
                     help="Embedding runtime for queries (ONNX Runtime needs no torch: fast start).")(compose)
    g = click.option("--model", help="Embedding model override (must match the index's dimension).")(g)
    return fusion_options(filter_options(llm_options(g)))
