"""The options of `rag query`, `rag answer` and `rag ask-global`: `query_options` adds -k, the fusion,
filter and LLM-step flags and the embedding override, and passes them as one `opts=QueryOptions(...)`
(the library's dataclass, checked by the library)."""

from __future__ import annotations

import click

from llmkit.commands.rag.options import RUNTIMES, bundle

FUSION = [
    click.option("--mode", type=click.Choice(["bm25", "dense", "hybrid"]), default="hybrid", show_default=True),
    click.option("--weights", default=None, help="Weights per retriever, e.g. bm25=0.3,dense=0.7[,graph=0.2] "
                 "(default: the index's tuned choice, else bm25=1,dense=1)."),
    click.option("--fusion", "method", type=click.Choice(["rrf", "cc"]), default=None,
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
]
FILTERS = [
    click.option("--filter", "filters", multiple=True,
                 help="Metadata filter applied inside retrieval: FIELD=VALUE, FIELD!=V, FIELD>=V, FIELD<V, FIELD~TEXT; "
                      "* globs."),
    click.option("--collection", "collections", multiple=True, help="Search only this collection (repeatable)."),
    click.option("--route", is_flag=True, help="Pick the collection(s) that best match the query."),
    click.option("--must", multiple=True, help="Only chunks containing this word or phrase (repeatable)."),
    click.option("--auto-must", is_flag=True, help="Require quoted phrases, identifiers and names found in the query."),
    click.option("--synonyms", type=click.Path(dir_okay=False), help="Synonyms file ('term: a, b' or 'a, b, c' lines)."),
]
STEPS = [
    click.option("--rewrite", default=0, type=int, help="Also search N LLM paraphrases of the query (needs --llm)."),
    click.option("--subqueries", is_flag=True, help="Also search LLM sub-queries of the question (needs --llm)."),
    click.option("--hyde", is_flag=True, help="Embed the query with an LLM-written hypothetical answer (needs --llm)."),
    click.option("--llm", "llm_path", help="Local GGUF model, or OpenAI-compatible chat endpoint URL[#MODEL], for "
                 "--rewrite/--subqueries/--hyde/answer (default: LLMKIT_LLM_URL, else LLMKIT_MODEL or the packaged "
                 "SmolLM2)."),
    click.option("--rerank", help="Re-rank the top candidates: a cross-encoder FILE.gguf (llama.cpp), "
                 "cross-encoder:DIR (needs sentence-transformers) or llm:MODEL.gguf."),
    click.option("--rerank-depth", default=20, show_default=True, type=int),
]
EMBED = [
    click.option("--model", help="Embedding model override (must match the index's dimension); for an index "
                 "embedded through an endpoint, the same model served at URL[#MODEL]."),
    click.option("--runtime", type=click.Choice(RUNTIMES), default="onnx", show_default=True,
                 help="Embedding runtime for queries (ONNX Runtime needs no torch: fast start)."),
]


def _options(k, mode, weights, method, norm, rrf_k, graph, chunks, depth, expand, parents, filters, collections,
             route, must, auto_must, synonyms, rewrite, subqueries, hyde, llm_path, rerank, rerank_depth, model,
             runtime):
    from llmkit.rag.retrieve.options import FilterOptions, Fusion, LLMSteps, QueryOptions, parse_weights

    fusion = Fusion(method=method, rrf_k=rrf_k, weights=parse_weights(weights) if weights else None, norm=norm,
                    expand=expand, parents=parents)
    return QueryOptions(k=k, mode=mode, fusion=fusion, graph=graph, chunks=chunks, depth=depth,
                        filters=FilterOptions(tuple(filters), tuple(collections), route, tuple(must), auto_must,
                                              synonyms),
                        steps=LLMSteps(rewrite, subqueries, hyde, llm_path, rerank, rerank_depth),
                        model=model, runtime=runtime)


def query_options(k_default: int, k_help: str):
    """-k and every query option, passed to the command as `opts=QueryOptions(...)`."""
    k = click.option("-k", default=k_default, show_default=True, type=int, help=k_help)
    return bundle("opts", [k, *FUSION, *FILTERS, *STEPS, *EMBED], _options)
