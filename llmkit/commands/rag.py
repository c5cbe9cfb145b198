"""`llmkit rag`: index documents and query them with BM25, dense vectors and hybrid RRF."""

from __future__ import annotations

import sys

import click

from llmkit.commands._common import Output, progress_bar


@click.group("rag")
def group():
    """Index documents; query with BM25 + dense retrieval; answer with a local model; evaluate."""


@group.command("index")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.argument("inputs", nargs=-1)
@click.option("--collection", default="default", show_default=True, help="Named collection inside the index.")
@click.option("--chunker", type=click.Choice(["recursive", "window"]), default="recursive", show_default=True,
              help="recursive: paragraph > line > sentence > word boundaries (sizes in characters); "
                   "window: fixed windows of words/CJK characters.")
@click.option("--size", "sizes", default="800", show_default=True,
              help="Chunk size; several comma-separated sizes index every text at each size (e.g. 300,1200).")
@click.option("--overlap", default=100, show_default=True, type=int,
              help="Overlap between consecutive chunks (recursive: at most this many characters, whole sentences "
                   "else whole words; window: exactly this many units).")
@click.option("--parent-size", default=3000, show_default=True, type=int,
              help="Small-to-big: chunks are searched, their parent window (this many characters, 0 = whole "
                   "section) is returned with --parents.")
@click.option("--model", help="Embedding model: a local sentence-transformers directory (default: packaged all-MiniLM-L6-v2).")
@click.option("--embed-precision", type=click.Choice(["fp32", "int8"]), default=None,
              help="Embedding precision, fixed when the index is created (default fp32): int8 indexes ~2x faster "
                   "at a small loss (ONNX Runtime dynamic int8, per-channel weights).")
@click.option("--runtime", type=click.Choice(["onnx", "torch"]), default="onnx", show_default=True,
              help="Embedding runtime: ONNX Runtime over a cached export of the model, or sentence-transformers.")
@click.option("--query-prompt", default="", help="Instruction prefix for queries (e.g. 'query: ' for E5).")
@click.option("--passage-prompt", default="", help="Instruction prefix for passages (e.g. 'passage: ').")
@click.option("--meta", "meta", multiple=True, help="KEY=VALUE metadata added to every chunk of this run (repeatable).")
@click.option("--text-field", default="text", show_default=True, help="JSONL: the field holding the text.")
@click.option("--id-field", default="id", show_default=True, help="JSONL: the field holding the document id.")
@click.option("--include", multiple=True, help="Directories: only files matching this glob (repeatable).")
@click.option("--exclude", multiple=True, help="Directories: skip files matching this glob (repeatable).")
@click.option("--no-dedupe", is_flag=True, help="Keep exact and near-duplicate chunks.")
@click.option("--near-dup", default=0.9, show_default=True, type=float, help="MinHash Jaccard threshold for near-duplicates.")
@click.option("--no-boilerplate", is_flag=True, help="Keep lines repeated across many documents (headers, footers).")
@click.option("--stem", is_flag=True, help="Porter-stem English words for BM25 (chosen when the index is created).")
@click.option("--index-type", type=click.Choice(["auto", "flat", "hnsw"]), default="auto", show_default=True,
              help="faiss index: exact flat search up to 100k chunks, HNSW beyond (auto).")
@click.option("--code-size", default=1500, show_default=True, type=int,
              help="Characters per source-code chunk (a definition up to this size stays whole).")
@click.option("--csv-meta", default="", help="CSV/TSV: comma-separated columns kept as metadata (one row per chunk).")
@click.option("--no-gitignore", is_flag=True, help="Index files that .gitignore files exclude.")
@click.option("--graph", is_flag=True, help="Keep an entity graph for `rag query --graph` and `rag answer --global` "
              "(noun phrases, names, identifiers, CJK terms; index-wide once enabled).")
@click.option("--graph-llm", help="Local GGUF model that also lists entities per chunk (slow; with --graph).")
@click.option("--store", help="Where the vectors live, chosen when the index is created: faiss (default, in INDEX_DIR), "
              "milvus+local:PATH.db (embedded Milvus) or milvus://HOST:PORT (a Milvus server; token in MILVUS_TOKEN).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
              help="Embed new chunks with Ray Data on a Ray cluster: --ray ADDRESS (or auto); bare --ray starts a local one.")
