"""Options shared by the `rag` commands, bundled in decorators that build the library's option
dataclasses: a command receives `read=ReadOptions(...)`, `chunk=ChunkOptions(...)`, `embed=...`,
`store=...`, `opts=QueryOptions(...)` or `judged=(queries, qrels)` instead of the loose values.

`FLAGS` spells the library's option names as this CLI's flags, for library errors that name an
option (`llmkit.errors.OptionError`).
"""

from __future__ import annotations

import click

from llmkit.commands._common import bundle
from llmkit.commands.deprecated import REMOVED_IN, Renamed

FLAGS = {"parent_size": "--parent-size", "csv_meta": "--csv-meta", "model": "--model", "runtime": "--runtime",
         "ray": "--ray", "store": "--store", "no_wait": "--no-wait", "query_prompt": "--query-prompt",
         "passage_prompt": "--passage-prompt", "weights": "--weights", "k": "-k",
         "depth": "--depth", "rewrite": "--rewrite", "subqueries": "--subqueries", "hyde": "--hyde", "llm": "--llm",
         "mode": "--mode", "rrf_k": "--rrf-k", "rerank": "--rerank", "compress_to": "--compress-to",
         "queries": "--queries", "qrels": "--qrels", "batch_size": "--batch-size", "tokens": "--tokens",
         "analysis": "--analysis", "method": "--fusion", "norm": "--norm", "expand": "--expand",
         "rerank_depth": "--rerank-depth", "dedupe": "--dedupe", "ray_workers": "--ray workers=",
         "ray_batch": "--ray batch=", "graph_llm": "--graph-llm",
         "embed_precision": "--embed-precision", "include": "--glob"}
RUNTIMES = ("onnx", "torch")


# -- rag index ---------------------------------------------------------------------------------------

# old spellings of rag index flags that are plain renames (deprecated.renamed rewrites them)
INDEX_RENAMES = (Renamed("--stem", "--analysis=porter", flag=True), Renamed("--no-dedupe", "--dedupe=off", flag=True),
                 Renamed("--near-dup", "--dedupe"), Renamed("--include", "--glob"))


def _old_spelling(old: str, new: str):
    """A hidden option for an old spelling that a rename cannot express (its value moves into another
    flag's): it still works until the next minor version, with the same one-line note as a rename."""
    def note(ctx, param, value):
        noted = ctx.meta.setdefault("llmkit.old_spellings", set())  # once per command run
        if value not in (None, ()) and old not in noted:
            noted.add(old)
            click.echo(f"Note: `{ctx.command_path} {old}` is now `{new}`; the old spelling works until llmkit "
                       f"{REMOVED_IN}.", err=True)
        return value

    return note


def _sizes(ctx, param, value: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in (value or "").split(",") if s.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of sizes.", param_hint="--size") from None


def _chunk(chunker, sizes, tokens, overlap, parent_size, dedupe, no_boilerplate):
    from llmkit.rag.chunk.dedupe import dedupe_setting
    from llmkit.rag.chunk.sections import ChunkOptions

    keep, threshold = dedupe_setting(dedupe)
    return ChunkOptions(chunker=chunker, sizes=sizes, tokens=tokens, overlap=overlap, parent_size=parent_size,
                        dedupe=keep, near_threshold=threshold, boilerplate=not no_boilerplate)


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
    click.option("--dedupe", default="0.9", show_default=True, metavar="SIMILARITY|off",
                 help="Drop exact duplicate chunks and near-duplicates from this MinHash Jaccard similarity on; "
                      "off keeps every chunk (was --near-dup / --no-dedupe)."),
    click.option("--no-boilerplate", is_flag=True,
                 help="Keep lines repeated across many documents (headers, footers)."),
], _chunk)


def _ray(value: str | None, old_workers: int | None, old_batch: int | None) -> tuple[str | None, int, int]:
    """--ray ADDRESS[,workers=N][,batch=N] (bare --ray: a local cluster) -> (address, workers, batch)."""
    if value is None:
        return None, old_workers or 2, old_batch or 64
    address, *parts = value.split(",")
    got = {"workers": old_workers or 2, "batch": old_batch or 64}
    for part in parts:
        name, _, n = part.partition("=")
        if name.strip() not in got or not n.strip().lstrip("-").isdigit():
            raise click.BadParameter(f"cannot read {part!r} in {value!r}; write ADDRESS[,workers=N][,batch=N].",
                                     param_hint="--ray")
        got[name.strip()] = int(n)
    return address.strip() or "local", got["workers"], got["batch"]


def _embed(model, embed_precision, runtime, query_prompt, passage_prompt, ray_spec, ray_workers, ray_batch):
    from llmkit.rag.embed.models import EmbedOptions

    address, workers, batch = _ray(ray_spec, ray_workers, ray_batch)
    return EmbedOptions(model=model, runtime=runtime, precision=embed_precision, query_prompt=query_prompt,
                        passage_prompt=passage_prompt, ray=address, ray_workers=workers, ray_batch=batch)


