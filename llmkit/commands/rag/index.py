"""`rag index` and `rag info`: build an index directory, show its manifest."""

from __future__ import annotations

import click

from llmkit.commands._common import Output, progress_bar
from llmkit.bounded import read_bounded
from llmkit.commands.deprecated import renamed
from llmkit.commands.rag.options import (INDEX_RENAMES, chunk_options, embed_options, meta_option, read_options,
                                        store_options)


@renamed(*INDEX_RENAMES)
@click.command("index")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.argument("inputs", nargs=-1)
@click.option("--collection", default="default", show_default=True, help="Named collection inside the index.")
@chunk_options
@meta_option
@embed_options
@read_options
@store_options
@click.option("--no-tune", is_flag=True, help="Do not tune the fusion on pseudo-queries at the end of the run.")
@click.option("--no-wait", is_flag=True, help="Fail at once if another process is writing this index (default: wait).")
@click.option("--watch", is_flag=True, help="After indexing, keep watching INPUTS and index added, changed and "
              "deleted files as they happen (Ctrl-C stops; the last generation stays live).")
@click.option("--json", "as_json", is_flag=True, help="Print the indexing report as JSON on stdout (--watch: one "
              "line per pass).")
def index_cmd(index_dir, inputs, collection, chunk, meta, embed, read, store, no_tune, no_wait, watch, as_json):
    """Add INPUTS (files, directories, '-') to INDEX_DIR, updating only what changed.

    \b
    Formats: .txt .md (headings -> sections, front matter) .rst .html .jsonl .pdf .docx
    .epub .csv/.tsv (rows, header kept) .ipynb (cells) and source code (.py .js .ts .tsx
    .go .rs .java .c .h .cpp .hpp .cs .rb .php .swift .scala .kt .sh .sql .lua: chunks at
    definitions, with symbol and line numbers). Directories honour .gitignore; files of other types
    are listed as skipped. Re-running skips files whose size, mtime and inode are unchanged,
    updates changed files (content hash), removes files that disappeared under the given
    paths, and embeds only new text; a run killed while embedding is resumed by the next. At the end the
    fusion is tuned on pseudo-queries (enough chunks, changed by > 20 %; --no-tune).
    \b
    llmkit rag index idx docs/ --collection articles
    llmkit rag index idx src/ --glob '*.md' --glob '!drafts/*' --collection code --meta team=infra
    llmkit rag index idx notes/ --watch
    llmkit rag index idx docs/ --store milvus://milvus.internal:19530 --ray auto,workers=4
    """
    from llmkit.commands._common import resolve_inputs
    from llmkit.rag.index.build import IndexOptions

    out = Output()
    inputs = resolve_inputs(inputs, "documents")
    opts = IndexOptions(collection=collection, meta=meta, read=read, chunk=chunk, embed=embed, store=store,
                        tune=not no_tune, wait=not no_wait)
    if watch:
        return _watch(out, index_dir, list(inputs), opts, as_json)
    from llmkit.rag.indexing import index_pass

    stdin_data = read_bounded("-", "LLMKIT_MAX_PDF_BYTES") if "-" in inputs else None  # stdin may be a PDF
    with progress_bar("indexing") as bar:
        report, tuned = index_pass(index_dir, list(inputs), opts, stdin_data=stdin_data,
                                   progress=lambda stage, done, total: bar(done, total, stage),
                                   on_wait=lambda msg: out.info(msg + " ..."))
    _warnings(out, report, tuned, collection)
    if as_json:
        out.json({**report.to_dict(), "tune": tuned})
        return
    out.info(_summary(index_dir, report))


def _warnings(out, report, tuned, collection) -> None:
    """What a run changed or left out, on stderr."""
    if report.migrated_from:
        out.info(f"index format upgraded from version {report.migrated_from} to {report.version}")
    if report.changes:
        out.info(f"collection '{collection}': chunking changed: " + "; ".join(report.changes))
    if report.over_window:
        out.warn(f"{report.over_window} chunk(s) are longer than the embedding model's window ({report.window} "
                 "tokens): their ends are not embedded (BM25 reads them whole).")
    if tuned:
        out.info(tuned["why"] + (f" ({tuned['seconds']:.1f} s, {tuned['seconds'] / max(report.total_s, 1e-9):.0%} "
                                 "of the indexing time)" if tuned["done"] else ""))
    if report.skipped:
        from llmkit.rag.read.files import summarize_skipped

        out.warn("skipped " + summarize_skipped(report.skipped))
    if report.code_fallbacks:
        out.warn("code cut at line boundaries instead of definitions: " + ", ".join(
            f"{n} file(s) ({why})" for why, n in report.code_fallbacks.items()))


