"""`llmkit quant [quantize] IN --type TYPE -o OUT`: take the run's options (built by
llmkit.commands.quant.options), run the library's pipeline (llmkit.quant.pipeline.quantize), print the report."""

from __future__ import annotations

import click

from llmkit.commands._common import Output, progress_bar
from llmkit.commands.deprecated import Renamed, not_a_number, renamed
from llmkit.commands.quant.base import group
from llmkit.commands.quant.options import quant_options, spelling


@renamed(Renamed("-t", "--type", when=not_a_number), Renamed("--ctx", "--ctx-size"))
@group.command("quantize")
@click.argument("src", metavar="IN.gguf", type=click.Path(dir_okay=False))
@quant_options
def quantize_cmd(src, dst, report, as_json, opts):
    """Quantize IN.gguf to TYPE, writing OUT.gguf (the same bytes llama.cpp's quantizer writes); or
    choose each tensor's type under a size budget (--target-bpw / --target-size)."""
    from llmkit.errors import BadInput, OptionError
    from llmkit.quant.pipeline import quantize

    opts.measure = report or as_json
    opts.progress = bars = StageBars()
    try:
        run = quantize(src, dst, opts)
    except OptionError as e:
        raise BadInput(e.spelled(spelling())) from e
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


def _size_change(ratio: float) -> str:
    """The output's size against the input's (ratio = bytes in / out): requantizing to a wider type
    makes the file larger, which "0.7x smaller" would hide."""
    return f"{ratio:.2f}x smaller" if ratio >= 1 else f"{1 / ratio:.2f}x larger"
