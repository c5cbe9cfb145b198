"""`llmkit generate`: stream text from a local GGUF model through llama.cpp (in-process).

Constrained output is `llmkit constrain`, generation on llama-servers `llmkit server generate|batch`; the
old spellings (`generate --grammar ...`, `generate --server ...`) are forwarded there with a note.
"""

from __future__ import annotations

import sys

import click

from llmkit.commands._common import Output, read_prompt, stdout_stream
from llmkit.commands.deprecated import REMOVED_IN, Renamed, renamed
from llmkit.commands.llama_options import (chat_options, draft_options, model_options, open_for_prompt,
                                           sampling_options, stats_line)

_CONSTRAINED = ("--grammar", "--grammar-file", "--json-schema")


class _Generate(click.Command):
    """`generate`, which forwards the modes that became their own commands (until 0.3)."""

    def make_context(self, info_name, args, parent=None, **extra):
        args = list(args)
        target = _forwarded(args)
        if target is None or parent is None:
            return super().make_context(info_name, args, parent=parent, **extra)
        path, new_args = target
        root = parent.find_root().command
        cmd = root.get_command(parent, path[0])
        for name in path[1:]:
            cmd = cmd.commands[name]
        click.echo(f"Note: `llmkit generate {_trigger(args)}` is now `llmkit {' '.join(path)}`; the old spelling "
                   f"works until llmkit {REMOVED_IN}.", err=True)
        return cmd.make_context(path[-1], new_args, parent=parent, **extra)


def _flag_in(args: list[str], flag: str) -> bool:
    """Is `flag` among the options (before a `--`)?"""
    options = args[:args.index("--")] if "--" in args else args
    return any(a == flag or a.startswith(flag + "=") for a in options)


def _trigger(args: list[str]) -> str:
    if _flag_in(args, "--server"):
        return "--server --batch" if _flag_in(args, "--batch") else "--server"
    return next(f for f in _CONSTRAINED if _flag_in(args, f))


def _forwarded(args: list[str]):
    """((command path), its arguments) for a mode that moved out of generate, else None."""
    if _flag_in(args, "--server"):
        out, i = [], 0
        batch = None
        while i < len(args):
            a = args[i]
            if a == "--slot-id" and i + 1 < len(args):
                out += ["--slot", args[i + 1]]
                i += 2
                continue
            if a.startswith("--slot-id="):
                out.append("--slot=" + a.split("=", 1)[1])
            elif a == "--batch" and i + 1 < len(args):
                batch = args[i + 1]
                i += 2
                continue
            elif a.startswith("--batch="):
                batch = a.split("=", 1)[1]
            else:
                out.append(a)
            i += 1
        if batch is not None:
            return ("server", "batch"), out + [batch]
        return ("server", "generate"), out
    if any(_flag_in(args, f) for f in _CONSTRAINED):
        return ("constrain",), args
    return None


@renamed(Renamed("--slot", "--prompt-cache"), Renamed("--slot-dir", "--prompt-cache"))
@click.command("generate", cls=_Generate)
@click.argument("prompt", required=False)
@model_options(loading=True)
@sampling_options()
@chat_options
@click.option("--context-shift", is_flag=True, help="Drop the oldest tokens when the context fills instead of stopping.")
@click.option("--keep", default=0, show_default=True, type=int, help="Tokens at the start never dropped by --context-shift.")
@draft_options
@click.option("--prompt-cache", "prompt_cache", type=click.Path(),
              help="KV prompt cache: a slot file (reuse its longest common prefix) or a directory (reuse the slot "
                   "sharing the longest prefix, save the new one).")
@click.option("--cache-reuse", default=0, show_default=True, type=int,
              help="With --prompt-cache: also reuse cached chunks of >= N tokens after a change, shifting them.")
@click.option("--json", "as_json", is_flag=True, help="Print text and statistics as one JSON object.")
def command(prompt, model_path, opts, sampling, chat, system, context_shift, keep, drafting, prompt_cache, cache_reuse,
            as_json):
    """Generate text from PROMPT (or stdin) with llama.cpp in this process, streaming to stdout.

    \b
    llmkit generate "The capital of France is"
    llmkit generate -m big.gguf --draft-model small.gguf --temp 0 "def fib(n):"
    echo "Rewrite this sentence." | llmkit generate --chat --lookup 3 -
    llmkit generate -m model.gguf --prompt-cache cache/ "$(cat system.txt) Question: ..."
    """
    prompt = read_prompt(prompt)
    path, model, prompt, tokens = open_for_prompt(model_path, opts, prompt, chat, system)
    stream = stdout_stream(not as_json)
    cache, slot_note = None, ""
    if prompt_cache:
        from llmkit.kv.prompt_cache import PromptCache

        cache = PromptCache(prompt_cache)
        slot_note = cache.restore(model, path, opts, tokens)
    from llmkit.llama import runtime
    from llmkit.llama.generate import Generator

    # opened only once drafting is chosen: where it cannot pay, it is never loaded
    draft = drafting.model(lambda p: runtime.open_model(p, opts))
    gen = Generator(model, sampling.params, draft=draft, drafting=drafting, ignore_eos=sampling.ignore_eos,
                    context_shift=context_shift, keep=keep)
    text, stats = gen.run(tokens, sampling.n_predict, sampling.stop, on_text=stream, reuse_cache=bool(prompt_cache),
                          cache_reuse=cache_reuse)
    if cache is not None:
        slot_note += cache.save(model, path, opts, prompt + text)
    out = Output()
    if as_json:
        out.json({"model": path, "text": text, "stats": stats.to_dict(), "peak_rss_bytes": runtime.peak_rss(),
                  **({"slot": slot_note} if slot_note else {})})
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    out.info(_summary(stats.to_dict(), slot_note))


def _summary(d: dict, slot_note: str) -> str:
    """The run's statistics for stderr: speed, then drafting's and the KV slot's when they played a part."""
    line = stats_line(d)
    if d.get("drafted"):
        line += (f"\ndrafted {d['drafted']}, accepted {d['accepted']} ({100 * d['acceptance']:.0f}%), "
                 f"{d['mean_accepted_per_step']:.2f} accepted per target step, draft {d['draft_s']:.2f} s, "
                 f"verify {d['verify_s']:.2f} s")
    if slot_note or d.get("prefill_reused"):
        line += (f"\nKV slot: {slot_note} reused {d['prefill_reused']} prompt tokens ({d['shifted']} by shifting); "
                 f"time to first token {d['ttft_s'] * 1000:.0f} ms")
    return line