def _summary(index_dir, r) -> str:
    return (f"{index_dir}: generation {r.generation}, {r.files} file(s): {r.docs_added} document(s) added/changed, "
            f"{r.docs_unchanged} unchanged, {r.docs_removed} removed; {r.chunks_added} new chunk(s), "
            f"{r.chunks_indexed} indexed" + (f" ({r.index_type})" if r.index_type else "")
            + f"; duplicates dropped: {r.exact_duplicates} exact, "
            f"{r.near_duplicates} near; boilerplate lines: {r.boilerplate_lines}; embedded {r.embedded} "
            f"in {r.embed_s:.1f} s, reused {r.vectors_reused}; "
            + (f"ignored by .gitignore: {r.ignored}; " if r.ignored else "")
            + (f"graph: {r.graph['entities']} entities, {r.graph['links']} links; " if r.graph else "")
            + f"total {r.total_s:.1f} s")


def _watch(out, index_dir, inputs, opts, as_json) -> None:
    """--watch: a pass now, then one per batch of changes, each reported as it ends."""
    from llmkit.rag.indexing import watch

    def on_event(ev):
        if ev.kind != "pass":
            out.warn(ev.message)
            return
        if as_json:
            out.record({**ev.report.to_dict(), "tune": ev.tuned, "changed": ev.paths,
                        "seconds": round(ev.seconds, 3)})
            return
        _warnings(out, ev.report, ev.tuned, opts.collection)
        head = f"{len(ev.paths)} change(s) in {ev.seconds:.2f} s: " if ev.paths else ""
        out.info(head + _summary(index_dir, ev.report))
        if not ev.paths:
            out.info(f"watching {', '.join(inputs)} (Ctrl-C stops)")

    last = watch(index_dir, inputs, opts, on_event, on_wait=lambda msg: out.info(msg + " ..."))
    out.info(f"stopped watching; generation {last.generation if last else '?'} of {index_dir} is live")


@click.command("info")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def info_cmd(index_dir, as_json):
    """Show an index's manifest: model, collections, chunking, fields."""
    from llmkit.rag.index.manifest import read_manifest, stored_version

    m = read_manifest(index_dir)
    out = Output()
    if as_json:
        out.json(m)
        return
    on_disk = stored_version(index_dir)
    upgrade = f" (stored as v{on_disk}: the next write upgrades it)" if on_disk != m["version"] else ""
    out.data(f"index {index_dir}: format {m['format']} v{m['version']}{upgrade}, generation {m['generation']}, "
             f"model {m['model']} ({m['dim']}-d, {m['embed_precision']}), "
             + (f"{m['store']['uri']} collection {m['store'].get('collection')} ({m['index']})" if m["store"]
                else f"faiss {m['index']}"))
    if m.get("pending"):
        out.data(f"  embedding: {m['pending']} chunk(s) without vectors yet: BM25 finds them, dense search does not "
                 "(the run embedding them publishes the next generation; if it stopped, run rag index again)")
    for name, c in m["collections"].items():
        size = (f"{c.get('tokens')} model tokens" if c.get("unit") == "tokens" else f"sizes {c.get('sizes')} characters")
        out.data(f"  {name}: {c.get('docs', 0)} documents, {c.get('chunks', 0)} chunks; {c.get('chunker')} {size}, "
                 f"overlap {c.get('overlap')}, parents {c.get('parent_size')}")
    out.data(f"  BM25 analysis: {m['analysis']}; hits are " + ("documents (code: definitions)"
                                                               if m["ranking"] == "documents" else "chunks"))
    out.data(f"  fields: {', '.join(m['fields'])}")
    f = m.get("fusion")
    if f:
        t = f.get("tuned", {})
        how = "rag index, auto" if t.get("chunks") else "rag tune"
        out.data(f"  fusion ({how}, {t.get('source', '?')} queries, {t.get('date', '?')}): {t.get('label', '?')}; "
                 f"nDCG@10 held-out {t.get('heldout', '?')} vs default {t.get('default_heldout', '?')}")
    else:
        out.data("  fusion: built-in RRF 1:1, k 60 (not tuned: llmkit rag tune)")
