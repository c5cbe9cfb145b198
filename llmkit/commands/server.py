"""`llmkit server`: generate on running llama-servers — one completion, or a JSONL batch across several."""

from __future__ import annotations

import sys

import click

from llmkit.commands._common import Output, read_prompt, stdout_stream
from llmkit.commands.constrain import grammar_options
from llmkit.commands.llama_options import sampling_options, server_errors


@click.group("server")
def group():
    """Generate on running llama-servers (llama.cpp's HTTP server) instead of in this process.

    \b
    llmkit server generate --server http://127.0.0.1:8080 --slot 0 -n 64 "..."
    llmkit server batch --server http://h1:8080,http://h2:8080 prompts.jsonl -o out.jsonl
    """


@group.command("generate")
@click.argument("prompt", required=False)
@click.option("--server", "url", required=True, help="The llama-server's URL (http://HOST:PORT).")
@click.option("--slot", "slot_id", type=int, help="The server slot to use (its cached prompt is reused).")
@sampling_options()
@grammar_options(required=False)
@click.option("--json", "as_json", is_flag=True, help="Print text and statistics as one JSON object.")
def generate_cmd(prompt, url, slot_id, sampling, grammar, as_json):
    """One completion of PROMPT (or stdin) on a llama-server, streamed to stdout."""
    from llmkit.llama.server import LlamaServer

    out = Output()
    prompt = read_prompt(prompt)
    fields = {k: v for k, v in sampling.server_fields().items() if k != "n_predict"}
    if grammar is not None:
        fields.update(grammar.server_fields())
    stream = stdout_stream(not as_json)
    with server_errors():
        r = LlamaServer(url).completion(prompt, sampling.n_predict, slot_id, on_text=stream, **fields)
    t = r.get("timings", {})
    stats = {"prompt_tokens": t.get("prompt_n"), "cached_tokens": t.get("cache_n"), "prefill_ms": t.get("prompt_ms"),
             "generated_tokens": t.get("predicted_n"), "tokens_per_s": t.get("predicted_per_second"), "slot": r.get("id_slot")}
    if as_json:
        out.json({"server": url, "text": r["content"], "stats": stats})
        return
    sys.stdout.write("\n")
    out.info(f"server slot {stats['slot']}: evaluated {stats['prompt_tokens']} prompt tokens "
             f"({stats['cached_tokens']} reused from its cache), {stats['generated_tokens']} generated")


@group.command("batch")
@click.argument("batch_path", metavar="FILE")
@click.option("--server", "urls", required=True, help="llama-server URLs, comma-separated (URL,URL,...).")
@click.option("-o", "--output", "output_path", type=click.Path(dir_okay=False),
              help="Append results here; a rerun skips ids already written (default: stdout).")
@click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
              help="A malformed line or refused item stops the batch, or is reported and skipped.")
@click.option("--retries", default=3, show_default=True, type=int, help="Tries per item when its server drops.")
@sampling_options()
def batch_cmd(batch_path, urls, output_path, on_error, retries, sampling):
    """Run FILE's JSONL requests (id + prompt or messages, options per item; '-' = stdin) across llama-servers.

    Results come back in input order; with -o, an interrupted batch resumes where it stopped.
    """
    import os

    from llmkit.commands._common import progress_bar
    from llmkit.errors import BadInput, OptionError
    from llmkit.llama import batch

    out = Output()
    servers = [u.strip() for u in urls.split(",") if u.strip()]
    if retries < 1:
        raise OptionError("{retries} must be a positive number, got {value}.", value=retries)
    items = _parse_batch(batch_path, on_error, out)
    fd, ok, existed = None, False, bool(output_path) and os.path.exists(output_path)
    if output_path:
        fd, items, n_done = batch.resume(items, output_path)
        if n_done:
            out.info(f"{output_path}: {n_done} of {n_done + len(items)} items already done, running {len(items)}")
    emit = (lambda rec: batch.append_record(fd, rec)) if fd is not None else out.record
    defaults = sampling.server_fields()
    try:
        with progress_bar("generating") as prog:
            report = batch.run_batch(items, servers, defaults, emit, on_error=on_error, max_tries=retries,
                                     progress=lambda d, n: prog(d, n))
        ok = True
    except batch.NoServerAnswers as e:
        raise BadInput(f"no llama-server answers at {', '.join(e.urls)}. Start one (llama-server -m MODEL --port 8080 "
                       "-np 4), or check --server.") from None
    except batch.ItemFailed as e:
        raise BadInput(f"{e.what} Fix it, or pass --on-error skip.") from None
    except batch.ServersLost as e:
        raise BadInput(f"{e.what} Restart a server and run again (with -o the output resumes).") from None
    finally:
        if fd is not None:
            os.close(fd)
            # a failed run leaves no file it created without a result in it
            if not ok and not existed and os.path.getsize(output_path) == 0:
                os.remove(output_path)
    _summary(out, report)


def _parse_batch(batch_path: str, on_error: str, out: Output) -> list:
    """FILE's items; a malformed line stops the batch (--on-error fail) or is reported and left out."""
    from llmkit.errors import BadInput
    from llmkit.io import read_text
    from llmkit.llama import batch

    items, bad = batch.parse_items(read_text(batch_path).splitlines())
    for b in bad:
        msg = f"{batch_path} line {b.line}: {b.reason}"
        if on_error == "fail":
            raise BadInput(f"{msg}. Fix the line, or pass --on-error skip to leave such lines out.")
        out.warn(msg + " (skipped)")
    return items


def _summary(out: Output, report) -> None:
    """The skipped items, then one line: items, tokens, speed, slots and any servers lost."""
    import json

    d = report.to_dict()
    for i, line, err in report.failed:
        out.warn(f"item {json.dumps(i)} (line {line}) skipped: {err}")
    lost = f", servers lost: {', '.join(d['servers_lost'])} ({d['retried']} items retried elsewhere)" if d["servers_lost"] else ""
    out.info(f"{d['done']} items, {d['generated_tokens']} tokens in {d['wall_s']:.1f} s = {d['tokens_per_s'] or 0:.1f} tok/s "
             f"on {sum(d['slots'].values())} slots{lost}")
