"""`llmkit quant [quantize] IN --type TYPE -o OUT`: parse the options, run the library's pipeline
(llmkit.quant.pipeline.quantize), print the report."""

from __future__ import annotations

import click

from llmkit.commands._common import Output, progress_bar
from llmkit.commands.deprecated import Renamed, not_a_number, renamed
from llmkit.commands.quant.base import group


@renamed(Renamed("-t", "--type", when=not_a_number), Renamed("--ctx", "--ctx-size"))
@group.command("quantize")
@click.argument("src", metavar="IN.gguf", type=click.Path(dir_okay=False))
@click.option("--type", "ftype",
              help="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q1_0 Q2_0 Q2_K Q2_K_S Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M "
                   "Q5_K_S Q5_K_M Q6_K IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_XS IQ3_S IQ3_M IQ4_NL IQ4_XS "
                   "TQ1_0 TQ2_0 MXFP4_MOE (IQ1_*, IQ2_*, IQ3_XXS, IQ3_XS and Q2_K_S need --imatrix; not with "
                   "--target-bpw/--target-size).")
@click.option("-o", "--output", "dst", required=True, type=click.Path(dir_okay=False), help="Output GGUF path.")
@click.option("--pure", is_flag=True, help="Every quantizable tensor gets TYPE (no _S/_M/_L mixture, no Q6_K output).")
@click.option("--imatrix", "imatrix_path", type=click.Path(dir_okay=False), help="Importance matrix (GGUF or legacy .dat).")
@click.option("--allow-requantize", is_flag=True, help="Allow re-quantizing tensors that are already quantized.")
@click.option("-t", "--threads", type=int, help="Worker threads (default: all cores).")
@click.option("--report", is_flag=True, help="Per-tensor table: type, bits/weight, bytes, RMSE, max error, cosine.")
@click.option("--json", "as_json", is_flag=True, help="The report as one JSON object.")
@click.option("--output-tensor-type", "output_type", metavar="TYPE", help="Type for output.weight (as llama-quantize).")
@click.option("--token-embedding-type", "embd_type", metavar="TYPE", help="Type for token_embd.weight.")
@click.option("--tensor-type", "tensor_types", metavar="PATTERN=TYPE", multiple=True,
              help="Type for tensors whose name matches the regex PATTERN (repeatable; first match wins).")
@click.option("--target-bpw", type=float, help="Choose each tensor's type so the tensors average B bits per weight.")
@click.option("--target-size", help="Choose each tensor's type so the file fits SIZE bytes (K/M/G suffixes, base 1024).")
@click.option("--calib", "calib_path", type=click.Path(dir_okay=False),
              help="Calibration text: --target-* probes each tensor kind's effect on the output (KLD) on it "
                   "(without it, on text the model writes itself); --method gptq collects its Hessians from it.")
@click.option("-c", "--ctx-size", "n_ctx", default=None, type=int,
              help="Tokens per calibration chunk (default: 32 for the budget's probes, 256 for GPTQ's Hessians).")
@click.option("--chunks", default=None, type=int, help="Calibration chunks (default: 4 for the probes, 16 for GPTQ).")
@click.option("--method", type=click.Choice(["rtn", "gptq"]), default="rtn", show_default=True,
              help="rtn: llama.cpp's rounding (byte-identical); gptq: error-compensating rounding with Hessians "
                   "from --calib (Q2_K..Q6_K, Q4_0 matrices; not byte-identical by design).")
@click.option("--hessian", "hessian_path", type=click.Path(dir_okay=False),
              help="GPTQ: read the Hessians from this file, or collect them from --calib and save them here.")
@click.option("--damp", default=0.01, show_default=True, type=float, help="GPTQ dampening (x mean diagonal of H).")
@click.option("--shrink", default=None, type=float,
              help="GPTQ: add this x diag(H) to H, shrinking the correlations that calibration text estimates "
                   "worst (default 3; 0: the plain algorithm).")
@click.option("--no-refit", is_flag=True, help="GPTQ: fit each block's scales once on the original weights.")
def quantize_cmd(src, ftype, dst, pure, imatrix_path, allow_requantize, threads, report, as_json, output_type,
                 embd_type, tensor_types, target_bpw, target_size, calib_path, n_ctx, chunks, method, hessian_path,
                 damp, shrink, no_refit):
    """Quantize IN.gguf to TYPE, writing OUT.gguf (the same bytes llama.cpp's quantizer writes); or
    choose each tensor's type under a size budget (--target-bpw / --target-size)."""
    from llmkit.commands._common import flag_spelling
    from llmkit.errors import BadInput, OptionError
    from llmkit.quant.options import QuantOptions
    from llmkit.quant.pipeline import quantize

    spelling = flag_spelling(click.get_current_context().command, {"calib_text": "--calib", "imatrix": "--imatrix"})
    bars = StageBars()
    opts = QuantOptions(ftype=ftype, pure=pure, allow_requantize=allow_requantize, threads=threads,
                        measure=report or as_json, overrides=_overrides(output_type, embd_type, tensor_types),
                        target_bpw=target_bpw, target_size=parse_size(target_size) if target_size is not None else None,
                        calib_text="" if calib_path else None, n_ctx=n_ctx, chunks=chunks, method=method,
                        hessian_path=hessian_path, damp=damp, refit=not no_refit, shrink=shrink, progress=bars,
                        notice=Output().info)  # a kernel's first compilation takes seconds: say so on stderr
    try:
        opts.check()  # the options alone, before any file is read
    except OptionError as e:
        raise click.UsageError(e.spelled(spelling)) from None
    if imatrix_path:
        from llmkit.quant.calibration.imatrix import load_imatrix

        opts.imatrix = load_imatrix(imatrix_path)
    if calib_path:
        from llmkit.io import read_text

        opts.calib_text = read_text(calib_path)
    try:
        run = quantize(src, dst, opts)
    except OptionError as e:
        raise BadInput(e.spelled(spelling)) from e
    finally:
        bars.close()
    _emit(run, src, dst, report, as_json)