embed_options = bundle("embed", [
    click.option("-m", "--model", help="Embedding model: a sentence-transformers directory, an embedding GGUF run by "
                 "llama.cpp, or an OpenAI-compatible endpoint URL[#MODEL] (/v1/embeddings; key in LLMKIT_API_KEY) "
                 "(default: LLMKIT_EMBED_URL, else the packaged all-MiniLM-L6-v2)."),
    click.option("--embed-precision", type=click.Choice(["fp32", "bf16", "int8"]), default=None,
                 help="Embedding precision, fixed when the index is created (default: bf16 where the CPU multiplies "
                      "bf16 natively, e.g. Intel AMX, else fp32): bf16 embeds passages through OpenVINO within "
                      "rounding of fp32; int8 indexes faster at a small loss (ONNX Runtime dynamic int8)."),
    click.option("--runtime", type=click.Choice(RUNTIMES), default="onnx", show_default=True,
                 help="Embedding runtime: ONNX Runtime over a cached export of the model, or sentence-transformers."),
    click.option("--query-prompt", default="", help="Instruction prefix for queries (e.g. 'query: ' for E5)."),
    click.option("--passage-prompt", default="", help="Instruction prefix for passages (e.g. 'passage: ')."),
    click.option("--ray", "ray_spec", is_flag=False, flag_value="local", default=None,
                 metavar="ADDRESS[,workers=N][,batch=N]",
                 help="Embed new chunks with Ray Data on a Ray cluster (or auto); bare --ray starts a local one. "
                      "workers: embedding actors, one model each (default 2); batch: passages per map_batches "
                      "batch (default 64)."),
    click.option("--ray-workers", type=int, hidden=True, callback=_old_spelling("--ray-workers N", "--ray ADDRESS,workers=N")),
    click.option("--ray-batch", type=int, hidden=True, callback=_old_spelling("--ray-batch N", "--ray ADDRESS,batch=N")),
], _embed)


def _read(text_field, id_field, globs, exclude, code_size, csv_meta, no_gitignore):
    from llmkit.rag.read.files import ReadOptions

    return ReadOptions(text_field=text_field, id_field=id_field,
                       include=tuple(g for g in globs if not g.startswith("!")),
                       exclude=tuple(g[1:] for g in globs if g.startswith("!")) + tuple(exclude),
                       gitignore=not no_gitignore, code_size=code_size,
                       csv_meta=tuple(c.strip() for c in csv_meta.split(",") if c.strip()))


read_options = bundle("read", [
    click.option("--text-field", default="text", show_default=True, help="JSONL: the field holding the text."),
    click.option("--id-field", default="id", show_default=True, help="JSONL: the field holding the document id."),
    click.option("--glob", "globs", multiple=True,
                 help="Directories: only files matching GLOB; !GLOB skips files matching it (repeatable; was "
                      "--include / --exclude)."),
    click.option("--exclude", multiple=True, hidden=True, callback=_old_spelling("--exclude GLOB", "--glob '!GLOB'")),
    click.option("--code-size", default=0, type=int,
                 help="Characters per source-code chunk (a definition up to this size stays whole). Default: the "
                      "embedding model's window in its tokens (with --size: 1500 characters)."),
    click.option("--csv-meta", default="", help="CSV/TSV: comma-separated columns kept as metadata (one row per chunk)."),
    click.option("--no-gitignore", is_flag=True, help="Index files that .gitignore files exclude."),
], _read)


def _store(analysis, index_type, graph, graph_llm, store):
    from llmkit.rag.index.build import StoreOptions

    kind, _, dtype = index_type.partition(",")
    if kind not in ("auto", "flat", "hnsw") or dtype not in ("", "float32", "float16"):
        raise click.BadParameter(f"{index_type!r} is not TYPE[,DTYPE]: TYPE auto, flat or hnsw, DTYPE float32 or "
                                 "float16 (e.g. hnsw,float16).", param_hint="--index-type")
    return StoreOptions(store=store, index_type=kind, vector_dtype=dtype or None, analysis=analysis, graph=graph,
                        graph_llm=graph_llm)


store_options = bundle("store", [
    click.option("--analysis", type=click.Choice(["english", "plain", "porter"]), default=None,
                 help="BM25 analysis, chosen when the index is created: english (default: English chunks stemmed, "
                      "stop words dropped, other languages plain), plain (lower-cased words, CJK bigrams), porter "
                      "(every word Porter-stemmed; was --stem)."),
    click.option("--index-type", default="auto", show_default=True, metavar="auto|flat|hnsw[,float16]",
                 help="Vector index: exact flat search up to 100k chunks, faiss HNSW beyond (auto). ,float16 stores "
                      "the vectors in half precision (half the disk and page cache), kept by later runs until "
                      ",float32 is given."),
    click.option("--graph", is_flag=True, help="Keep an entity graph for `rag query --graph` and `rag ask-global` "
                 "(noun phrases, names, identifiers, CJK terms; index-wide once enabled)."),
    click.option("--graph-llm", help="Local GGUF model that also lists entities per chunk (slow; implies --graph)."),
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