@click.option("--ray-workers", default=2, show_default=True, type=int, help="With --ray: embedding actors (one model each).")
@click.option("--ray-batch", default=64, show_default=True, type=int, help="With --ray: passages per map_batches batch.")
@click.option("--no-wait", is_flag=True, help="Fail at once if another process is writing this index (default: wait).")
@click.option("--json", "as_json", is_flag=True, help="Print the indexing report as JSON on stdout.")
def index_cmd(index_dir, inputs, collection, chunker, sizes, overlap, parent_size, model, embed_precision, runtime,
              query_prompt,
              passage_prompt, meta, text_field, id_field, include, exclude, no_dedupe, near_dup, no_boilerplate,
              stem, index_type, code_size, csv_meta, no_gitignore, graph, graph_llm, store, ray_address, ray_workers,
              ray_batch, no_wait, as_json):
    """Add INPUTS (files, directories, '-') to INDEX_DIR, updating only what changed.

    \b
    Formats: .txt .md (headings -> sections, front matter) .rst .html .jsonl .pdf .docx
    .epub .csv/.tsv (rows, header kept) .ipynb (cells) and source code (.py .js .ts .go
    .rs .java .c .cpp .cs .rb .php .swift .scala .kt .sh .sql .lua: chunks at definitions,
    with symbol and line numbers). Directories honour .gitignore; files of other types
    are listed as skipped. Re-running updates changed files (content hash), removes files
    that disappeared under the given paths, and embeds only new text.
    \b
    llmkit rag index idx docs/ --collection articles
    llmkit rag index idx src/ --include '*.md' --collection code --meta team=infra
    llmkit rag index idx docs/ --store milvus://milvus.internal:19530 --ray auto
    """
    from llmkit.commands._common import resolve_inputs
    from llmkit.rag.store import IndexOptions, build

    out = Output()
    inputs = resolve_inputs(inputs, "documents")
    try:
        size_list = tuple(int(s) for s in sizes.split(",") if s.strip())
    except ValueError:
        raise click.BadParameter(f"{sizes!r} is not a comma-separated list of sizes.", param_hint="--size") from None
    meta_d = {}
    for kv in meta:
        k, sep, v = kv.partition("=")
        if not sep or not k.strip():
            raise click.BadParameter(f"{kv!r} is not KEY=VALUE.", param_hint="--meta")
        meta_d[k.strip()] = v
    opts = IndexOptions(collection=collection, chunker=chunker, sizes=size_list, overlap=overlap,
                        parent_size=parent_size, model=model, runtime=runtime, precision=embed_precision,
                        query_prompt=query_prompt, passage_prompt=passage_prompt,
                        meta=meta_d, text_field=text_field, id_field=id_field, include=include, exclude=exclude,
                        dedupe=not no_dedupe, near_threshold=near_dup, boilerplate=not no_boilerplate,
                        stem=stem, index_type=index_type, code_size=code_size,
                        csv_meta=tuple(c.strip() for c in csv_meta.split(",") if c.strip()),
                        gitignore=not no_gitignore, graph=graph or bool(graph_llm), store=store, ray=ray_address,
                        ray_workers=ray_workers, ray_batch=ray_batch)
    if ray_workers < 1 or ray_batch < 1:
        raise click.BadParameter("--ray-workers and --ray-batch must be at least 1.")
    if graph_llm:
        from llmkit.rag.llm import LocalLLM

        opts.graph_llm = LocalLLM(graph_llm)
    stdin_data = sys.stdin.buffer.read() if "-" in inputs else None
    with progress_bar("indexing") as bar:
        report = build(index_dir, list(inputs), opts, stdin_data=stdin_data,
                       progress=lambda stage, done, total: bar(done, total, stage), wait=not no_wait,
                       on_wait=lambda msg: out.info(msg + " ..."))
    if report.skipped:
        from llmkit.rag.store import summarize_skipped

        out.warn("skipped " + summarize_skipped(report.skipped))
    if report.code_fallbacks:
        out.warn("code cut at line boundaries instead of definitions: " + ", ".join(
            f"{n} file(s) ({why})" for why, n in report.code_fallbacks.items()))
    if as_json:
        out.json(report.to_dict())
        return
    r = report
    out.info(f"{index_dir}: generation {r.generation}, {r.files} file(s): {r.docs_added} document(s) added/changed, "
             f"{r.docs_unchanged} unchanged, {r.docs_removed} removed; {r.chunks_added} new chunk(s), "
             f"{r.chunks_indexed} indexed ({r.index_type}); duplicates dropped: {r.exact_duplicates} exact, "
             f"{r.near_duplicates} near; boilerplate lines: {r.boilerplate_lines}; embedded {r.embedded} "
             f"in {r.embed_s:.1f} s, reused {r.vectors_reused}; "
             + (f"ignored by .gitignore: {r.ignored}; " if r.ignored else "")
             + (f"graph: {r.graph['entities']} entities, {r.graph['links']} links; " if r.graph else "")
             + f"total {r.total_s:.1f} s")


