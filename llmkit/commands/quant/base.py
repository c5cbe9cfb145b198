"""The `llmkit quant` group: `llmkit quant IN --type TYPE -o OUT` is short for `llmkit quant quantize ...`."""

from __future__ import annotations

import click


class _QuantGroup(click.Group):
    """`llmkit quant IN --type TYPE -o OUT` runs `quantize`; the other words are subcommands."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["quantize", *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx, formatter):
        formatter.write_usage("llmkit quant", "IN.gguf --type TYPE -o OUT.gguf [OPTIONS] | COMMAND [ARGS]...")


@click.group("quant", cls=_QuantGroup)
def group():
    """Quantize GGUF weights byte-identically to llama.cpp; report sizes and errors.

    \b
    llmkit quant model-f16.gguf --type Q4_K_M -o model-q4_k_m.gguf --report
    llmkit quant imatrix -m model-f16.gguf --text calib.txt -o imatrix.gguf
    llmkit quant model-f16.gguf --type Q4_K_M --imatrix imatrix.gguf -o model-q4_k_m.gguf
    llmkit quant compare model-f16.gguf model-q4_k_m.gguf
    llmkit quant ppl -m model-f16.gguf -m model-q4_k_m.gguf wiki.txt
    """
