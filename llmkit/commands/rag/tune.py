"""`rag tune`, `rag tune-reset` and `rag adapt`: fit an index to its own corpus (the fusion; the
embedding model)."""

from __future__ import annotations

import contextlib
import io
import sys
from contextlib import contextmanager

import click

from llmkit.commands._common import Output, progress_bar
from llmkit.commands.rag.options import judged_option
from llmkit.commands.deprecated import Renamed, renamed


def _reset(out: Output, index_dir: str) -> None:
    from llmkit.rag.evaluate.tune import reset_choice

    had = reset_choice(index_dir)
    out.info(f"{index_dir}: " + ("tuned fusion dropped; queries use the built-in RRF 1:1 again."
                                  if had else "no tuned fusion was stored."))


@renamed(Renamed("-m", "--llm"), Renamed("-n", "--pseudo-queries"))
@click.command("tune")
@click.argument("index_dir", type=click.Path(file_okay=False))
@judged_option(queries_help="Judged queries (JSONL id/text or TSV); with --qrels. Default: pseudo-queries from the "
                            "corpus.")
@click.option("--pseudo-queries", "n_queries", default=400, show_default=True, type=int, help="Pseudo-queries to make.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the sample and of the split.")
@click.option("--llm", "llm_path", help="Local GGUF model: pseudo-queries are questions it writes per chunk.")
@click.option("--no-expand", is_flag=True, help="Leave query expansion out of the search space (faster).")
@click.option("--dry-run", is_flag=True, help="Measure and report, but do not store the choice.")
@click.option("--reset", is_flag=True, help="Deprecated: use `rag tune-reset`.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON on stdout.")
@click.option("--runtime", type=click.Choice(["onnx", "torch"]), default="onnx", show_default=True,
              help="Embedding runtime for the queries.")
def tune_cmd(index_dir, judged, n_queries, seed, llm_path, no_expand, dry_run, reset, as_json, runtime):
    """Choose INDEX_DIR's fusion (RRF or score fusion, weights, expansion, parents) from data and
    store it in the index, where `rag query` uses it unless flags override.

    \b
    Without judged queries, pseudo-queries come from the corpus itself (inverse cloze: a sentence
    of a chunk finds the rest of its chunk), so no labels are needed.
    \b
    llmkit rag tune idx                       # pseudo-queries
    llmkit rag tune idx --queries q.jsonl --qrels qrels.txt
    llmkit rag tune-reset idx                 # back to the built-in fusion
    """
    from llmkit.rag.evaluate.tune import run_tune, save_choice

    out = Output()
    if reset:
        out.warn("`rag tune --reset` is deprecated; use `llmkit rag tune-reset`.")
        return _reset(out, index_dir)
    with progress_bar("tuning") as bar:
        rep = run_tune(index_dir, judged, n_queries, seed, llm_path, expand=not no_expand, runtime=runtime,
                       progress=lambda stage, done, total: bar(done, total, stage))
    if not dry_run:
        save_choice(index_dir, rep)
    if as_json:
        out.json(rep.to_dict())
        return
    kinds = ", ".join(f"{n} {k}" for k, n in rep.kinds.items())
    out.data(f"{rep.queries} {rep.source} queries ({kinds}); nDCG@10 on the tuning half, top configurations:")
    for r in rep.top:
        out.data(f"  {r.mean:.4f}  {r.config}")
    out.data(f"chosen: {rep.chosen_label} (simplest within one standard error of the best)"
             + (" -> kept the default: the choice did worse on the held-out half" if rep.kept_default else ""))
    out.data(f"held-out half: chosen {rep.heldout_score:.4f}, default RRF 1:1 {rep.default_heldout:.4f}, "
             f"best single ({rep.best_single}) {rep.best_single_heldout:.4f}")
    out.info(f"{'not stored (--dry-run)' if dry_run else 'stored in ' + index_dir + '/manifest.json'}; "
             f"{rep.seconds:.1f} s")


@click.command("tune-reset")
@click.argument("index_dir", type=click.Path(file_okay=False))
def tune_reset_cmd(index_dir):
    """Drop INDEX_DIR's tuned fusion: queries use the built-in RRF 1:1, k 60 again."""
    _reset(Output(), index_dir)