def _query_options(f):
    """Options shared by query, answer and eval."""
    opts = [
        click.option("--mode", type=click.Choice(["bm25", "dense", "hybrid"]), default="hybrid", show_default=True),
        click.option("--weights", default=None, help="Weights per retriever, e.g. bm25=0.3,dense=0.7[,graph=0.2] "
                     "(default: the index's tuned choice, else bm25=1,dense=1)."),
        click.option("--fusion", type=click.Choice(["rrf", "cc"]), default=None,
                     help="rrf: weighted reciprocal rank fusion; cc: weighted sum of normalised scores "
                          "(default: tuned, else rrf)."),
        click.option("--norm", type=click.Choice(["minmax", "z", "dbsf", "tmm"]), default=None,
                     help="Score normalisation for --fusion cc (default: tuned, else minmax)."),
        click.option("--rrf-k", default=None, type=int, help="RRF constant k in w / (k + rank) (default: tuned, else 60)."),
        click.option("--graph", is_flag=True, help="Add the entity-graph list (index built with --graph)."),
        click.option("--depth", default=100, show_default=True, type=int, help="Candidates per retriever before fusion."),
        click.option("--filter", "filters", multiple=True,
                     help="Metadata filter applied inside retrieval: FIELD=VALUE, FIELD!=V, FIELD>=V, FIELD<V, FIELD~TEXT; * globs."),
        click.option("--collection", "collections", multiple=True, help="Search only this collection (repeatable)."),
        click.option("--route", is_flag=True, help="Pick the collection(s) that best match the query."),
        click.option("--must", multiple=True, help="Only chunks containing this word or phrase (repeatable)."),
        click.option("--auto-must", is_flag=True, help="Require quoted phrases, identifiers and names found in the query."),
        click.option("--synonyms", type=click.Path(dir_okay=False), help="Synonyms file ('term: a, b' or 'a, b, c' lines)."),
        click.option("--expand", default=None, type=int, help="Add N pseudo-relevance-feedback terms to the BM25 query "
                     "(default: tuned, else 0)."),
        click.option("--rewrite", default=0, type=int, help="Also search N LLM paraphrases of the query (needs -m)."),
        click.option("--subqueries", is_flag=True, help="Also search LLM sub-queries of the question (needs -m)."),
        click.option("--hyde", is_flag=True, help="Embed the query with an LLM-written hypothetical answer (needs -m)."),
        click.option("-m", "--llm", "llm_path", help="Local GGUF model for --rewrite/--subqueries/--hyde/answer "
                     "(default: LLMKIT_MODEL or the packaged SmolLM2)."),
        click.option("--rerank", help="Re-rank the top candidates: cross-encoder:DIR or llm:MODEL.gguf."),
        click.option("--rerank-depth", default=20, show_default=True, type=int),
        click.option("--parents/--no-parents", default=None,
                     help="Return parent windows (small-to-big), fused without double counting (default: tuned, else no)."),
        click.option("--model", help="Embedding model override (must match the index's dimension)."),
        click.option("--runtime", type=click.Choice(["onnx", "torch"]), default="onnx", show_default=True,
                     help="Embedding runtime for queries (ONNX Runtime needs no torch: fast start)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _pipeline(index_dir, k, mode, weights, rrf_k, depth, filters, collections, route, must, auto_must, synonyms,
              expand, rewrite, subqueries, hyde, llm_path, rerank, rerank_depth, parents, model, runtime="onnx",
              fusion=None, norm=None, graph=False, need_llm=False, tuned=True):
    from llmkit.rag.query import Pipeline, QueryOptions, fusion_settings, parse_weights
    from llmkit.rag.search import Index, load_synonyms

    index = Index(index_dir)
    w = parse_weights(weights) if weights else None
    settings, source = fusion_settings(index.manifest if tuned else {}, method=fusion, k=rrf_k, weights=w,
                                       norm=norm, expand=expand, parents=parents)
    if graph and "graph" not in settings["weights"]:
        settings["weights"] = {**settings["weights"], "graph": 1.0}
    qo = QueryOptions(mode=mode, k=k, weights=settings["weights"], rrf_k=settings["k"], fusion=settings["method"],
                      norm=settings["norm"], depth=max(depth, k), filters=list(filters), collections=list(collections),
                      route=route, must=list(must), auto_must=auto_must,
                      synonyms=load_synonyms(synonyms) if synonyms else None, expand=settings["expand"],
                      rewrite=rewrite, subqueries=subqueries, hyde=hyde, parents=settings["parents"],
                      rerank_depth=rerank_depth)
    qo.validate()
    qo.source = source
    cache = {}

    def llm_factory(path=None):
        key = path or llm_path
        if key not in cache:
            from llmkit.rag.llm import LocalLLM

            cache[key] = LocalLLM(key)
        return cache[key]

    llm = llm_factory() if (rewrite or subqueries or hyde or need_llm) else None
    reranker = None
    if rerank:
        from llmkit.rag.rerank import make_reranker

        reranker = make_reranker(rerank, llm_factory)
    return Pipeline(index, qo, llm=llm, reranker=reranker, model=model, runtime=runtime), llm


def _iter_queries(query, queries_file):
    from llmkit.rag.evaluate import load_queries, parse_query_line

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


@group.command("query")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.argument("query", required=False)
@click.option("-k", default=5, show_default=True, type=int, help="Results per query.")
@_query_options
@click.option("--queries", "queries_file", type=click.Path(dir_okay=False), help="Batch: one query per line (text, TSV id<TAB>text, or JSONL).")
@click.option("--compress-to", default=0, type=int, help="Compress the returned texts to about N tokens (reports the ratio).")
@click.option("--explain", is_flag=True, help="Say what routing, expansion and rewriting decided (stderr).")
@click.option("--jsonl", is_flag=True, help="One JSON object per hit.")
def query_cmd(index_dir, query, k, queries_file, compress_to, explain, jsonl, **kw):
    """Search INDEX_DIR for QUERY ('-' or a pipe: one query per line, models loaded once).

    \b
    llmkit rag query idx "how do I mount a filesystem" -k 5
    llmkit rag query idx "内存管理" --mode bm25 --filter collection=articles
    cut -f2 questions.tsv | llmkit rag query idx --jsonl > hits.jsonl
    """
    out = Output(jsonl=jsonl)
    pipe, llm = _pipeline(index_dir, k, **kw)
    if explain:
        out.info(f"fusion ({pipe.opts.source}): {_describe(pipe.opts)}")
    for qid, text in _iter_queries(query, queries_file):
        res = pipe.run(text)
        if explain or not res.hits:
            for note in res.notes:
                out.info(f"[{qid}] {note}")
        if not res.hits:
            out.warn(f"query {qid}: no results.")
        texts = [h.parent_text if pipe.opts.parents else h.text for h in res.hits]
        if compress_to:
            from llmkit.rag.compress import compress

            c = compress(text, texts, compress_to, _counter(pipe, llm), embedder=_maybe_embedder(pipe), llm=llm)
            texts = c.texts
            out.info(f"[{qid}] compressed {c.tokens_before} -> {c.tokens_after} tokens ({c.ratio:.1f}x)")
        for rank, (h, shown) in enumerate(zip(res.hits, texts), 1):
            if jsonl:
                rec = {"query_id": qid, "query": text, "rank": rank, **h.to_dict()}
                if compress_to:
                    rec["compressed_text"] = shown
                out.record(rec)
            else:
                where = _where(h)
                ranks = ", ".join(f"{n} #{r}" for n, r in h.ranks.items())
                rr = f", rerank {h.rerank:.3f}" if h.rerank is not None else ""
                prefix = f"[{qid}] " if queries_file or query in (None, "-") else ""
                body = " ".join(shown.split())
                out.data(f"{prefix}{rank}. {where}  (score {h.score:.4f}; {ranks}{rr})\n   "
                         f"{body[:400]}{'…' if len(body) > 400 else ''}")
        if not jsonl:
            out.info(f"[{qid}] {len(res.hits)} hit(s) in {res.seconds * 1000:.1f} ms")


def _describe(o) -> str:
    """'cc (dbsf) bm25 0.3, dense 0.7; expand 10; parents' for --explain and rag info."""
    how = f"rrf k {o.rrf_k}" if o.fusion == "rrf" else f"cc ({o.norm})"
    w = ", ".join(f"{n} {v:g}" for n, v in o.weights.items())
    return how + f" {w}" + (f"; expand {o.expand}" if o.expand else "") + ("; parents" if o.parents else "")


def _where(h) -> str:
    """'path:line (symbol)' for code, 'path § section' for prose."""
    m = h.meta
    if m.get("line_start"):
        return f"{h.source}:{m['line_start']}" + (f" ({m['symbol']})" if m.get("symbol") else "")
    return h.source + (f" § {m['section']}" if m.get("section") else "")


def _maybe_embedder(pipe):
    return pipe.embedder() if pipe.opts.mode != "bm25" else None


def _counter(pipe, llm):
    if llm is not None:
        return llm.count_tokens
    if pipe.opts.mode != "bm25":
        return pipe.embedder().count_tokens
    from llmkit.rag.bm25 import tokenize

    return lambda t: len(tokenize(t))


ANSWER_SYSTEM = ("You answer questions using only the numbered sources given. Cite the sources you use like [1]. "
                 "If the sources do not contain the answer, say that you do not know.")


@group.command("answer")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.argument("question", required=False)
@click.option("-k", default=4, show_default=True, type=int, help="Sources in the prompt.")
@_query_options
@click.option("-n", "--n-predict", default=256, show_default=True, type=int)
@click.option("--compress-to", default=0, type=int, help="Compress the sources to about N tokens first.")
@click.option("--global", "global_", is_flag=True,
              help="A question about the whole corpus: answer from summaries of the entity-graph communities it "
                   "touches (index built with --graph; summaries cached in the index).")
@click.option("--json", "as_json", is_flag=True)
def answer_cmd(index_dir, question, k, n_predict, compress_to, global_, as_json, **kw):
    """Retrieve sources for QUESTION and stream an answer citing them, with a local GGUF model.

    \b
    llmkit rag answer idx "How are kernel modules loaded?" -m qwen2.5-1.5b.gguf
    llmkit rag answer idx "What are the main themes of these documents?" --global -m model.gguf
    """
    from llmkit.commands._common import read_prompt, stdout_stream

    out = Output()
    question = read_prompt(question).strip()
    if global_:
        from llmkit.rag.global_search import global_answer

        pipe, llm = _pipeline(index_dir, 40, need_llm=True, **kw)
        ans = global_answer(pipe.index, pipe, llm, question, k, n_predict, on_text=stdout_stream(not as_json))
        if as_json:
            out.json({"question": question, "answer": ans.answer, "communities": [
                {"n": i, "entities": c.entities[:10], "summary": c.summary} for i, c in enumerate(ans.communities, 1)]})
            return
        sys.stdout.write("\n\nTopics:\n" + "".join(f"[{i}] {', '.join(c.entities[:6])}\n"
                                                   for i, c in enumerate(ans.communities, 1)))
        sys.stdout.flush()
        out.info(f"{len(ans.communities)} communities, {ans.cached} summaries from the cache")
        return
    pipe, llm = _pipeline(index_dir, k, need_llm=True, **kw)
    res = pipe.run(question)
    if not res.hits:
        from llmkit.errors import BadInput

        raise BadInput("no sources found for the question; loosen the filters or index more documents.")
    texts = [h.parent_text if pipe.opts.parents else h.text for h in res.hits]
    if compress_to:
        from llmkit.rag.compress import compress

        c = compress(question, texts, compress_to, llm.count_tokens, embedder=_maybe_embedder(pipe), llm=llm)
        texts = c.texts
        out.info(f"sources compressed {c.tokens_before} -> {c.tokens_after} tokens ({c.ratio:.1f}x)")
    refs = [_where(h) for h in res.hits]
    sources = "\n\n".join(f"[{i}] ({ref})\n{t}" for i, (ref, t) in enumerate(zip(refs, texts), 1))
    prompt = f"Sources:\n\n{sources}\n\nQuestion: {question}\nAnswer with citations:"
    text = llm.complete(prompt, n_predict, system=ANSWER_SYSTEM, on_text=stdout_stream(not as_json))
    if as_json:
        out.json({"question": question, "answer": text,
                  "sources": [{"n": i, **h.to_dict()} for i, h in enumerate(res.hits, 1)]})
        return
    sys.stdout.write("\n\nSources:\n" + "".join(f"[{i}] {r}\n" for i, r in enumerate(refs, 1)))
    sys.stdout.flush()


@group.command("eval")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.option("--queries", "queries_file", required=True, type=click.Path(dir_okay=False), help="Queries (JSONL id/text or TSV).")
@click.option("--qrels", required=True, type=click.Path(dir_okay=False), help="TREC qrels: query 0 doc relevance.")
@click.option("-c", "--config", "configs", multiple=True,
              help="MODE[:bm25=W,dense=W[,graph=W]][+fusion=rrf|cc][+norm=N][+rrf-k=K][+expand[=N]][+parents]"
                   "[+graph][+rerank=SPEC][+hyde][+rewrite=N]; MODE is bm25, dense, hybrid (built-in fusion) or "
                   "tuned (the index's `rag tune` choice); repeatable (default: bm25, dense, hybrid, and tuned "
                   "when the index has one).")
@click.option("--recall-k", default=100, show_default=True, type=int)
@click.option("-m", "--llm", "llm_path", help="Local GGUF model for configurations that need one.")
@click.option("--limit", default=0, type=int, help="Only the first N queries.")
@click.option("--jsonl", is_flag=True, help="One JSON object per configuration.")
def eval_cmd(index_dir, queries_file, qrels, configs, recall_k, llm_path, limit, jsonl):
    """Evaluate retrieval configurations on judged queries: nDCG@10, Recall@k, MRR, latency.

    \b
    llmkit rag cranfield ../shared/data/cranfield -o cran
    llmkit rag index cran-idx cran/docs.jsonl
    llmkit rag eval cran-idx --queries cran/queries.jsonl --qrels cran/qrels.txt -c bm25 -c dense -c hybrid
    """
    from rich.table import Table

    from llmkit.rag.evaluate import evaluate, load_qrels, load_queries

    out = Output(jsonl=jsonl)
    queries = load_queries(queries_file)[:limit or None]
    judged = load_qrels(qrels)
    rows = []
    from llmkit.rag.store import read_manifest

    default = ("bm25", "dense", "hybrid") + (("tuned",) if read_manifest(index_dir).get("fusion") else ())
    for spec in configs or default:
        kw = _parse_config(spec)
        pipe, _ = _pipeline(index_dir, max(recall_k, 10), llm_path=llm_path, **kw)
        pipe.opts.depth = max(pipe.opts.depth, recall_k)
        row = evaluate(spec, pipe.run, queries, judged, recall_k)
        rows.append(row)
        if jsonl:
            out.record(row.to_dict())
        else:
            out.info(f"{spec}: nDCG@10 {row.ndcg10:.4f}")
    if not jsonl:
        t = Table(title=f"{rows[0].queries} judged queries")
        for col in ("config", "nDCG@10", f"Recall@{recall_k}", "MRR", "ms/query"):
            t.add_column(col, justify="left" if col == "config" else "right")
        for r in rows:
            t.add_row(r.config, f"{r.ndcg10:.4f}", f"{r.recall:.4f}", f"{r.mrr:.4f}", f"{r.latency_ms:.1f}")
        out.table(t)


def _parse_config(spec: str) -> dict:
    """'hybrid:bm25=0.3,dense=0.7+expand=10+rerank=cross-encoder:DIR' -> pipeline keyword arguments."""
    parts = spec.split("+")
    mode, _, weights = parts[0].partition(":")
    if mode not in ("bm25", "dense", "hybrid", "tuned"):
        raise click.BadParameter(f"{spec!r}: the configuration starts with bm25, dense, hybrid or tuned.",
                                 param_hint="--config")
    tuned = mode == "tuned"
    kw = dict(mode="hybrid" if tuned else mode, weights=weights or None, rrf_k=None, depth=100, filters=(),
              collections=(), route=False, must=(), auto_must=False, synonyms=None, expand=None, rewrite=0,
              subqueries=False, hyde=False, rerank=None, rerank_depth=20, parents=None, model=None, fusion=None,
              norm=None, graph=False, tuned=tuned)
    for p in parts[1:]:
        name, _, val = p.partition("=")
        if name == "fusion" and val in ("rrf", "cc"):
            kw["fusion"] = val
        elif name == "norm" and val:
            kw["norm"] = val
        elif name == "graph":
            kw["graph"] = True
        elif name == "expand":
            kw["expand"] = int(val or 10)
        elif name == "rerank" and val:
            kw["rerank"] = val
        elif name in ("hyde", "parents", "subqueries", "route", "auto_must"):
            kw[name] = True
        elif name == "rewrite":
            kw["rewrite"] = int(val or 2)
        elif name == "synonyms" and val:
            kw["synonyms"] = val
        elif name == "rrf-k" and val.isdigit():
            kw["rrf_k"] = int(val)
        else:
            raise click.BadParameter(f"{spec!r}: unknown part {p!r}.", param_hint="--config")
    if not tuned:  # the named configuration exactly, whatever the index's tuned choice
        kw.update(weights=kw["weights"] or "bm25=1,dense=1", rrf_k=60 if kw["rrf_k"] is None else kw["rrf_k"],
                  expand=kw["expand"] or 0, parents=bool(kw["parents"]), fusion=kw["fusion"] or "rrf",
                  norm=kw["norm"] or "minmax")
    return kw


@group.command("tune")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.option("--queries", "queries_file", type=click.Path(dir_okay=False),
              help="Judged queries (JSONL id/text or TSV); with --qrels. Default: pseudo-queries from the corpus.")
@click.option("--qrels", type=click.Path(dir_okay=False), help="TREC qrels for --queries.")
@click.option("-n", "n_queries", default=400, show_default=True, type=int, help="Pseudo-queries to make.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the sample and of the split.")
@click.option("-m", "--llm", "llm_path", help="Local GGUF model: pseudo-queries are questions it writes per chunk.")
@click.option("--no-expand", is_flag=True, help="Leave query expansion out of the search space (faster).")
@click.option("--dry-run", is_flag=True, help="Measure and report, but do not store the choice.")
@click.option("--reset", is_flag=True, help="Drop the stored choice (queries use the built-in fusion again).")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON on stdout.")
@click.option("--runtime", type=click.Choice(["onnx", "torch"]), default="onnx", show_default=True,
              help="Embedding runtime for the queries.")
def tune_cmd(index_dir, queries_file, qrels, n_queries, seed, llm_path, no_expand, dry_run, reset, as_json, runtime):
    """Choose INDEX_DIR's fusion (RRF or score fusion, weights, expansion, parents) from data and
    store it in the index, where `rag query` uses it unless flags override.

    \b
    Without judged queries, pseudo-queries come from the corpus itself (inverse cloze: a sentence
    of a chunk finds the rest of its chunk), so no labels are needed.
    \b
    llmkit rag tune idx                       # pseudo-queries
    llmkit rag tune idx --queries q.jsonl --qrels qrels.txt
    llmkit rag tune idx --reset
    """
    from llmkit.rag import tune as T
    from llmkit.rag.search import Index

    out = Output()
    if reset:
        had = T.reset_choice(index_dir)
        out.info(f"{index_dir}: " + ("tuned fusion dropped; queries use the built-in RRF 1:1 again."
                                      if had else "no tuned fusion was stored."))
        return
    if bool(queries_file) != bool(qrels):
        raise click.UsageError("--queries and --qrels go together.")
    index = Index(index_dir)
    if index.n == 0:
        from llmkit.errors import BadInput

        raise BadInput(f"index '{index_dir}' has no chunks. Add documents with llmkit rag index first.")
    emb = index.embedder(None, runtime)
    with progress_bar("tuning") as bar:
        prog = lambda stage, done, total: bar(done, total, stage)  # noqa: E731
        if queries_file:
            from llmkit.rag.evaluate import load_qrels, load_queries

            qs = T.judged_queries(index, load_queries(queries_file), load_qrels(qrels))
            source = "judged"
        else:
            llm = None
            if llm_path:
                from llmkit.rag.llm import LocalLLM

                llm = LocalLLM(llm_path)
            qs = T.pseudo_queries(index, n_queries, seed, llm, prog)
            source = "pseudo"
        rep = T.tune(index, emb, qs, source, seed, expand=not no_expand, progress=prog)
    if not dry_run:
        T.save_choice(index_dir, rep)
    if as_json:
        out.json(rep.to_dict())
        return
    kinds = ", ".join(f"{n} {k}" for k, n in rep.kinds.items())
    out.data(f"{rep.queries} {source} queries ({kinds}); nDCG@10 on the tuning half, top configurations:")
    for r in rep.top:
        out.data(f"  {r.mean:.4f}  {r.config}")
    out.data(f"chosen: {rep.chosen_label} (simplest within one standard error of the best)"
             + (" -> kept the default: the choice did worse on the held-out half" if rep.kept_default else ""))
    out.data(f"held-out half: chosen {rep.heldout_score:.4f}, default RRF 1:1 {rep.default_heldout:.4f}, "
             f"best single ({rep.best_single}) {rep.best_single_heldout:.4f}")
    out.info(f"{'not stored (--dry-run)' if dry_run else 'stored in ' + index_dir + '/manifest.json'}; "
             f"{rep.seconds:.1f} s")


@group.command("adapt")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="New directory for the adapted sentence-transformers model.")
@click.option("--minutes", default=15.0, show_default=True, type=float, help="Training time budget.")
@click.option("--steps", default=0, type=int, help="Stop after N optimizer steps (default: time budget / one epoch).")
@click.option("--epochs", default=3, show_default=True, type=int, help="Passes over the pairs (the time budget may stop earlier).")
@click.option("--batch-size", default=32, show_default=True, type=int)
@click.option("--lr", default=2e-5, show_default=True, type=float, help="Learning rate.")
@click.option("--pairs", default=4000, show_default=True, type=int, help="Pseudo-queries to make (a fifth held out).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("-m", "--llm", "llm_path", help="Local GGUF model: training queries are questions it writes.")
@click.option("--hard-negatives", is_flag=True, help="Add one BM25/dense-mined negative per pair (measured: hurt on "
              "Cranfield, the mined passages are often relevant too).")
@click.option("--queries", "queries_file", type=click.Path(dir_okay=False),
              help="Judged queries that decide promotion (with --qrels) instead of held-out pseudo-queries.")
@click.option("--qrels", type=click.Path(dir_okay=False), help="TREC qrels for --queries.")
@click.option("--no-promote", is_flag=True, help="Save the adapted model but leave the index on its current model.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON on stdout.")
def adapt_cmd(index_dir, out_dir, minutes, steps, epochs, batch_size, lr, pairs, seed, llm_path, hard_negatives,
              queries_file, qrels, no_promote, as_json):
    """Fine-tune INDEX_DIR's embedding model on its own corpus (no labels) into OUT_DIR; the index
    switches to it only if it beats the current model on held-out pseudo-queries.

    \b
    llmkit rag adapt idx -o idx-model --minutes 15
    llmkit rag index other-idx docs/ --model idx-model     # the result is a normal model directory
    """
    from llmkit.rag.adapt import AdaptOptions, adapt

    out = Output()
    llm = None
    if llm_path:
        from llmkit.rag.llm import LocalLLM

        llm = LocalLLM(llm_path)
    if bool(queries_file) != bool(qrels):
        raise click.UsageError("--queries and --qrels go together.")
    judged = None
    if queries_file:
        from llmkit.rag.evaluate import load_qrels, load_queries
        from llmkit.rag.search import Index
        from llmkit.rag.tune import judged_queries

        judged = judged_queries(Index(index_dir), load_queries(queries_file), load_qrels(qrels))
    opts = AdaptOptions(out_dir, minutes, steps, epochs, batch_size, lr, pairs, seed=seed,
                        hard_negatives=hard_negatives, promote=not no_promote)
    with progress_bar("adapting") as bar:
        rep = adapt(index_dir, opts, llm, progress=lambda stage, done, total: bar(done, total, stage), judged=judged)
    if as_json:
        out.json(rep.to_dict())
        return
    out.data(f"trained on {rep.pairs} pairs, {rep.steps} steps in {rep.train_s / 60:.1f} min; held-out "
             f"{rep.decided_by} queries ({rep.heldout}): nDCG@10 base {rep.base_ndcg:.4f}, adapted {rep.adapted_ndcg:.4f}")
    if rep.decided_by == "pseudo":
        out.warn("promotion was decided on pseudo-queries, which did not predict real gains in our measurements "
                 "(README); check with `llmkit rag eval` on judged queries, or pass --queries/--qrels.")
    if rep.promoted:
        out.data(f"promoted: {rep.model_dir}" + (f"; {index_dir} re-embedded with it" if rep.reembedded else
                                                   " (index left on its model: --no-promote)"))
    else:
        out.data(f"not promoted: the adapted model did not beat the base on held-out queries; the index keeps its "
                 f"model ({rep.model_dir} is saved anyway for inspection)")


@group.command("cranfield")
@click.argument("src", type=click.Path(file_okay=False, exists=True))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Directory to write.")
def cranfield_cmd(src, out_dir):
    """Convert the Cranfield collection in SRC into docs.jsonl, queries.jsonl and qrels.txt."""
    from llmkit.rag.evaluate import import_cranfield

    counts = import_cranfield(src, out_dir)
    Output().info(f"{out_dir}: {counts['docs']} documents, {counts['queries']} queries, {counts['judgments']} judgments")


@group.command("info")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def info_cmd(index_dir, as_json):
    """Show an index's manifest: model, collections, chunking, fields."""
    from llmkit.rag.store import read_manifest

    m = read_manifest(index_dir)
    out = Output()
    if as_json:
        out.json(m)
        return
    out.data(f"index {index_dir}: format {m['format']} v{m['version']}, generation {m['generation']}, "
             f"model {m['model']} ({m.get('dim')}-d, {m.get('embed_precision', 'fp32')}), "
             + (f"{m['store']['uri']} collection {m['store'].get('collection')} ({m.get('index')})" if m.get("store")
                else f"faiss {m.get('index')}"))
    for name, c in m.get("collections", {}).items():
        out.data(f"  {name}: {c.get('docs', 0)} documents, {c.get('chunks', 0)} chunks; {c.get('chunker')} "
                 f"sizes {c.get('sizes')} overlap {c.get('overlap')} parents {c.get('parent_size')}")
    out.data(f"  fields: {', '.join(m.get('fields', []))}")
    f = m.get("fusion")
    if f:
        t = f.get("tuned", {})
        out.data(f"  fusion (rag tune, {t.get('source', '?')} queries, {t.get('date', '?')}): {t.get('label', '?')}; "
                 f"nDCG@10 held-out {t.get('heldout', '?')} vs default {t.get('default_heldout', '?')}")
    else:
        out.data("  fusion: built-in RRF 1:1, k 60 (not tuned: llmkit rag tune)")

