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
@click.option("-t", "--type", "qtype",
              help="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K "
                   "IQ4_NL IQ4_XS (not with --target-bpw/--target-size).")
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
@click.option("--target-bpw", type=float, help="Choose each tensor's type so the tensors average B bits per weight.")
@click.option("--target-size", help="Choose each tensor's type so the file fits SIZE bytes (K/M/G suffixes, base 1024).")
@click.option("--calib", "calib_path", type=click.Path(dir_okay=False),
              help="Calibration text: --target-* probes each tensor kind's effect on the output (KLD); "
                   "--method gptq collects its Hessians from it.")
@click.option("-c", "--ctx", "n_ctx", default=256, show_default=True, type=int, help="Calibration chunk size.")
@click.option("--chunks", default=None, type=int, help="Calibration chunks (default: 4 for probes, 16 for GPTQ).")
@click.option("--method", type=click.Choice(["rtn", "gptq"]), default="rtn", show_default=True,
              help="rtn: llama.cpp's rounding (byte-identical); gptq: error-compensating rounding with Hessians "
                   "from --calib (Q2_K..Q6_K, Q4_0 matrices; not byte-identical by design).")
@click.option("--hessian", "hessian_path", type=click.Path(dir_okay=False),
              help="GPTQ: read the Hessians from this file, or collect them from --calib and save them here.")
@click.option("--damp", default=0.01, show_default=True, type=float, help="GPTQ dampening (x mean diagonal of H).")
@click.option("--no-refit", is_flag=True, help="GPTQ: fit each block's scales once on the original weights.")
def quantize_cmd(src, qtype, dst, pure, imatrix_path, allow_requantize, threads, report, as_json, output_type,
                 embd_type, tensor_types, target_bpw, target_size, calib_path, n_ctx, chunks, method, hessian_path,
                 damp, no_refit):
    """Quantize IN.gguf to TYPE, writing OUT.gguf (the same bytes llama.cpp's quantizer writes); or
    choose each tensor's type under a size budget (--target-bpw / --target-size)."""
    from llmkit.quant.quantize import quantize_file
    from llmkit.quant.rules import Overrides

    out = Output()
    targeted = target_bpw is not None or target_size is not None
    if targeted and qtype:
        raise click.UsageError("-t TYPE and --target-bpw/--target-size exclude each other: the budget chooses the types.")
    if not targeted and not qtype:
        raise click.UsageError("give -t TYPE, or a budget with --target-bpw / --target-size.")
    if target_bpw is not None and target_size is not None:
        raise click.UsageError("give --target-bpw or --target-size, not both.")
    overrides = Overrides.parse(output_type, embd_type, tensor_types)
    imx = None
    if imatrix_path:
        from llmkit.quant.imatrix import load_imatrix

        imx = load_imatrix(imatrix_path)
    assign = extra = replace = None
    calib = None
    if calib_path:
        from llmkit.io import read_text

        calib = read_text(calib_path)
    hpath = None
    if method == "gptq":
        import os
        import tempfile

        from llmkit.quant import gptq

        hpath = hessian_path
        if not hpath or not os.path.exists(hpath):
            if calib is None:
                raise click.UsageError("--method gptq needs --calib TEXT (or an existing --hessian file).")
            if not hpath:
                tmpdir = tempfile.mkdtemp(prefix="llmkit-gptq-")
                hpath = os.path.join(tmpdir, "hessians.gguf")
            with progress_bar("hessians") as bar:
                gptq.collect_hessians(src, calib, hpath, n_ctx, chunks or 16, threads,
                                      progress=lambda d, n: bar(d, n, "calibration"))
    if targeted:
        from llmkit.quant import allocate as A

        size = _parse_size(target_size) if target_size is not None else None
        with progress_bar("measuring") as bar:
            alloc = A.allocate(src, target_bpw=target_bpw, target_size=size, imatrix=imx, calib_text=calib,
                               threads=threads, progress=lambda i, n, name: bar(i, n, name), n_ctx=n_ctx,
                               chunks=chunks or 4, hessian_path=hpath)
        assign, qtype = alloc.assign, A.file_type_for(alloc)
        extra = {A.RECIPE_KEY: A.recipe(alloc, target_bpw, size, imx is not None, method)}
        allow_requantize = True  # a budget may keep already-quantized tensors at (or near) their type
        out.info(f"allocation: {len(assign)} tensors, {alloc.used:,} of {alloc.budget:,} bytes, sensitivity "
                 f"{alloc.sensitivity_source}, {alloc.seconds:.1f} s")
    if method == "gptq":
        from llmkit.quant.quantize import plan_types

        types = plan_types(src, qtype, pure, imx is not None, overrides, assign)
        with progress_bar("gptq") as bar:
            replace, raised = gptq.gptq_replacements(src, types, hpath, imx, damp, not no_refit, threads,
                                                     progress=lambda i, n, name: bar(i, n, name))
        assign = types
        extra = {**(extra or {}), "llmkit.quantize.method": "gptq"}
        out.info(f"GPTQ: {len(replace)} matrices error-compensated (not byte-identical to llama.cpp by design)"
                 + (f"; dampening raised for {len(raised)}: " + ", ".join(f"{k} ({v:g})" for k, v in list(raised.items())[:3])
                    if raised else ""))
    with progress_bar("quantizing") as bar:
        rep = quantize_file(src, dst, qtype, pure=pure, imatrix=imx, allow_requantize=allow_requantize,
                            threads=threads, measure=report or as_json, progress=lambda i, n, name: bar(i, n, name),
                            overrides=overrides, assign=assign, extra_meta=extra, replace=replace)
    if as_json:
        d = rep.to_dict()
        if targeted:
            d["allocation"] = alloc.to_dict()
        out.json(d)
    elif report:
        from rich.table import Table

        t = Table(title=f"{src} -> {dst} ({rep.ftype})")
        for col in ("tensor", "shape", "type", "bpw", "bytes", "RMSE", "max err", "cosine"):
            t.add_column(col, justify="left" if col in ("tensor", "shape", "type") else "right")
        for r in rep.tensors:
            t.add_row(r.name, "x".join(map(str, r.shape)), f"{r.type_in}->{r.type_out}" if r.type_in != r.type_out else r.type_out,
                      f"{r.bpw:.3f}", f"{r.bytes_out:,}", f"{r.rmse:.3g}", f"{r.max_abs_err:.3g}", f"{r.cosine:.6f}")
        out.table(t)
        if targeted:
            out.table(_allocation_table(alloc))
    d = rep.to_dict()
    out.info(f"{src}: {rep.bytes_in / 2**20:.2f} MiB -> {dst}: {rep.bytes_out / 2**20:.2f} MiB of tensors "
             f"({rep.ratio:.2f}x smaller, {d['bpw']:.2f} bits/weight) in {rep.seconds:.2f} s"
             + (f"; {rep.fallbacks} tensor(s) fell back to another type (row length)" if rep.fallbacks else ""))


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