@renamed(Renamed("-m", "--llm"))
@click.command("adapt")
@click.argument("index_dir", type=click.Path(file_okay=False))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="New directory for the adapted sentence-transformers model.")
@click.option("--minutes", default=15.0, show_default=True, type=float, help="Training time budget.")
@click.option("--steps", default=0, type=int, help="Stop after N optimizer steps (default: time budget / one epoch).")
@click.option("--epochs", default=3, show_default=True, type=int,
              help="Passes over the pairs (the time budget may stop earlier).")
@click.option("--batch-size", default=32, show_default=True, type=int)
@click.option("--lr", default=2e-5, show_default=True, type=float, help="Learning rate.")
@click.option("--pairs", default=4000, show_default=True, type=int, help="Pseudo-queries to make (a fifth held out).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--llm", "llm_path", help="Local GGUF model: training queries are questions it writes.")
@click.option("--hard-negatives", is_flag=True, help="Add one BM25/dense-mined negative per pair (often hurts: "
              "the mined passages are often relevant too).")
@judged_option(queries_help="Judged queries that decide promotion (with --qrels) instead of held-out pseudo-queries.")
@click.option("--no-promote", is_flag=True, help="Save the adapted model but leave the index on its current model.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON on stdout.")
def adapt_cmd(index_dir, out_dir, minutes, steps, epochs, batch_size, lr, pairs, seed, llm_path, hard_negatives,
              judged, no_promote, as_json):
    """Fine-tune INDEX_DIR's embedding model on its own corpus (no labels) into OUT_DIR; the index
    switches to it only if it beats the current model on held-out pseudo-queries.

    \b
    llmkit rag adapt idx -o idx-model --minutes 15
    llmkit rag index other-idx docs/ --model idx-model     # the result is a normal model directory
    """
    from llmkit.rag.evaluate.adapt import AdaptOptions, adapt

    llm = None
    if llm_path:
        from llmkit.rag.llm import LocalLLM

        llm = LocalLLM(llm_path)
    judged_q = None
    if judged:
        from llmkit.rag.evaluate.queries import judged_from_files
        from llmkit.rag.index.reader import Index

        judged_q = judged_from_files(Index(index_dir), *judged)
    opts = AdaptOptions(out_dir, minutes, steps, epochs, batch_size, lr, pairs, seed=seed,
                        hard_negatives=hard_negatives, promote=not no_promote)
    with progress_bar("adapting") as bar:
        rep = adapt(index_dir, opts, llm, progress=lambda stage, done, total: bar(done, total, stage), judged=judged_q,
                    trainer_output=captured_console)
    if as_json:
        Output().json(rep.to_dict())
    else:
        _adapt_report(Output(), rep, index_dir)


def _adapt_report(out: Output, rep, index_dir: str) -> None:
    """What the adaptation did and whether the index switched to the adapted model, as text."""
    out.data(f"trained on {rep.pairs} pairs, {rep.steps} steps in {rep.train_s / 60:.1f} min; held-out "
             f"{rep.decided_by} queries ({rep.heldout}): nDCG@10 base {rep.base_ndcg:.4f}, adapted {rep.adapted_ndcg:.4f}")
    if rep.decided_by == "pseudo":
        out.warn("promotion was decided on pseudo-queries, which did not predict real gains in our measurements "
                 "(docs/design/rag-evaluation.md); check with `llmkit rag eval` on judged queries, or pass --queries/--qrels.")
    if rep.promoted:
        out.data(f"promoted: {rep.model_dir}" + (f"; {index_dir} re-embedded with it" if rep.reembedded else
                                                   " (index left on its model: --no-promote)"))
    else:
        out.data(f"not promoted: the adapted model did not beat the base on held-out queries; the index keeps its "
                 f"model ({rep.model_dir} is saved anyway for inspection)")


@contextmanager
def captured_console():
    """Keep the trainer's console output (metrics, model-card progress) off stdout and stderr; when
    training fails, show it on stderr with --debug (it explains the failure)."""
    from llmkit.commands._common import settings

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            yield
    except BaseException:
        if settings().debug and buf.getvalue():
            sys.stderr.write(buf.getvalue())
        raise
