"""The options of `llmkit quant [quantize]`, declared once: `quant_options` adds them to the command and
passes one `llmkit.quant.options.QuantOptions` (checked, its imatrix and calibration text loaded) as
`opts`; the output path and the report's form (`dst`, `report`, `as_json`) stay the command's own."""

from __future__ import annotations

import click

from llmkit.commands._common import bundle, flag_spelling, size_value
from llmkit.quant.options import METHODS, QuantOptions  # light: the defaults live in the dataclass

OWN = ("dst", "report", "as_json")  # declared here to keep --help's order, used by the command itself


def spelling() -> dict[str, str]:
    """The library's option names as this command's flags, for OptionError messages."""
    return flag_spelling(click.get_current_context().command, {"calib_text": "--calib", "imatrix": "--imatrix"})


def parse_size(text: str) -> int:
    """--target-size's bytes (`size_value`: K/M/G/T, base 1024, decimals)."""
    return size_value(text, "--target-size")


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


def _build(ftype, pure, imatrix_path, allow_requantize, threads, output_type, embd_type, tensor_types, target_bpw,
           target_size, calib_path, n_ctx, chunks, method, hessian_path, damp, shrink, no_refit):
    """The run's QuantOptions: checked on the options alone (a usage error), then the imatrix and the
    calibration text read."""
    from llmkit.commands._common import Output
    from llmkit.errors import OptionError

    opts = QuantOptions(ftype=ftype, pure=pure, allow_requantize=allow_requantize, threads=threads,
                        overrides=_overrides(output_type, embd_type, tensor_types), target_bpw=target_bpw,
                        target_size=parse_size(target_size) if target_size is not None else None,
                        calib_text="" if calib_path else None, n_ctx=n_ctx, chunks=chunks, method=method,
                        hessian_path=hessian_path, damp=damp, refit=not no_refit, shrink=shrink,
                        notice=Output().info)  # a kernel's first compilation takes seconds: say so on stderr
    try:
        opts.check()  # the options alone, before any file is read
    except OptionError as e:
        raise click.UsageError(e.spelled(spelling())) from None
    if imatrix_path:
        from llmkit.quant.calibration.imatrix import load_imatrix

        opts.imatrix = load_imatrix(imatrix_path)
    if calib_path:
        from llmkit.io import read_text

        opts.calib_text = read_text(calib_path)
    return opts


quant_options = bundle("opts", [
    click.option("--type", "ftype",
                 help="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q1_0 Q2_0 Q2_K Q2_K_S Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M "
                      "Q5_K_S Q5_K_M Q6_K IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_XS IQ3_S IQ3_M IQ4_NL IQ4_XS "
                      "TQ1_0 TQ2_0 MXFP4_MOE (IQ1_*, IQ2_*, IQ3_XXS, IQ3_XS and Q2_K_S need --imatrix; not with "
                      "--target-bpw/--target-size)."),
    click.option("-o", "--output", "dst", required=True, type=click.Path(dir_okay=False), help="Output GGUF path."),
    click.option("--pure", is_flag=True, help="Every quantizable tensor gets TYPE (no _S/_M/_L mixture, no Q6_K output)."),
    click.option("--imatrix", "imatrix_path", type=click.Path(dir_okay=False), help="Importance matrix (GGUF or legacy .dat)."),
    click.option("--allow-requantize", is_flag=True, help="Allow re-quantizing tensors that are already quantized."),
    click.option("-t", "--threads", type=int, help="Worker threads (default: all cores)."),
    click.option("--report", is_flag=True, help="Per-tensor table: type, bits/weight, bytes, RMSE, max error, cosine."),
    click.option("--json", "as_json", is_flag=True, help="The report as one JSON object."),
    click.option("--output-tensor-type", "output_type", metavar="TYPE", help="Type for output.weight (as llama-quantize)."),
    click.option("--token-embedding-type", "embd_type", metavar="TYPE", help="Type for token_embd.weight."),
    click.option("--tensor-type", "tensor_types", metavar="PATTERN=TYPE", multiple=True,
                 help="Type for tensors whose name matches the regex PATTERN (repeatable; first match wins)."),
    click.option("--target-bpw", type=float, help="Choose each tensor's type so the tensors average B bits per weight."),
    click.option("--target-size", help="Choose each tensor's type so the file fits SIZE bytes (K/M/G suffixes, base 1024)."),
    click.option("--calib", "calib_path", type=click.Path(dir_okay=False),
                 help="Calibration text: --target-* probes each tensor kind's effect on the output (KLD) on it "
                      "(without it, on text the model writes itself); --method gptq collects its Hessians from it."),
    click.option("-c", "--ctx-size", "n_ctx", default=None, type=int,
                 help="Tokens per calibration chunk (default: 32 for the budget's probes, 256 for GPTQ's Hessians)."),
    click.option("--chunks", default=None, type=int, help="Calibration chunks (default: 4 for the probes, 16 for GPTQ)."),
    click.option("--method", type=click.Choice(list(METHODS)), default=QuantOptions.method, show_default=True,
                 help="rtn: llama.cpp's rounding (byte-identical); gptq: error-compensating rounding with Hessians "
                      "from --calib (Q2_K..Q6_K, Q4_0 matrices; not byte-identical by design)."),
    click.option("--hessian", "hessian_path", type=click.Path(dir_okay=False),
                 help="GPTQ: read the Hessians from this file, or collect them from --calib and save them here."),
    click.option("--damp", default=QuantOptions.damp, show_default=True, type=float, help="GPTQ dampening (x mean diagonal of H)."),
    click.option("--shrink", default=None, type=float,
                 help="GPTQ: add this x diag(H) to H, shrinking the correlations that calibration text estimates "
                      "worst (default 3; 0: the plain algorithm)."),
    click.option("--no-refit", is_flag=True, help="GPTQ: fit each block's scales once on the original weights."),
], _build, own=OWN)
