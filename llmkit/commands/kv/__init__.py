"""`llmkit kv`: plan KV-cache memory and simulate allocation policies here; the slot commands
(save, ls, show, erase, restore) are in `slots`."""

from __future__ import annotations

import click

from llmkit.commands._common import Output, bundle
from llmkit.commands.plot_option import plot_option
from llmkit.commands.deprecated import Renamed, renamed
from llmkit.kv.trace import TraceShape  # light: numpy is imported when a trace is drawn


@click.group("kv")
def group():
    """KV cache: memory planning and slots saved to disk (prompt caching across runs)."""


def human_bytes(n: float) -> str:
    """Bytes in binary units: 1536 -> '1.50 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


@group.command("plan")
@click.option("-m", "--model", "model_paths", required=True, multiple=True,
              help="GGUF model (only its metadata is read; repeat to compare models).")
@click.option("-c", "--ctx-size", "ctxs", multiple=True, type=int,
              help="Context size (repeatable; default: min(2048, training); 0: the training context; with --plot: "
                   "powers of two up to the training context).")
@click.option("--parallel", "-np", default=1, show_default=True, type=int, help="Sequences (slots) in parallel.")
@click.option("--ctk", "cache_type_k", default="f16", show_default=True)
@click.option("--ctv", "cache_type_v", default="f16", show_default=True)
@click.option("-b", "--batch-size", default=512, show_default=True, type=int, help="Micro-batch the compute buffer is sized for.")
@click.option("--flash-attn", is_flag=True, help="Plan for flash attention (a compute buffer that does not grow with heads).")
@click.option("--json", "as_json", is_flag=True)
@plot_option("memory against context length per model, the machine's RAM marked")
def plan_cmd(model_paths, ctxs, parallel, cache_type_k, cache_type_v, batch_size, flash_attn, as_json, plot_path):
    """Bytes of KV cache, weights and what the process holds (compute buffer and logits included) for a
    model and settings, plus the bandwidth-bound decode speed.

    \b
    llmkit kv plan -m model.gguf -c 2048 -c 8192 -c 32768 --ctk q8_0 --ctv q8_0
    llmkit kv plan -m small.gguf -m big.gguf --flash-attn --plot memory.svg
    """
    from llmkit.kv.plan import context_sweep, measured_bandwidth, plan

    bw = measured_bandwidth()
    plans = [plan(m, c, parallel, cache_type_k, cache_type_v, n_ubatch=batch_size, bandwidth_gbs=bw,
                  flash_attn=flash_attn)
             for m in model_paths for c in (ctxs or (context_sweep(m) if plot_path else (None,)))]
    if plot_path:
        from llmkit.kv.plan import memory_chart
        from llmkit.machine import total_memory
        from llmkit.plot import draw

        draw(plot_path, memory_chart(plans, total_memory()))
    out = Output()
    if as_json:
        out.json([p.to_dict() for p in plans])
        return
    for m in model_paths:
        out.table(_plan_table([p for p in plans if p.model == m], bw))


def _plan_table(rows, bw: float):
    """One model's plans as a table, its shape and weights in the title."""
    from rich.table import Table

    p0 = rows[0]
    t = Table(title=f"{p0.architecture}, {p0.n_layer} layers, kv heads {sorted(set(p0.head_count_kv))}, head dim "
                    f"{p0.head_dim_k}/{p0.head_dim_v}, weights {human_bytes(p0.weights_bytes)}, training context "
                    f"{p0.train_ctx}, read bandwidth {bw:.1f} GB/s")
    for col in ("n_ctx", "cells", "seqs", "K", "V", "KV total", "per token", "weights+KV", "compute", "process",
                "decode bound (full ctx)"):
        t.add_column(col, justify="right")
    for p in rows:
        bound = p.decode_bound_tok_s()
        t.add_row(str(p.n_ctx), str(p.n_ctx_cells), str(p.n_seq), human_bytes(p.k_bytes), human_bytes(p.v_bytes),
                  human_bytes(p.kv_bytes), human_bytes(p.kv_bytes_per_token), human_bytes(p.total_bytes),
                  human_bytes(p.compute_bytes), human_bytes(p.process_bytes), f"{bound:.1f} tok/s" if bound else "-")
    return t


