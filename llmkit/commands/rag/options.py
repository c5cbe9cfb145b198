"""Options shared by the `rag` commands, bundled in decorators that build the library's option
dataclasses: a command receives `read=ReadOptions(...)`, `chunk=ChunkOptions(...)`, `embed=...`,
`store=...`, `opts=QueryOptions(...)` or `judged=(queries, qrels)` instead of the loose values.

`FLAGS` spells the library's option names as this CLI's flags, for library errors that name an
option (`llmkit.errors.OptionError`).
"""

from __future__ import annotations

import functools

import click

FLAGS = {"parent_size": "--parent-size", "csv_meta": "--csv-meta", "model": "--model", "runtime": "--runtime",
         "ray": "--ray", "store": "--store", "no_wait": "--no-wait", "query_prompt": "--query-prompt",
         "passage_prompt": "--passage-prompt", "stem": "--stem", "weights": "--weights", "k": "-k",
         "depth": "--depth", "rewrite": "--rewrite", "subqueries": "--subqueries", "hyde": "--hyde", "llm": "--llm",
         "mode": "--mode", "rrf_k": "--rrf-k", "rerank": "--rerank", "compress_to": "--compress-to",
         "queries": "--queries", "qrels": "--qrels", "batch_size": "--batch-size", "tokens": "--tokens",
         "analysis": "--analysis", "method": "--fusion", "norm": "--norm", "expand": "--expand",
         "rerank_depth": "--rerank-depth"}
RUNTIMES = ("onnx", "torch")


def bundle(name: str, options: list, build):
    """A decorator adding `options` to a command and passing their values as one keyword argument
    `name` = build(**values) instead."""
    def probe():
        pass

    for o in options:
        o(probe)
    keys = [p.name for p in probe.__click_params__]

    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, **kw):
            kw[name] = build(**{k: kw.pop(k) for k in keys})
            return f(*args, **kw)

        for o in reversed(options):
            wrapper = o(wrapper)
        return wrapper

    return deco


# -- rag index ---------------------------------------------------------------------------------------

def _sizes(ctx, param, value: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in (value or "").split(",") if s.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of sizes.", param_hint="--size") from None


def _chunk(chunker, sizes, tokens, overlap, parent_size, no_dedupe, near_dup, no_boilerplate):
    from llmkit.rag.chunk.sections import ChunkOptions

    return ChunkOptions(chunker=chunker, sizes=sizes, tokens=tokens, overlap=overlap, parent_size=parent_size,
                        dedupe=not no_dedupe, near_threshold=near_dup, boilerplate=not no_boilerplate)


chunk_options = bundle("chunk", [
    click.option("--chunker", type=click.Choice(["recursive", "window"]), default="recursive", show_default=True,
                 help="recursive: paragraph > line > sentence > word boundaries (sizes in characters); "
                      "window: fixed windows of words/CJK characters."),
    click.option("--size", "sizes", default=None, callback=_sizes,
                 help="Chunk size in characters; several comma-separated sizes index every text at each size (e.g. "
                      "300,1200). Default: chunks sized in the embedding model's tokens (--tokens)."),
    click.option("--tokens", default=0, type=int,
                 help="Chunk size in the embedding model's tokens (default: its window, 254 for all-MiniLM-L6-v2); "
                      "a section that fits is one chunk. An existing collection keeps its recorded chunking."),
    click.option("--overlap", default=None, type=int,
                 help="Overlap between consecutive chunks: tokens (default an eighth of the size), or with --size "
                      "characters (default 100; recursive: at most this many, whole sentences else whole words; "
                      "window: exactly this many units)."),
    click.option("--parent-size", default=3000, show_default=True, type=int,
                 help="Small-to-big: chunks are searched, their parent window (this many characters, 0 = whole "
                      "section) is returned with --parents."),
    click.option("--no-dedupe", is_flag=True, help="Keep exact and near-duplicate chunks."),
    click.option("--near-dup", default=0.9, show_default=True, type=float,
                 help="MinHash Jaccard threshold for near-duplicates."),
    click.option("--no-boilerplate", is_flag=True,
                 help="Keep lines repeated across many documents (headers, footers)."),
], _chunk)


def _embed(model, embed_precision, runtime, query_prompt, passage_prompt, ray_address, ray_workers, ray_batch):
    from llmkit.rag.embed.models import EmbedOptions

    if ray_workers < 1 or ray_batch < 1:
        raise click.BadParameter("--ray-workers and --ray-batch must be at least 1.")
    return EmbedOptions(model=model, runtime=runtime, precision=embed_precision, query_prompt=query_prompt,
                        passage_prompt=passage_prompt, ray=ray_address, ray_workers=ray_workers, ray_batch=ray_batch)


embed_options = bundle("embed", [
    click.option("--model", help="Embedding model: a local sentence-transformers directory (default: packaged "
                 "all-MiniLM-L6-v2)."),
    click.option("--embed-precision", type=click.Choice(["fp32", "int8"]), default=None,
                 help="Embedding precision, fixed when the index is created (default fp32): int8 indexes ~2x faster "
                      "at a small loss (ONNX Runtime dynamic int8, per-channel weights)."),
    click.option("--runtime", type=click.Choice(RUNTIMES), default="onnx", show_default=True,
                 help="Embedding runtime: ONNX Runtime over a cached export of the model, or sentence-transformers."),
    click.option("--query-prompt", default="", help="Instruction prefix for queries (e.g. 'query: ' for E5)."),
    click.option("--passage-prompt", default="", help="Instruction prefix for passages (e.g. 'passage: ')."),
    click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
                 help="Embed new chunks with Ray Data on a Ray cluster: --ray ADDRESS (or auto); bare --ray starts a "
                      "local one."),
    click.option("--ray-workers", default=2, show_default=True, type=int,
                 help="With --ray: embedding actors (one model each)."),
    click.option("--ray-batch", default=64, show_default=True, type=int,
                 help="With --ray: passages per map_batches batch."),
], _embed)