def _parse_size(text: str) -> int:
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
@click.argument("text_path", metavar="FILE", type=click.Path(dir_okay=False), required=False)
@click.option("-c", "--ctx", "n_ctx", default=512, show_default=True, type=int)
@click.option("--chunks", default=0, type=int, help="Score at most N chunks (0 = all).")
@click.option("--save-logits", "save_logits", type=click.Path(dir_okay=False),
              help="Write the (one) model's log-probabilities in llama-perplexity's --kl-divergence-base format.")
@click.option("--kld", "kld_base", type=click.Path(dir_okay=False, exists=True),
              help="KL divergence of each model against this base file (its tokens; FILE is not needed).")
@click.option("--threads", type=int)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per model, one per line.")
def ppl_cmd(models, text_path, n_ctx, chunks, save_logits, kld_base, threads, as_json):
    """Perplexity of each model on FILE through llama.cpp (chunked like llama-perplexity); with a
    saved base, KL divergence and the other statistics llama-perplexity prints.

    \b
    llmkit quant ppl -m base-f16.gguf --save-logits base.kld wiki.txt -c 512
    llmkit quant ppl -m q4_k_m.gguf -m q3_k_m.gguf --kld base.kld
    """
    out = Output(jsonl=as_json)
    if save_logits and kld_base:
        raise click.UsageError("--save-logits writes a base file and --kld reads one: run them separately.")
    if kld_base:
        return _kld_report(out, models, kld_base, threads, as_json)
    if not text_path:
        raise click.UsageError("give the text FILE to score (or --kld BASE_FILE).")
    from llmkit.io import read_text

    text = read_text(text_path)
    if save_logits:
        if len(models) != 1:
            raise click.UsageError("--save-logits takes exactly one -m model (the base).")
        from llmkit.quant.kld import save_base

        with progress_bar("base logits") as bar:
            r = save_base(models[0], text, save_logits, n_ctx, chunks, threads, progress=lambda d, n: bar(d, n, ""))
        if as_json:
            out.record(r)
        else:
            out.data(f"{r['model']}\tPPL {r['ppl']:.4f} ± {r['ppl_uncertainty']:.4f}\t({r['tokens_scored']} tokens in "
                     f"{r['chunks']} chunks of {r['n_ctx']}; log-probabilities written to {save_logits})")
        return
    from llmkit.quant.evaluate import perplexity

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


def _kld_report(out, models, base, threads, as_json) -> None:
    from rich.table import Table

    from llmkit.quant.kld import kl_divergence

    results = []
    for m in models:
        with progress_bar(f"kld {m}") as bar:
            r = kl_divergence(m, base, threads, progress=lambda d, n: bar(d, n, ""))
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