_SHAPE = TraceShape()  # the built-in trace's defaults, shown by --help
# the built-in trace's options: simulate receives `shape`, a kv.trace.TraceShape
trace_options = bundle("shape", [
    click.option("--requests", default=_SHAPE.requests, show_default=True, help="Built-in trace: number of requests."),
    click.option("--rate", default=_SHAPE.rate, show_default=True, help="Built-in trace: arrivals per second (Poisson)."),
    click.option("--prompt-mean", default=_SHAPE.prompt_mean, show_default=True,
                 help="Built-in trace: mean prompt tokens (log-normal)."),
    click.option("--output-mean", default=_SHAPE.output_mean, show_default=True,
                 help="Built-in trace: mean output tokens (log-normal)."),
    click.option("--shared-prefix", default=_SHAPE.shared_prefix, show_default=True,
                 help="Built-in trace: tokens of a common system prompt."),
    click.option("--samples", default=_SHAPE.samples, show_default=True,
                 help="Built-in trace: parallel samples / beams per request."),
    click.option("--seed", default=_SHAPE.seed, show_default=True),
], TraceShape)


@renamed(Renamed("-n", "--samples"))
@group.command("simulate")
@click.argument("trace", required=False)
@trace_options
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
@plot_option("memory use over time per policy")
@click.option("--json", "as_json", is_flag=True)
def simulate_cmd(trace, shape, budget_tokens, budget_bytes, model_path, gpu_gb, policies, block_size, max_len, preempt,
                 step_ms, plot_path, as_json):
    """Replay a request trace (JSONL, or the built-in generator) against a KV budget under
    Max / Pow2 / Oracle / Paged allocation and compare memory waste, batch size and throughput.

    \b
    llmkit kv simulate --budget-tokens 20000 --plot kv.png
    llmkit kv simulate trace.jsonl -m model.gguf --gpu-gb 24 --policy paged --preempt swap --json
    """
    from llmkit.kv import simulate as sim
    from llmkit.kv import trace as traces

    if trace:
        from llmkit.io import read_text, split_lines

        reqs = traces.read_trace(split_lines(read_text(trace)))
    else:
        reqs = shape.draw(max_len)
    if budget_tokens is None:
        if not model_path or (budget_bytes is None and gpu_gb is None):
            raise click.UsageError("give --budget-tokens, or -m MODEL with --budget-bytes or --gpu-gb.")
        from llmkit.kv.plan import budget_in_tokens

        budget_tokens = budget_in_tokens(model_path, max_len, budget_bytes, gpu_gb)
    results = sim.compare(reqs, policies or sim.POLICIES, budget_tokens, block_size, max_len, preempt, step_ms / 1000)
    if plot_path:
        from llmkit.plot import draw

        draw(plot_path, sim.memory_chart(results), size=(900, 240 * len(results)))
    if as_json:
        Output().json({"budget_tokens": budget_tokens, "requests": len(reqs), "results": [r.to_dict() for r in results]})
    else:
        Output().table(_simulation_table(results, len(reqs), budget_tokens, block_size))


def _simulation_table(results, n_requests: int, budget_tokens: int, block_size: int):
    """One row per policy: memory use and waste, batch sizes, throughput, prefix hits, preemptions."""
    from rich.table import Table

    t = Table(title=f"{n_requests} requests, KV budget {budget_tokens} tokens, block {block_size}")
    for col in ("policy", "used", "reserved", "internal", "external", "waste", "mean batch", "peak", "req/s",
                "prefix hits", "preempt"):
        t.add_column(col, justify="right")
    for r in results:
        d = r.to_dict()
        t.add_row(r.policy, *(f"{100 * d[k]:.1f}%" for k in ("used", "reserved", "internal", "external", "waste")),
                  f"{r.mean_batch:.1f}", str(r.peak_batch), f"{r.throughput_rps:.2f}", f"{100 * r.prefix_hit_rate:.0f}%",
                  str(r.preemptions))
    return t


from llmkit.commands.kv import slots  # noqa: E402,F401  (registers the slot commands on `group`)
