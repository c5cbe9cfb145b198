"""`llmkit quant imatrix`: collect an importance matrix through llama.cpp."""

from __future__ import annotations

import click

from llmkit.commands._common import Output, progress_bar
from llmkit.commands.deprecated import Renamed, renamed
from llmkit.commands.quant.base import group


@renamed(Renamed("--ctx", "--ctx-size"))
@group.command("imatrix")
@click.option("-m", "--model", "model_path", required=True, type=click.Path(dir_okay=False), help="Model to run (F16/F32 ideally).")
@click.option("--text", "text_path", required=True, type=click.Path(dir_okay=False), help="Calibration text ('-' = stdin).")
@click.option("-o", "--output", "dst", required=True, type=click.Path(dir_okay=False), help="imatrix GGUF to write.")
@click.option("-c", "--ctx-size", "n_ctx", default=512, show_default=True, type=int, help="Tokens per chunk.")
@click.option("--chunks", default=0, type=int, help="Use at most N chunks (0 = every full chunk of the text, as llama-imatrix).")
@click.option("-t", "--threads", type=int, help="CPU threads (default: all cores).")
def imatrix_cmd(model_path, text_path, dst, n_ctx, chunks, threads):
    """Collect an importance matrix: mean squared input activation per column of every matrix."""
    from llmkit.io import read_text
    from llmkit.quant.calibration.imatrix import collect_imatrix, save_imatrix

    text = read_text(text_path)
    with progress_bar("chunks") as bar:
        sums, counts, chunks = collect_imatrix(model_path, text, n_ctx=n_ctx, threads=threads, max_chunks=chunks,
                                               progress=lambda d, n: bar(d, n, ""))
    save_imatrix(dst, sums, counts, chunks, n_ctx, text_path)
    Output().info(f"{dst}: {len(sums)} matrices, {chunks} chunks of {n_ctx} tokens")
