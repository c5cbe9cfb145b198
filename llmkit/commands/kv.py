"""`llmkit kv`: plan KV-cache memory; save, restore, list, show and erase KV slots."""

from __future__ import annotations

import sys

import click

from llmkit.commands._common import Output, read_prompt, settings


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
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Slot file to write.")
@click.option("--server", help="Drive a running llama-server instead (URL); NAME is then the file name in its --slot-save-path.")
@click.option("--slot", "slot_id", type=int, default=0, show_default=True, help="With --server: the server slot.")
@click.option("--raw", is_flag=True, help="Write llama.cpp's own state format (what llama-server restores; no llmkit header).")
def save_cmd(model_path, n_ctx, cache_type_k, cache_type_v, flash_attn, threads, prompt, prompt_file, output, server, slot_id,
             raw):
    """Evaluate PROMPT and save its KV state (with the tokens) to a slot file.

    \b
    llmkit kv save -m model.gguf --prompt-file system.txt -o system.slot
    llmkit kv save --server http://127.0.0.1:8080 --slot 0 system.bin
    """
    import time

    if server:
        name = output or prompt
        if not name:
            raise click.UsageError("with --server give the file name: llmkit kv save --server URL --slot 0 NAME.bin")
        from llmkit.kv.server import LlamaServer

        r = LlamaServer(server).slot_action(slot_id, "save", name)
        Output().info(f"server slot {slot_id}: saved {r.get('n_saved', '?')} tokens ({r.get('n_written', '?')} bytes) to {name}")
        return
    if not output:
        raise click.UsageError("give -o NAME.slot for the slot file to write.")

    from llmkit.kv.slots import save_slot
    from llmkit.llama import runtime

    text = read_prompt(prompt, prompt_file)
    opts = _model_opts(n_ctx, cache_type_k, cache_type_v, flash_attn, threads)
    path = model_path or runtime.default_model_path()
    model = runtime.open_model(path, opts, logits_all=False)
    tokens = model.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    if len(tokens) >= model.n_ctx():
        from llmkit.errors import BadInput

        raise BadInput(f"the prompt has {len(tokens)} tokens but the context holds {model.n_ctx()}. Raise -c.")
    from llmkit.llama.generate import eval_no_logits

    t = time.perf_counter()
    eval_no_logits(model, tokens)
    dt = time.perf_counter() - t
    import os

    if raw:
        from llmkit.kv.slots import save_raw

        n_saved = save_raw(model, output)
    else:
        n_saved = save_slot(model, output, path, opts, text=text).n_tokens
    Output().info(f"saved {n_saved} tokens ({os.path.getsize(output)} bytes) to {output}; prefill took {dt * 1000:.0f} ms")


@group.command("ls")
@click.argument("directory", default=".")
@click.option("--json", "as_json", is_flag=True)
@click.option("--server", help="List a running llama-server's slots instead (GET /slots).")
def ls_cmd(directory, as_json, server):
    """List the slot files in DIRECTORY: model, tokens, size, created."""
    from llmkit.kv.slots import list_slots

    out = Output()
    if server:
        from llmkit.kv.server import LlamaServer

        for sl in LlamaServer(server).slots():
            if as_json:
                out.record(sl)
            else:
                out.data(f"slot {sl.get('id')}\tn_ctx {sl.get('n_ctx')}\t{'busy' if sl.get('is_processing') else 'idle'}")
        return
    rows = list_slots(directory)
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
@click.argument("slots", nargs=-1)
@click.option("--server", help="Erase a running llama-server's slot instead.")
@click.option("--slot", "slot_id", type=int, default=0, show_default=True, help="With --server: the server slot.")
def erase_cmd(slots, server, slot_id):
    """Delete slot files (only files that really are llmkit slots), or clear a server slot."""
    import os

    from llmkit.kv.slots import read_header

    if server:
        from llmkit.kv.server import LlamaServer

        r = LlamaServer(server).slot_action(slot_id, "erase")
        Output().info(f"server slot {slot_id}: erased {r.get('n_erased', '?')} tokens")
        return
    if not slots:
        raise click.UsageError("give the slot files to erase (or --server URL --slot N).")

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
@click.option("--server", help="Restore into a running llama-server's slot instead (SLOT = file name there).")
@click.option("--slot", "slot_id", type=int, default=0, show_default=True, help="With --server: the server slot.")
def restore_cmd(model_path, n_ctx, cache_type_k, cache_type_v, flash_attn, threads, slot, prompt, n_predict, temp, as_json,
                server, slot_id):
    """Restore SLOT and continue with PROMPT appended to its text (only new tokens are evaluated)."""
    from llmkit.commands.generate import run_with_slot

    if server:
        from llmkit.kv.server import LlamaServer

        r = LlamaServer(server).slot_action(slot_id, "restore", slot)
        Output().info(f"server slot {slot_id}: restored {r.get('n_restored', '?')} tokens from {slot}")
        return

    run_with_slot(model_path, _model_opts(n_ctx, cache_type_k, cache_type_v, flash_attn, threads), slot, None,
                  prompt or "", n_predict, temp, as_json, append=True)


