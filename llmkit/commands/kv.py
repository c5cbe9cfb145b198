"""`llmkit kv`: plan KV-cache memory; save, restore, list, show and erase KV slots."""

from __future__ import annotations

import sys

import click

from llmkit.commands._common import Output, settings


@click.group("kv")
def group():
    """KV cache: memory planning and slots saved to disk (prompt caching across runs)."""


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


@group.command("plan")
@click.option("-m", "--model", "model_path", required=True, help="GGUF model (only its metadata is read).")
@click.option("-c", "--ctx-size", "ctxs", multiple=True, type=int, help="Context size (repeatable; default: min(2048, training)).")
@click.option("--parallel", "-np", default=1, show_default=True, type=int, help="Sequences (slots) in parallel.")
@click.option("--ctk", "cache_type_k", default="f16", show_default=True)
@click.option("--ctv", "cache_type_v", default="f16", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def plan_cmd(model_path, ctxs, parallel, cache_type_k, cache_type_v, as_json):
    """Bytes of KV cache, weights and total for a model and settings, plus the bandwidth-bound decode speed.

    \b
    llmkit kv plan -m model.gguf -c 2048 -c 8192 -c 32768 --ctk q8_0 --ctv q8_0
    """
    from llmkit.kv.plan import measured_bandwidth, plan

    bw = measured_bandwidth()
    plans = [plan(model_path, c, parallel, cache_type_k, cache_type_v, bandwidth_gbs=bw) for c in (ctxs or (None,))]
    out = Output()
    if as_json:
        out.json([p.to_dict() for p in plans])
        return
    from rich.table import Table

    p0 = plans[0]
    t = Table(title=f"{p0.architecture}, {p0.n_layer} layers, kv heads {sorted(set(p0.head_count_kv))}, head dim "
                    f"{p0.head_dim_k}/{p0.head_dim_v}, weights {_human(p0.weights_bytes)}, read bandwidth {bw:.1f} GB/s")
    for col in ("n_ctx", "cells", "seqs", "K", "V", "KV total", "per token", "weights+KV", "decode bound (full ctx)"):
        t.add_column(col, justify="right")
    for p in plans:
        bound = p.decode_bound_tok_s()
        t.add_row(str(p.n_ctx), str(p.n_ctx_cells), str(p.n_seq), _human(p.k_bytes), _human(p.v_bytes), _human(p.kv_bytes),
                  _human(p.kv_bytes_per_token), _human(p.total_bytes), f"{bound:.1f} tok/s" if bound else "-")
    out.table(t)


def _model_opts(n_ctx, cache_type_k, cache_type_v, flash_attn, threads):
    from llmkit.llama import runtime

    return runtime.ModelOptions(n_ctx=n_ctx, n_threads=threads, cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                                flash_attn=flash_attn, verbose=settings().debug)


def model_options(f):
    for opt in reversed([
        click.option("-m", "--model", "model_path", help="GGUF model (default: LLMKIT_MODEL or the packaged SmolLM2)."),
        click.option("-c", "--ctx-size", "n_ctx", type=int, default=None, help="Context size."),
        click.option("--ctk", "cache_type_k", default="f16", show_default=True),
        click.option("--ctv", "cache_type_v", default="f16", show_default=True),
        click.option("--flash-attn", is_flag=True),
        click.option("-t", "--threads", type=int),
    ]):
        f = opt(f)
    return f


@group.command("save")
@model_options
@click.argument("prompt", required=False)
@click.option("--prompt-file", type=click.Path(dir_okay=False, exists=True), help="Read the prompt from a file.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Slot file to write.")
def save_cmd(model_path, n_ctx, cache_type_k, cache_type_v, flash_attn, threads, prompt, prompt_file, output):
    """Evaluate PROMPT and save its KV state (with the tokens) to a slot file.

    \b
    llmkit kv save -m model.gguf --prompt-file system.txt -o system.slot
    """
    import time

    from llmkit.kv.slots import save_slot
    from llmkit.llama import runtime

    text = _read_prompt(prompt, prompt_file)
    opts = _model_opts(n_ctx, cache_type_k, cache_type_v, flash_attn, threads)
    path = model_path or runtime.default_model_path()
    model = runtime.open_model(path, opts, logits_all=False)
    tokens = model.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    if len(tokens) >= model.n_ctx():
        from llmkit.errors import BadInput

        raise BadInput(f"the prompt has {len(tokens)} tokens but the context holds {model.n_ctx()}. Raise -c.")
    t = time.perf_counter()
    model.eval(tokens)
    dt = time.perf_counter() - t
    hdr = save_slot(model, output, path, opts, text=text)
    import os

    Output().info(f"saved {hdr.n_tokens} tokens ({os.path.getsize(output)} bytes) to {output}; prefill took {dt * 1000:.0f} ms")


def _read_prompt(prompt, prompt_file) -> str:
    if prompt_file:
        from llmkit.io import read_text

        return read_text(prompt_file)
    if prompt is None or prompt == "-":
        if prompt is None and sys.stdin.isatty():
            raise click.UsageError("no prompt given. Pass it as an argument, --prompt-file, or '-' / a pipe.")
        return sys.stdin.read()
    return prompt


@group.command("ls")
@click.argument("directory", default=".")
@click.option("--json", "as_json", is_flag=True)
def ls_cmd(directory, as_json):
    """List the slot files in DIRECTORY: model, tokens, size, created."""
    from llmkit.kv.slots import list_slots

    rows = list_slots(directory)
    out = Output()
    if as_json:
        for path, h, size in rows:
            out.record({"path": path, "model": h.model_path, "tokens": h.n_tokens, "bytes": size, "created": h.created,
                        "n_ctx": h.n_ctx, "cache_type_k": h.cache_type_k, "cache_type_v": h.cache_type_v})
        return
    for path, h, size in rows:
        out.data(f"{path}\t{h.n_tokens} tokens\t{_human(size)}\t{h.created}\t{h.model_path}")


@group.command("show")
@click.argument("slot")
@click.option("--json", "as_json", is_flag=True, help="The header as JSON (with the token ids).")
def show_cmd(slot, as_json):
    """Print the text cached in a slot (or its header with --json)."""
    from dataclasses import asdict

    from llmkit.kv.slots import read_header

    h, _ = read_header(slot)
    if as_json:
        Output().json(asdict(h))
    else:
        sys.stdout.write(h.text)
        sys.stdout.flush()


@group.command("erase")
@click.argument("slots", nargs=-1, required=True)
def erase_cmd(slots):
    """Delete slot files (only files that really are llmkit slots)."""
    import os

    from llmkit.kv.slots import read_header

    for s in slots:
        read_header(s)  # refuses anything that is not a slot
        os.unlink(s)
        Output().info(f"erased {s}")


@group.command("restore")
@model_options
@click.argument("slot")
@click.argument("prompt", required=False)
@click.option("-n", "--n-predict", default=64, show_default=True, type=int)
@click.option("--temp", default=0.0, show_default=True, type=float)
@click.option("--json", "as_json", is_flag=True)
def restore_cmd(model_path, n_ctx, cache_type_k, cache_type_v, flash_attn, threads, slot, prompt, n_predict, temp, as_json):
    """Restore SLOT and continue with PROMPT appended to its text (only new tokens are evaluated)."""
    from llmkit.commands.generate import run_with_slot

    run_with_slot(model_path, _model_opts(n_ctx, cache_type_k, cache_type_v, flash_attn, threads), slot, None,
                  prompt or "", n_predict, temp, as_json, append=True)
