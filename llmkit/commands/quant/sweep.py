"""`llmkit quant sweep BASE.gguf --text EVAL.txt -o DIR`: quantize to several types and size budgets
and measure each file against the base (llmkit.quant.sweep); one JSON line per point."""

from __future__ import annotations

import click

from llmkit.commands._common import Output
from llmkit.commands.plot_option import plot_option
from llmkit.commands.quant.base import group
from llmkit.commands.quant.options import parse_size
from llmkit.commands.quant.quantize import StageBars


def _split(values: tuple[str, ...]) -> list[str]:
    """Repeated and comma-separated values as one list: ('Q4_K_M,Q8_0', 'Q6_K') -> three."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


@group.command("sweep")
@click.argument("base", metavar="BASE.gguf", type=click.Path(dir_okay=False))
@click.option("--text", "text_path", required=True, type=click.Path(dir_okay=False),
              help="Evaluation text ('-' = stdin): the base's log-probabilities on it are each file's reference.")
@click.option("--type", "types", multiple=True, metavar="TYPES",
              help="llama.cpp file types, comma-separated or repeated (e.g. Q4_K_M,Q6_K,Q8_0).")
@click.option("--target-size", "target_sizes", multiple=True, metavar="SIZES",
              help="Size budgets, comma-separated or repeated (bytes, or K/M/G, base 1024): each file's tensor "
                   "types chosen to fit it, as `quant --target-size`.")
@click.option("--imatrix", "imatrix_path", type=click.Path(dir_okay=False, exists=True),
              help="Importance matrix for every point (types and budgets).")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the files, the base's log-probabilities and the sweep's state (sweep.jsonl); "
                   "a rerun there skips the points already measured.")
@click.option("--delete-files", is_flag=True, help="Delete each quantized file once it is measured.")
@click.option("-c", "--ctx-size", "n_ctx", default=512, show_default=True, type=click.IntRange(min=4),
              help="Tokens per scored chunk (as `quant ppl -c`).")
@click.option("--chunks", default=0, type=click.IntRange(min=0), help="Score at most N chunks (0 = all).")
@click.option("-b", "--batch-size", "n_batch", default=2048, show_default=True, type=click.IntRange(min=1),
              help="Tokens per llama.cpp batch (as `quant ppl -b`).")
@click.option("--ubatch-size", "n_ubatch", default=512, show_default=True, type=click.IntRange(min=1),
              help="Physical batch size.")
@click.option("--flash-attn", "flash_attn", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True, help="Flash attention (auto is on for the CPU).")
@click.option("-t", "--threads", type=click.IntRange(min=1), help="Threads for quantizing and scoring (default: all cores).")
@plot_option("the size–KL-divergence front (llama.cpp's types and the budgets as two series)")
def sweep_cmd(base, text_path, types, target_sizes, imatrix_path, out_dir, delete_files, n_ctx, chunks, n_batch,
              n_ubatch, flash_attn, threads, plot_path):
    """Quantize BASE.gguf to each --type and --target-size into DIR and measure every file against the
    base on EVAL.txt: size, bits per weight, KL divergence (mean, 99.9th percentile), perplexity, the
    figures of `quant ppl --kld`. One JSON line per point on stdout; a rerun resumes.

    \b
    llmkit quant sweep model-f16.gguf --text eval.txt --type Q3_K_M,Q4_K_M,Q6_K,Q8_0 -o sweep/ --chunks 40
    llmkit quant sweep model-f16.gguf --text eval.txt --target-size 900M,1.2G --imatrix imat.gguf -o sweep/ --plot front.svg
    """
    from llmkit.commands._common import flag_spelling
    from llmkit.errors import OptionError
    from llmkit.io import read_text
    from llmkit.quant.quality.scoring import EvalOptions
    from llmkit.quant.sweep import SweepOptions, front_chart, plan, sweep

    types, sizes = _split(types), [parse_size(s) for s in _split(target_sizes)]
    if not types and not sizes:
        raise click.UsageError("give the points to measure: --type TYPES and/or --target-size SIZES.")
    out = Output()
    bars = StageBars()
    opts = SweepOptions(types, sizes, imatrix_path, n_ctx, chunks, EvalOptions(n_batch, n_ubatch, flash_attn, threads),
                        keep_files=not delete_files, progress=bars, notice=out.info)
    try:
        plan(base, opts)  # every option checked before the text is read or anything runs
    except OptionError as e:
        raise click.UsageError(e.spelled(flag_spelling(click.get_current_context().command))) from None
    points = _measure(sweep(base, read_text(text_path), out_dir, opts), bars, out)
    if plot_path:
        from llmkit.plot import draw

        draw(plot_path, front_chart(points))


def _measure(points, bars: StageBars, out: Output) -> list:
    """Each point as soon as it is done: a JSON line on stdout, a summary line on stderr."""
    done = []
    try:
        for p in points:
            bars.close()
            done.append(p)
            out.record(p.to_dict())
            out.info(f"{p.name}: {p.bytes / 2**20:,.1f} MiB, {p.bpw:.2f} bits/weight, KLD {p.kld['mean']:.6f} "
                     f"(99.9 % {p.kld['p99.9']:.4f}), PPL {p.ppl['value']:.4f}"
                     + (" (measured by an earlier run)" if p.resumed else ""))
    finally:
        bars.close()
    return done