@group.command("simulate")
@click.argument("trace", required=False)
@click.option("--requests", "n_requests", default=300, show_default=True, help="Built-in trace: number of requests.")
@click.option("--rate", default=4.0, show_default=True, help="Built-in trace: arrivals per second (Poisson).")
@click.option("--prompt-mean", default=160, show_default=True, help="Built-in trace: mean prompt tokens (log-normal).")
@click.option("--output-mean", default=340, show_default=True, help="Built-in trace: mean output tokens (log-normal).")
@click.option("--shared-prefix", default=0, show_default=True, help="Built-in trace: tokens of a common system prompt.")
@click.option("-n", "--samples", default=1, show_default=True, help="Built-in trace: parallel samples / beams per request.")
@click.option("--seed", default=0, show_default=True)
@click.option("--budget-tokens", type=int, help="KV budget in tokens.")
@click.option("--budget-bytes", type=float, help="KV budget in bytes (needs -m to convert to tokens).")
@click.option("-m", "--model", "model_path", help="Model for bytes per token (and --gpu-gb).")
@click.option("--gpu-gb", type=float, help="With -m: budget = GPU memory minus the weights.")
@click.option("--policy", "policies", multiple=True, type=click.Choice(["max", "pow2", "oracle", "paged"]),
              help="Policies to compare (default: all four).")
@click.option("--block-size", default=16, show_default=True)
@click.option("--max-len", default=2048, show_default=True, help="Longest sequence (what 'max' reserves).")
@click.option("--preempt", type=click.Choice(["recompute", "swap"]), default="recompute", show_default=True)
@click.option("--step-ms", default=20.0, show_default=True, help="Simulated time of one decoding step.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG of memory use over time.")
@click.option("--json", "as_json", is_flag=True)
def simulate_cmd(trace, n_requests, rate, prompt_mean, output_mean, shared_prefix, samples, seed, budget_tokens,
                 budget_bytes, model_path, gpu_gb, policies, block_size, max_len, preempt, step_ms, plot_path, as_json):
    """Replay a request trace (JSONL, or the built-in generator) against a KV budget under
    Max / Pow2 / Oracle / Paged allocation and compare memory waste, batch size and throughput.

    \b
    llmkit kv simulate --budget-tokens 20000 --plot kv.png
    llmkit kv simulate trace.jsonl -m model.gguf --gpu-gb 24 --policy paged --preempt swap --json
    """
    import copy

    from llmkit.errors import BadInput
    from llmkit.kv import simulate as sim

    if trace:
        from llmkit.io import read_text, split_lines

        reqs = sim.read_trace(split_lines(read_text(trace)))
    else:
        reqs = sim.synthetic_trace(n_requests, rate, seed, prompt_mean, output_mean, shared_prefix, samples, max_len)
    if budget_tokens is None:
        if not model_path or (budget_bytes is None and gpu_gb is None):
            raise click.UsageError("give --budget-tokens, or -m MODEL with --budget-bytes or --gpu-gb.")
        from llmkit.kv.plan import plan

        p = plan(model_path, max_len)
        per_token = p.kv_bytes_per_token
        if budget_bytes is None:
            budget_bytes = gpu_gb * 1e9 - p.weights_bytes
            if budget_bytes <= 0:
                raise BadInput(f"the weights ({p.weights_bytes / 1e9:.2f} GB) do not fit in {gpu_gb} GB.")
        budget_tokens = int(budget_bytes // per_token)
    results = [sim.simulate(copy.deepcopy(reqs), pol, budget_tokens, block_size, max_len, preempt, step_ms / 1000)
               for pol in (policies or sim.POLICIES)]
    if plot_path:
        sim.plot(results, plot_path)
    out = Output()
    if as_json:
        out.json({"budget_tokens": budget_tokens, "requests": len(reqs), "results": [r.to_dict() for r in results]})
        return
    from rich.table import Table

    t = Table(title=f"{len(reqs)} requests, KV budget {budget_tokens} tokens, block {block_size}")
    for col in ("policy", "used", "reserved", "internal", "external", "waste", "mean batch", "peak", "req/s",
                "prefix hits", "preempt"):
        t.add_column(col, justify="right")
    for r in results:
        d = r.to_dict()
        t.add_row(r.policy, *(f"{100 * d[k]:.1f}%" for k in ("used", "reserved", "internal", "external", "waste")),
                  f"{r.mean_batch:.1f}", str(r.peak_batch), f"{r.throughput_rps:.2f}", f"{100 * r.prefix_hit_rate:.0f}%",
                  str(r.preemptions))
    out.table(t)
