"""`llmkit quant`: quantize GGUF models like llama.cpp (same bytes) and measure what it cost."""

from __future__ import annotations

import click

from llmkit.commands._common import Output, progress_bar


class _QuantGroup(click.Group):
    """`llmkit quant IN -t TYPE -o OUT` runs `quantize`; the other words are subcommands."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["quantize", *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx, formatter):
        formatter.write_usage("llmkit quant", "IN.gguf -t TYPE -o OUT.gguf [OPTIONS] | COMMAND [ARGS]...")


@click.group("quant", cls=_QuantGroup)
def group():
    """Quantize GGUF weights byte-identically to llama.cpp; report sizes and errors.

    \b
    llmkit quant model-f16.gguf -t Q4_K_M -o model-q4_k_m.gguf --report
    llmkit quant imatrix -m model-f16.gguf --text calib.txt -o imatrix.gguf
    llmkit quant model-f16.gguf -t Q4_K_M --imatrix imatrix.gguf -o model-q4_k_m.gguf
    llmkit quant compare model-f16.gguf model-q4_k_m.gguf
    llmkit quant ppl -m model-f16.gguf -m model-q4_k_m.gguf wiki.txt
    """


@group.command("quantize")
@click.argument("src", metavar="IN.gguf", type=click.Path(dir_okay=False))
@click.option("-t", "--type", "qtype", required=True,
              help="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K "
                   "IQ4_NL IQ4_XS.")
@click.option("-o", "--output", "dst", required=True, type=click.Path(dir_okay=False), help="Output GGUF path.")
@click.option("--pure", is_flag=True, help="Every quantizable tensor gets TYPE (no _S/_M/_L mixture, no Q6_K output).")
@click.option("--imatrix", "imatrix_path", type=click.Path(dir_okay=False), help="Importance matrix (GGUF or legacy .dat).")
@click.option("--allow-requantize", is_flag=True, help="Allow re-quantizing tensors that are already quantized.")
@click.option("--threads", type=int, help="Worker threads (default: all cores).")
@click.option("--report", is_flag=True, help="Per-tensor table: type, bits/weight, bytes, RMSE, max error, cosine.")
@click.option("--json", "as_json", is_flag=True, help="The report as one JSON object.")
@click.option("--output-tensor-type", "output_type", metavar="TYPE", help="Type for output.weight (as llama-quantize).")
@click.option("--token-embedding-type", "embd_type", metavar="TYPE", help="Type for token_embd.weight.")
@click.option("--tensor-type", "tensor_types", metavar="PATTERN=TYPE", multiple=True,
              help="Type for tensors whose name matches the regex PATTERN (repeatable; first match wins).")
def quantize_cmd(src, qtype, dst, pure, imatrix_path, allow_requantize, threads, report, as_json, output_type,
                 embd_type, tensor_types):
    """Quantize IN.gguf to TYPE, writing OUT.gguf (the same bytes llama.cpp's quantizer writes)."""
    from llmkit.quant.quantize import quantize_file
    from llmkit.quant.rules import Overrides

    out = Output()
    overrides = Overrides.parse(output_type, embd_type, tensor_types)
    imx = None
    if imatrix_path:
        from llmkit.quant.imatrix import load_imatrix

        imx = load_imatrix(imatrix_path)
    with progress_bar("quantizing") as bar:
        rep = quantize_file(src, dst, qtype, pure=pure, imatrix=imx, allow_requantize=allow_requantize,
                            threads=threads, measure=report or as_json, progress=lambda i, n, name: bar(i, n, name),
                            overrides=overrides)
    if as_json:
        out.json(rep.to_dict())
    elif report:
        from rich.table import Table

        t = Table(title=f"{src} -> {dst} ({rep.ftype})")
        for col in ("tensor", "shape", "type", "bpw", "bytes", "RMSE", "max err", "cosine"):
            t.add_column(col, justify="left" if col in ("tensor", "shape", "type") else "right")
        for r in rep.tensors:
            t.add_row(r.name, "x".join(map(str, r.shape)), f"{r.type_in}->{r.type_out}" if r.type_in != r.type_out else r.type_out,
                      f"{r.bpw:.3f}", f"{r.bytes_out:,}", f"{r.rmse:.3g}", f"{r.max_abs_err:.3g}", f"{r.cosine:.6f}")
        out.table(t)
    d = rep.to_dict()
    out.info(f"{src}: {rep.bytes_in / 2**20:.2f} MiB -> {dst}: {rep.bytes_out / 2**20:.2f} MiB of tensors "
             f"({rep.ratio:.2f}x smaller, {d['bpw']:.2f} bits/weight) in {rep.seconds:.2f} s"
             + (f"; {rep.fallbacks} tensor(s) fell back to another type (row length)" if rep.fallbacks else ""))


@group.command("imatrix")
@click.option("-m", "--model", "model_path", required=True, type=click.Path(dir_okay=False), help="Model to run (F16/F32 ideally).")
@click.option("--text", "text_path", required=True, type=click.Path(dir_okay=False), help="Calibration text ('-' = stdin).")
@click.option("-o", "--output", "dst", required=True, type=click.Path(dir_okay=False), help="imatrix GGUF to write.")
@click.option("-c", "--ctx", "n_ctx", default=512, show_default=True, type=int, help="Tokens per chunk.")
@click.option("--chunks", default=0, type=int, help="Use at most N chunks (0 = the whole text).")
@click.option("--threads", type=int)
def imatrix_cmd(model_path, text_path, dst, n_ctx, chunks, threads):
    """Collect an importance matrix: mean squared input activation per column of every matrix."""
    from llmkit.io import read_text
    from llmkit.quant.imatrix import collect, save_imatrix

    text = read_text(text_path)
    with progress_bar("chunks") as bar:
        sums, counts, chunks = collect(model_path, text, n_ctx=n_ctx, threads=threads, max_chunks=chunks,
                                       progress=lambda d, n: bar(d, n, ""))
    save_imatrix(dst, sums, counts, chunks, n_ctx, text_path)
    Output().info(f"{dst}: {len(sums)} matrices, {chunks} chunks of {n_ctx} tokens")


@group.command("compare")
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def compare_cmd(a, b, as_json):
    """Per-tensor error between two models of the same architecture (both dequantized)."""
    from rich.table import Table

    from llmkit.quant.evaluate import compare

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


@group.command("ppl")
@click.option("-m", "--model", "models", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Model(s) to score; repeat to compare (e.g. F16 and Q4_K_M).")
@click.argument("text_path", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("-c", "--ctx", "n_ctx", default=512, show_default=True, type=int)
@click.option("--chunks", default=0, type=int, help="Score at most N chunks (0 = all).")
@click.option("--threads", type=int)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per model, one per line.")
def ppl_cmd(models, text_path, n_ctx, chunks, threads, as_json):
    """Perplexity of each model on FILE through llama.cpp (chunked like llama-perplexity)."""
    from llmkit.io import read_text
    from llmkit.quant.evaluate import perplexity

    text = read_text(text_path)
    out = Output(jsonl=as_json)
    rows = []
    for m in models:
        with progress_bar(f"ppl {m}") as bar:
            r = perplexity(m, text, n_ctx=n_ctx, max_chunks=chunks, threads=threads, progress=lambda d, n: bar(d, n, ""))
        rows.append(r)
        if as_json:
            out.record(r.to_dict())
    if not as_json:
        for r in rows:
            out.data(f"{r.model}\tPPL {r.ppl:.4f}\t({r.tokens_scored} tokens in {r.chunks} chunks of {r.n_ctx}, {r.seconds:.1f} s)")


@group.command("inspect")
@click.argument("path", metavar="FILE")
@click.option("--json", "as_json", is_flag=True)
@click.option("--full", is_flag=True)
@click.pass_context
def inspect_cmd(ctx, path, as_json, full):
    """Same as `llmkit gguf inspect`: metadata and tensor table (hardened reader)."""
    from llmkit.commands.gguf import group as gguf_group

    ctx.invoke(gguf_group.commands["inspect"], path=path, as_json=as_json, full=full)
