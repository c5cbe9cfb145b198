"""`llmkit kv save | ls | show | erase | restore`: KV slots on disk or in a running llama-server."""

from __future__ import annotations

import sys

import click

from llmkit.commands._common import Output, read_prompt, stdout_stream
from llmkit.commands.kv import group, human_bytes
from llmkit.commands.llama_options import check_memory, model_options, server_errors, server_slot_option


@group.command("save")
@model_options()
@click.argument("prompt", required=False)
@click.option("--prompt-file", type=click.Path(dir_okay=False, exists=True), help="Read the prompt from a file.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Slot file to write.")
@click.option("--server", help="Drive a running llama-server instead (URL); NAME is then the file name in its --slot-save-path.")
@server_slot_option
@click.option("--raw", is_flag=True, help="Write llama.cpp's own state format (what llama-server restores; no llmkit header).")
@click.option("--json", "as_json", is_flag=True, help="Print what was saved as JSON (tokens, bytes, prefill, peak RSS).")
def save_cmd(model_path, opts, prompt, prompt_file, output, server, slot_id, raw, as_json):
    """Evaluate PROMPT and save its KV state (with the tokens) to a slot file.

    \b
    llmkit kv save -m model.gguf --prompt-file system.txt -o system.slot
    llmkit kv save --server http://127.0.0.1:8080 --slot 0 system.bin
    """
    import os

    if server:
        name = output or prompt
        if not name:
            raise click.UsageError("with --server give the file name: llmkit kv save --server URL --slot 0 NAME.bin")
        r = _server_slot(server, slot_id, "save", name)
        Output().info(f"server slot {slot_id}: saved {r.get('n_saved', '?')} tokens ({r.get('n_written', '?')} bytes) to {name}")
        return
    if not output:
        raise click.UsageError("give -o NAME.slot for the slot file to write.")
    from llmkit.kv.prompt_cache import save_prompt
    from llmkit.llama import runtime

    text = read_prompt(prompt, prompt_file)
    path = model_path or runtime.default_model_path()
    check_memory(path, opts)
    n_saved, dt = save_prompt(path, opts, text, output, raw=raw)
    if as_json:
        Output().json({"path": output, "tokens": n_saved, "bytes": os.path.getsize(output), "prefill_s": dt,
                       "peak_rss_bytes": runtime.peak_rss()})
        return
    Output().info(f"saved {n_saved} tokens ({os.path.getsize(output)} bytes) to {output}; prefill took {dt * 1000:.0f} ms")


def _server_slot(url: str, slot_id: int, action: str, filename: str | None = None) -> dict:
    """One slot action on a llama-server, with errors that name the options to check."""
    from llmkit.llama.server import LlamaServer

    with server_errors():
        return LlamaServer(url).slot_action(slot_id, action, filename)


@group.command("ls")
@click.argument("directory", default=".")
@click.option("--json", "as_json", is_flag=True)
@click.option("--server", help="List a running llama-server's slots instead (GET /slots).")
def ls_cmd(directory, as_json, server):
    """List the slot files in DIRECTORY: model, tokens, size, created."""
    from llmkit.kv.slots import list_slots

    out = Output()
    if server:
        from llmkit.llama.server import LlamaServer

        with server_errors():
            slots = LlamaServer(server).slots()
        for sl in slots:
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
        out.data(f"{path}\t{h.n_tokens} tokens\t{human_bytes(size)}\t{h.created}\t{h.model_path}")


@group.command("show")
@click.argument("slot")
@click.option("--json", "as_json", is_flag=True, help="The header as JSON (with the token ids).")
def show_cmd(slot, as_json):
    """Print the text cached in a slot (or its header with --json)."""
    from dataclasses import asdict

    from llmkit.kv.slots import read_header

    h, _ = read_header(slot, tokens=as_json)
    if as_json:
        Output().json(asdict(h))
    else:
        sys.stdout.write(h.text)
        sys.stdout.flush()


@group.command("erase")
@click.argument("slots", nargs=-1)
@click.option("--server", help="Erase a running llama-server's slot instead.")
@server_slot_option
def erase_cmd(slots, server, slot_id):
    """Delete slot files (only files that really are llmkit slots), or clear a server slot."""
    import os

    from llmkit.kv.slots import read_header

    if server:
        r = _server_slot(server, slot_id, "erase")
        Output().info(f"server slot {slot_id}: erased {r.get('n_erased', '?')} tokens")
        return
    if not slots:
        raise click.UsageError("give the slot files to erase (or --server URL --slot N).")

    for s in slots:
        read_header(s)  # refuses anything that is not a slot
        os.unlink(s)
        Output().info(f"erased {s}")


@group.command("restore")
@model_options()
@click.argument("slot")
@click.argument("prompt", required=False)
@click.option("-n", "--n-predict", default=64, show_default=True, type=int)
@click.option("--temp", default=0.0, show_default=True, type=float)
@click.option("--json", "as_json", is_flag=True)
@click.option("--server", help="Restore into a running llama-server's slot instead (SLOT = file name there).")
@server_slot_option
def restore_cmd(model_path, opts, slot, prompt, n_predict, temp, as_json, server, slot_id):
    """Restore SLOT and continue with PROMPT appended to its text (only new tokens are evaluated)."""
    if server:
        r = _server_slot(server, slot_id, "restore", slot)
        Output().info(f"server slot {slot_id}: restored {r.get('n_restored', '?')} tokens from {slot}")
        return
    from llmkit.kv.prompt_cache import continue_slot

    path, text, st = continue_slot(model_path, opts, slot, prompt or "", n_predict, temp, on_text=stdout_stream(not as_json))
    d = st.to_dict()
    if as_json:
        Output().json({"model": path, "slot": slot, "text": text, "stats": d})
        return
    sys.stdout.write("\n")
    Output().info(f"restored {slot}: reused {d['prefill_reused']} of {d['prompt_tokens']} prompt tokens, "
                  f"time to first token {d['ttft_s'] * 1000:.0f} ms, {d['tokens_per_s']:.1f} tok/s")