def _emit(run, src, dst, report: bool, as_json: bool) -> None:
    out, rep, alloc = Output(), run.report, run.allocation
    if alloc is not None:
        on = f" on {alloc.probe_text}" if alloc.probe_text and "probe" in alloc.sensitivity_source else ""
        out.info(f"allocation: {len(alloc.assign)} tensors, {alloc.used:,} of {alloc.budget:,} bytes, sensitivity "
                 f"{alloc.sensitivity_source}{on}, {alloc.seconds:.1f} s")
    if run.method == "gptq":
        raised = run.damp_raised
        out.info(f"GPTQ: {run.gptq_matrices} matrices error-compensated (not byte-identical to llama.cpp by design)"
                 + (f"; dampening raised for {len(raised)}: " + ", ".join(f"{k} ({v:g})" for k, v in list(raised.items())[:3])
                    if raised else "")
                 + ("; rounded as llama.cpp does (GPTQ does not write these types): "
                    + ", ".join(f"{n} in {t}" for t, n in run.gptq_skipped.items()) if run.gptq_skipped else ""))
    if as_json:
        out.json(run.to_dict())
    elif report:
        from rich.table import Table

        t = Table(title=f"{src} -> {dst} ({rep.ftype})")
        for col in ("tensor", "shape", "type", "bpw", "bytes", "RMSE", "max err", "cosine"):
            t.add_column(col, justify="left" if col in ("tensor", "shape", "type") else "right")
        for r in rep.tensors:
            t.add_row(r.name, "x".join(map(str, r.shape)), f"{r.type_in}->{r.type_out}" if r.type_in != r.type_out else r.type_out,
                      f"{r.bpw:.3f}", f"{r.bytes_out:,}", f"{r.rmse:.3g}", f"{r.max_abs_err:.3g}", f"{r.cosine:.6f}")
        out.table(t)
        if alloc is not None:
            out.table(_allocation_table(alloc))
    d = rep.to_dict()
    out.info(f"{src}: {rep.bytes_in / 2**20:.2f} MiB -> {dst}: {rep.bytes_out / 2**20:.2f} MiB of tensors "
             f"({_size_change(rep.ratio)}, {d['bpw']:.2f} bits/weight) in {rep.seconds:.2f} s"
             + (f"; {rep.fallbacks} tensor(s) fell back to another type (row length)" if rep.fallbacks else ""))


class StageBars:
    """The pipeline's progress callback (stage, done, total, note): one bar per stage on stderr."""

    def __init__(self):
        self.stage, self.ctx, self.bar = None, None, None

    def __call__(self, stage: str, done: int, total: int, note: str = "") -> None:
        if stage != self.stage:
            self.close()
            self.stage, self.ctx = stage, progress_bar(stage)
            self.bar = self.ctx.__enter__()
        self.bar(done, total, note)

    def close(self) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(None, None, None)
            self.ctx = None


def _overrides(output_type, embd_type, specs):
    """llama-quantize's type options as the library's Overrides (--tensor-type is PATTERN=TYPE)."""
    from llmkit.errors import BadInput
    from llmkit.quant.plan.rules import Overrides

    pairs = []
    for spec in specs:
        pattern, sep, t = spec.partition("=")
        if not sep or not pattern or not t:
            raise BadInput(f"--tensor-type {spec!r} should be PATTERN=TYPE, e.g. attn_v=Q8_0.")
        pairs.append((pattern, t))
    return Overrides(output_type, embd_type, pairs)


def _allocation_table(alloc):
    """Why each tensor got its type: its weighted error, the kind's sensitivity, and what the next
    smaller candidate would have cost in predicted error per byte saved."""
    from rich.table import Table

    t = Table(title=f"allocation ({alloc.sensitivity_source} sensitivity; predicted {alloc.predicted:.4g})")
    for col in ("tensor", "kind", "type", "bytes", "weighted error", "sensitivity", "next smaller: +error/byte"):
        t.add_column(col, justify="left" if col in ("tensor", "kind", "type") else "right")
    for i in alloc.items:
        if i.fixed is not None:
            continue
        s = alloc.sensitivity.get(i.kind, 1.0)
        smaller = [c for c in i.bytes if i.bytes[c] < i.bytes[i.chosen]]
        why = ""
        if smaller:
            c = max(smaller, key=lambda c: i.bytes[c])
            why = f"{c}: {s * (i.error[c] - i.error[i.chosen]) / (i.bytes[i.chosen] - i.bytes[c]):.3g}"
        t.add_row(i.name, i.kind, i.chosen, f"{i.bytes[i.chosen]:,}", f"{i.error[i.chosen]:.4g}", f"{s:.3g}", why)
    return t


def parse_size(text: str) -> int:
    """'3.5G' -> bytes (K/M/G/T, base 1024); a plain number is bytes."""
    t = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if mult > 1 else t)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a size; write bytes or e.g. 900M, 1.5G.", param_hint="--target-size")
    if value <= 0:
        raise click.BadParameter(f"{text!r} must be positive.", param_hint="--target-size")
    return int(value * mult)


def _size_change(ratio: float) -> str:
    """The output's size against the input's (ratio = bytes in / out): requantizing to a wider type
    makes the file larger, which "0.7x smaller" would hide."""
    return f"{ratio:.2f}x smaller" if ratio >= 1 else f"{1 / ratio:.2f}x larger"