def _read(text_field, id_field, include, exclude, code_size, csv_meta, no_gitignore):
    from llmkit.rag.read.files import ReadOptions

    return ReadOptions(text_field=text_field, id_field=id_field, include=include, exclude=exclude,
                       gitignore=not no_gitignore, code_size=code_size,
                       csv_meta=tuple(c.strip() for c in csv_meta.split(",") if c.strip()))


read_options = bundle("read", [
    click.option("--text-field", default="text", show_default=True, help="JSONL: the field holding the text."),
    click.option("--id-field", default="id", show_default=True, help="JSONL: the field holding the document id."),
    click.option("--include", multiple=True, help="Directories: only files matching this glob (repeatable)."),
    click.option("--exclude", multiple=True, help="Directories: skip files matching this glob (repeatable)."),
    click.option("--code-size", default=0, type=int,
                 help="Characters per source-code chunk (a definition up to this size stays whole). Default: the "
                      "embedding model's window in its tokens (with --size: 1500 characters)."),
    click.option("--csv-meta", default="", help="CSV/TSV: comma-separated columns kept as metadata (one row per chunk)."),
    click.option("--no-gitignore", is_flag=True, help="Index files that .gitignore files exclude."),
], _read)


def _store(analysis, stem, index_type, graph, graph_llm, store):
    from llmkit.rag.index.build import StoreOptions

    llm = None
    if graph_llm:
        from llmkit.rag.llm import LocalLLM

        llm = LocalLLM(graph_llm)
    return StoreOptions(store=store, index_type=index_type, stem=stem, analysis=analysis, graph=graph or bool(graph_llm),
                        graph_llm=llm)


store_options = bundle("store", [
    click.option("--analysis", type=click.Choice(["english", "plain", "porter"]), default=None,
                 help="BM25 analysis, chosen when the index is created: english (default: English chunks stemmed, "
                      "stop words dropped, other languages plain), plain (lower-cased words, CJK bigrams), porter "
                      "(every word Porter-stemmed)."),
    click.option("--stem", is_flag=True, help="Same as --analysis porter."),
    click.option("--index-type", type=click.Choice(["auto", "flat", "hnsw"]), default="auto", show_default=True,
                 help="faiss index: exact flat search up to 100k chunks, HNSW beyond (auto)."),
    click.option("--graph", is_flag=True, help="Keep an entity graph for `rag query --graph` and `rag ask-global` "
                 "(noun phrases, names, identifiers, CJK terms; index-wide once enabled)."),
    click.option("--graph-llm", help="Local GGUF model that also lists entities per chunk (slow; with --graph)."),
    click.option("--store", help="Where the vectors live, chosen when the index is created: faiss (default, in "
                 "INDEX_DIR), milvus+local:PATH.db (embedded Milvus) or milvus://HOST:PORT (a Milvus server; token in "
                 "MILVUS_TOKEN)."),
], _store)


def _meta(ctx, param, values) -> dict:
    out = {}
    for kv in values:
        k, sep, v = kv.partition("=")
        if not sep or not k.strip():
            raise click.BadParameter(f"{kv!r} is not KEY=VALUE.", param_hint="--meta")
        out[k.strip()] = v
    return out


meta_option = click.option("--meta", "meta", multiple=True, callback=_meta,
                           help="KEY=VALUE metadata added to every chunk of this run (repeatable).")


# -- judged queries ----------------------------------------------------------------------------------

def judged_option(required: bool = False, queries_help: str = "Judged queries (JSONL id/text or TSV); with --qrels.",
                  qrels_help: str = "TREC qrels for --queries."):
    """--queries FILE and --qrels FILE, which go together, as `judged=(queries file, qrels file)` (None
    when neither is given)."""
    def build(queries_file, qrels):
        if bool(queries_file) != bool(qrels):
            raise click.UsageError("--queries and --qrels go together.")
        return (queries_file, qrels) if queries_file else None

    return bundle("judged", [
        click.option("--queries", "queries_file", required=required, type=click.Path(dir_okay=False),
                     help=queries_help),
        click.option("--qrels", required=required, type=click.Path(dir_okay=False), help=qrels_help),
    ], build)
