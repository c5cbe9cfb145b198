"""`llmkit quant compare | ppl | inspect`: what quantization cost (per-tensor errors, perplexity, KL
divergence against a saved base) and a look inside a file."""

from __future__ import annotations

import click

from llmkit.commands._common import Output, progress_bar
from llmkit.commands.deprecated import Renamed, renamed
from llmkit.commands.quant.base import group


@group.command("compare")
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def compare_cmd(a, b, as_json):
    """Per-tensor error between two models of the same architecture (both dequantized)."""
    from rich.table import Table

    from llmkit.quant.quality.stats import compare

    diffs = compare(a, b)
    out = Output()
    if as_json:
        out.json({"a": a, "b": b, "tensors": [d.to_dict() for d in diffs]})
        return
    t = Table(title=f"{a} vs {b}")
    for col in ("tensor", "types", "RMSE", "max err", "cosine"):
        t.add_column(col, justify="left" if col in ("tensor", "types") else "right")
    for d in diffs:
        t.add_row(d.name, f"{d.type_a} / {d.type_b}", f"{d.rmse:.3g}", f"{d.max_abs_err:.3g}", f"{d.cosine:.6f}")
    out.table(t)


@renamed(Renamed("--ctx", "--ctx-size"))
@group.command("ppl")
@click.option("-m", "--model", "models", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Model(s) to score; repeat to compare (e.g. F16 and Q4_K_M).")
@click.argument("text_path", metavar="FILE", type=click.Path(dir_okay=False), required=False)
@click.option("-c", "--ctx-size", "n_ctx", default=512, show_default=True, type=int)
@click.option("--chunks", default=0, type=int, help="Score at most N chunks (0 = all).")
@click.option("--save-logits", "save_logits", type=click.Path(dir_okay=False),
              help="Write the (one) model's log-probabilities in llama-perplexity's --kl-divergence-base format.")
@click.option("--kld", "kld_base", type=click.Path(dir_okay=False, exists=True),
              help="KL divergence of each model against this base file (its tokens; FILE is not needed).")
@click.option("-b", "--batch-size", "n_batch", default=2048, show_default=True, type=int,
              help="Tokens per llama.cpp batch: max(1, N / ctx) chunks evaluated together (llama-perplexity's -b).")
@click.option("--ubatch-size", "n_ubatch", default=512, show_default=True, type=int,
              help="Physical batch size (llama-perplexity's -ub).")
@click.option("--flash-attn", "flash_attn", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True, help="Flash attention (llama-perplexity's -fa; auto is on for the CPU).")
@click.option("-t", "--threads", type=int, help="CPU threads (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per model, one per line.")
def ppl_cmd(models, text_path, n_ctx, chunks, save_logits, kld_base, n_batch, n_ubatch, flash_attn, threads, as_json):
    """Perplexity of each model on FILE through llama.cpp, computed as llama-perplexity computes it
    (same figure for the same -c, --chunks, -b, --ubatch-size and --flash-attn); with a saved base,
    KL divergence and the other statistics llama-perplexity prints.

    \b
    llmkit quant ppl -m base-f16.gguf --save-logits base.kld wiki.txt -c 512
    llmkit quant ppl -m q4_k_m.gguf -m q3_k_m.gguf --kld base.kld
    """
    from llmkit.quant.quality.scoring import EvalOptions

    opts = EvalOptions(n_batch, n_ubatch, flash_attn, threads)
    out = Output(jsonl=as_json)
    if save_logits and kld_base:
        raise click.UsageError("--save-logits writes a base file and --kld reads one: run them separately.")
    if kld_base:
        return _kld_report(out, models, kld_base, opts, as_json)
    if not text_path:
        raise click.UsageError("give the text FILE to score (or --kld BASE_FILE).")
    from llmkit.io import read_text

    text = read_text(text_path)
    if save_logits:
        if len(models) != 1:
            raise click.UsageError("--save-logits takes exactly one -m model (the base).")
        return _save_base(out, models[0], text, save_logits, n_ctx, chunks, opts, as_json)
    _perplexities(out, models, text, n_ctx, chunks, opts, as_json)


def _save_base(out, model, text, path, n_ctx, chunks, opts, as_json) -> None:
    """The base model's perplexity, its log-probabilities written to `path` for later --kld runs."""
    from llmkit.quant.quality.kld import save_base

    with progress_bar("base logits") as bar:
        r = save_base(model, text, path, n_ctx, chunks, progress=lambda d, n: bar(d, n, ""), options=opts)
    if as_json:
        out.record(r)
    else:
        out.data(f"{r['model']}\tPPL {r['ppl']:.4f} ± {r['ppl_uncertainty']:.5f}\t({r['tokens_scored']} tokens in "
                 f"{r['chunks']} chunks of {r['n_ctx']}; log-probabilities written to {path})")


def _perplexities(out, models, text, n_ctx, chunks, opts, as_json) -> None:
    """Each model's perplexity: JSON lines as they come, or the text lines once all are scored."""
    from llmkit.quant.quality.perplexity import perplexity

    rows = []
    for m in models:
        with progress_bar(f"ppl {m}") as bar:
            r = perplexity(m, text, n_ctx=n_ctx, max_chunks=chunks, progress=lambda d, n: bar(d, n, ""), options=opts)
        rows.append(r)
        if as_json:
            out.record(r.to_dict())
    if not as_json:
        for r in rows:
            out.data(f"{r.model}\tPPL {r.ppl:.4f} ± {r.ppl_uncertainty:.5f}\t({r.tokens_scored} tokens in {r.chunks} "
                     f"chunks of {r.n_ctx}, {r.seconds:.1f} s)")


def _kld_report(out, models, base, opts, as_json) -> None:
    from rich.table import Table

    from llmkit.quant.quality.kld import kl_divergence

    results = []
    for m in models:
        with progress_bar(f"kld {m}") as bar:
            r = kl_divergence(m, base, progress=lambda d, n: bar(d, n, ""), options=opts)
        results.append(r)
        if as_json:
            out.record(r.to_dict())
    if as_json:
        return
    t = Table(title=f"against {base} ({results[0].count} scored tokens)")
    t.add_column("statistic")
    for r in results:
        t.add_column(r.model, justify="right")
    rows = [("PPL(Q)", lambda r: f"{r.ppl:.4f} ± {r.ppl_uncertainty:.4f}"),
            ("PPL(base)", lambda r: f"{r.ppl_base:.4f} ± {r.ppl_base_uncertainty:.4f}"),
            ("Cor(ln PPL(Q), ln PPL(base))", lambda r: f"{100 * r.correlation:.2f} %"),
            ("ln(PPL(Q)/PPL(base))", lambda r: f"{r.ln_ppl_ratio:.6f} ± {r.ln_ppl_ratio_uncertainty:.6f}"),
            ("mean KLD", lambda r: f"{r.kld_mean:.6f} ± {r.kld_uncertainty:.6f}"),
            ("max KLD", lambda r: f"{r.kld_max:.6f}")]
    rows += [(f"{100 * f:g} % KLD" if f != 0.5 else "median KLD", lambda r, f=f: f"{r.kld_percentiles[f]:.6f}")
             for f in (0.999, 0.99, 0.95, 0.90, 0.5, 0.10, 0.05, 0.01, 0.001)]
    rows += [("min KLD", lambda r: f"{r.kld_min:.6f}"),
             ("mean Δp", lambda r: f"{100 * r.dp_mean:.3f} ± {100 * r.dp_uncertainty:.3f} %"),
             ("RMS Δp", lambda r: f"{100 * r.dp_rms:.3f} ± {100 * r.dp_rms_uncertainty:.3f} %"),
             ("max / min Δp", lambda r: f"{100 * r.dp_max:.3f} / {100 * r.dp_min:.3f} %")]
    rows += [(f"{100 * f:g} % Δp" if f != 0.5 else "median Δp", lambda r, f=f: f"{100 * r.dp_percentiles[f]:.3f} %")
             for f in (0.99, 0.95, 0.5, 0.05, 0.01)]
    rows += [("same top p", lambda r: f"{100 * r.same_top:.3f} ± {100 * r.same_top_uncertainty:.3f} %")]
    for name, fn in rows:
        t.add_row(name, *[fn(r) for r in results])
    out.table(t)


@group.command("inspect")
@click.argument("path", metavar="FILE")
@click.option("--json", "as_json", is_flag=True)
@click.option("--full", is_flag=True)
@click.pass_context
def inspect_cmd(ctx, path, as_json, full):
    """Same as `llmkit gguf inspect`: metadata and tensor table (hardened reader)."""
    from llmkit.commands.gguf import group as gguf_group

    ctx.invoke(gguf_group.commands["inspect"], path=path, as_json=as_json, full=full)
