"""`llmkit generate`: stream text from a local GGUF model through llama.cpp."""

from __future__ import annotations

import sys

import click

from llmkit.commands._common import Output, read_prompt, stdout_stream
from llmkit.commands.llama_options import LOCAL_ONLY, model_options, refuse_local_only, server_errors


@click.command("generate")
@click.argument("prompt", required=False)
@model_options(loading=True)
@click.option("-n", "--n-predict", default=128, show_default=True, type=int, help="Tokens to generate.")
@click.option("--temp", default=0.8, show_default=True, type=float, help="Temperature (0 = greedy).")
@click.option("--top-k", default=40, show_default=True, type=int)
@click.option("--top-p", default=0.95, show_default=True, type=float)
@click.option("--min-p", default=0.05, show_default=True, type=float)
@click.option("--repeat-penalty", default=1.0, show_default=True, type=float)
@click.option("--seed", type=int, default=None, help="Random seed (default: random).")
@click.option("--stop", multiple=True, help="Stop when this text appears (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's own chat template.")
@click.option("--system", help="System message for --chat.")
@click.option("--context-shift", is_flag=True, help="Drop the oldest tokens when the context fills instead of stopping.")
@click.option("--keep", default=0, show_default=True, type=int, help="Tokens at the start never dropped by --context-shift.")
@click.option("--draft-model", "draft_path", help="Draft GGUF for speculative decoding (same vocabulary).")
@click.option("--draft-max", default=8, show_default=True, type=int, help="Most draft tokens per step.")
@click.option("--draft-min", default=0, show_default=True, type=int, help="Fewest draft tokens when drafting.")
@click.option("--fixed-draft", is_flag=True, help="Always draft --draft-max tokens (no adaptive length).")
@click.option("--lookup", default=0, type=int, help="Prompt-lookup drafting with n-grams up to N (no draft model).")
@click.option("--grammar", help="GBNF grammar constraining the output.")
@click.option("--grammar-file", type=click.Path(dir_okay=False), help="GBNF grammar file.")
@click.option("--json-schema", help="JSON schema constraining the output.")
@click.option("--slot", "slot_path", type=click.Path(dir_okay=False), help="Restore this KV slot first; reuse its longest common prefix.")
@click.option("--slot-dir", type=click.Path(file_okay=False), help="Prompt cache: reuse the slot sharing the longest prefix, save the new one.")
@click.option("--cache-reuse", default=0, show_default=True, type=int,
              help="With --slot/--slot-dir: also reuse cached chunks of >= N tokens after a change, shifting them.")
@click.option("--server", help="Generate on running llama-servers instead of in-process (URL, or URL,URL,... with --batch).")
@click.option("--batch", "batch_path", help="JSONL of requests (id + prompt or messages, options per item) run across --server; '-' = stdin.")
@click.option("-o", "--output", "output_path", type=click.Path(dir_okay=False), help="With --batch: append results here; a rerun skips ids already written.")
@click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True, help="With --batch: a malformed line or refused item stops the batch, or is reported and skipped.")
@click.option("--retries", default=3, show_default=True, type=int, help="With --batch: tries per item when its server drops.")
@click.option("--slot-id", type=int, help="With --server: the server slot (its cached prompt is reused).")
@click.option("--json", "as_json", is_flag=True, help="Print text and statistics as one JSON object.")
def command(prompt, model_path, opts, n_predict, temp, top_k, top_p, min_p, repeat_penalty, seed, stop, ignore_eos,
            chat, system, context_shift, keep, draft_path, draft_max, draft_min, fixed_draft, lookup, grammar,
            grammar_file, json_schema, slot_path, slot_dir, cache_reuse, server, batch_path, output_path, on_error,
            retries, slot_id, as_json):
    """Generate text from PROMPT (or stdin) with llama.cpp, streaming to stdout.

    \b
    llmkit generate "The capital of France is"
    llmkit generate -m big.gguf --draft-model small.gguf --temp 0 "def fib(n):"
    echo "Rewrite this sentence." | llmkit generate --chat --lookup 3 -
    llmkit generate --server http://h1:8080,http://h2:8080 --batch prompts.jsonl -o out.jsonl
    """
    from llmkit.errors import BadInput
    from llmkit.llama.sampling import SamplingParams

    out = Output()
    if server:
        refuse_local_only(LOCAL_ONLY)
    if batch_path or output_path:
        if not (batch_path and server):
            raise click.UsageError("--batch runs on llama-servers: pass --server URL[,URL...] and --batch FILE "
                                   "(-o needs --batch).")
        if prompt is not None:
            raise click.UsageError("with --batch the prompts come from the JSONL file; drop the PROMPT argument.")
        defaults = {"n_predict": n_predict, "temperature": temp, "top_k": top_k, "top_p": top_p, "min_p": min_p,
                    "repeat_penalty": repeat_penalty, **({"seed": seed} if seed is not None else {}),
                    **({"stop": list(stop)} if stop else {})}
        _batch(server, batch_path, output_path, on_error, retries, defaults, out)
        return
    prompt = read_prompt(prompt)
    params = SamplingParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed)
    params.validate()
    if n_predict <= 0:
        raise BadInput(f"-n must be a positive number of tokens, got {n_predict}.")
    if server:
        import json

        try:
            schema = json.loads(json_schema) if json_schema else None
        except ValueError as e:
            raise BadInput(f"--json-schema is not JSON ({e}). Check its syntax.") from None
        if grammar_file:
            from llmkit.io import read_text

            grammar = read_text(grammar_file)
        _generate_on_server(server, slot_id, prompt, n_predict, as_json, out, temperature=temp, seed=seed, top_k=top_k,
                            top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty, stop=list(stop) or None,
                            ignore_eos=ignore_eos or None, grammar=grammar, json_schema=schema)
        return
    constrained = grammar or grammar_file or json_schema
    if constrained and (draft_path or lookup):
        raise click.UsageError("--grammar/--json-schema cannot be combined with --draft-model or --lookup.")
    from llmkit.llama import runtime

    path = model_path or runtime.default_model_path()
    model = runtime.open_model(path, opts)
    if chat:
        from llmkit.llama.chat import NoChatTemplate, chat_prompt

        try:
            prompt = chat_prompt(model, prompt, system)
        except NoChatTemplate:
            raise BadInput("this model has no chat template (tokenizer.chat_template). Drop --chat and write the "
                           "prompt yourself.") from None
    tokens = model.tokenize(prompt.encode("utf-8"), add_bos=runtime.add_bos(model), special=chat)

    stream = stdout_stream(not as_json)
    if constrained and (slot_path or slot_dir):
        raise click.UsageError("--grammar/--json-schema cannot be combined with --slot/--slot-dir.")
    slot_note = ""
    if slot_path:
        from llmkit.kv.slots import restore_slot

        restore_slot(model, slot_path, path, opts)
        slot_note = f"restored {slot_path};"
    elif slot_dir:
        from llmkit.kv.prompt_cache import restore_best

        best = restore_best(model, path, opts, tokens, slot_dir)
        slot_note = f"restored {best};" if best else "no cached prefix;"
    if constrained:
        from llmkit.llama.constrained import generate_constrained

        text, stats = generate_constrained(model, tokens, n_predict, params, grammar=grammar, grammar_file=grammar_file,
                                           json_schema=json_schema, stop=stop, on_text=stream)
    else:
        from llmkit.llama.generate import Generator

        draft = runtime.open_model(draft_path, opts) if draft_path else None
        gen = Generator(model, params, draft=draft, lookup=lookup, draft_max=draft_max, draft_min=draft_min,
                        adaptive=not fixed_draft, ignore_eos=ignore_eos, context_shift=context_shift, keep=keep)
        text, stats = gen.run(tokens, n_predict, tuple(stop), on_text=stream, reuse_cache=bool(slot_path or slot_dir),
                              cache_reuse=cache_reuse)
        if slot_dir:
            from llmkit.kv.prompt_cache import save_to_dir

            saved, n_saved = save_to_dir(model, path, opts, slot_dir, prompt + text)
            slot_note += f" saved {saved} ({n_saved} tokens);"
    if as_json:
        out.json({"model": path, "text": text, "stats": stats.to_dict(), **({"slot": slot_note} if slot_note else {})})
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    d = stats.to_dict()
    line = (f"prompt {d['prompt_tokens']} tok, prefill {d['prefill_s'] * 1000:.0f} ms | generated {d['generated_tokens']} tok "
            f"in {d['decode_s']:.2f} s = {d['tokens_per_s']:.1f} tok/s | stop: {d['stop_reason']}")
    if d.get("drafted"):
        line += (f"\ndrafted {d['drafted']}, accepted {d['accepted']} ({100 * d['acceptance']:.0f}%), "
                 f"{d['mean_accepted_per_step']:.2f} accepted per target step, draft {d['draft_s']:.2f} s, "
                 f"verify {d['verify_s']:.2f} s")
    if slot_note or d.get("prefill_reused"):
        line += (f"\nKV slot: {slot_note} reused {d['prefill_reused']} prompt tokens ({d['shifted']} by shifting); "
                 f"time to first token {d['ttft_s'] * 1000:.0f} ms")
    out.info(line)


def _batch(server, batch_path, output_path, on_error, retries, defaults, out) -> None:
    """Run a JSONL batch across llama-servers; records to stdout or appended to -o in input order."""
    import json
    import os

    from llmkit.commands._common import progress_bar
    from llmkit.errors import BadInput
    from llmkit.io import read_text
    from llmkit.llama import batch

    urls = [u.strip() for u in server.split(",") if u.strip()]
    if defaults["n_predict"] <= 0 or retries < 1:
        raise BadInput("-n and --retries must be positive numbers.")
    items, bad = batch.parse_items(read_text(batch_path).splitlines())
    for b in bad:
        msg = f"{batch_path} line {b.line}: {b.reason}"
        if on_error == "fail":
            raise BadInput(f"{msg}. Fix the line, or pass --on-error skip to leave such lines out.")
        out.warn(msg + " (skipped)")
    fd = None
    if output_path:
        try:
            fd, done = batch.open_resumable(output_path)
        except batch.NotAnOutputFile as e:
            raise BadInput(f"'{e.path}' line {e.line} is not an output record of llmkit generate --batch; "
                           "write to another file with -o.") from None
        before = len(items)
        items = [it for it in items if json.dumps(it.id) not in done]
        for i, it in enumerate(items):
            it.index = i
        if before != len(items):
            out.info(f"{output_path}: {before - len(items)} of {before} items already done, running {len(items)}")
    emit = (lambda rec: batch.append_record(fd, rec)) if fd is not None else out.record
    try:
        with progress_bar("generating") as prog:
            report = batch.run_batch(items, urls, defaults, emit, on_error=on_error, max_tries=retries,
                                     progress=lambda d, n: prog(d, n))
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
    d = report.to_dict()
    for i, line, err in report.failed:
        out.warn(f"item {json.dumps(i)} (line {line}) skipped: {err}")
    lost = f", servers lost: {', '.join(d['servers_lost'])} ({d['retried']} items retried elsewhere)" if d["servers_lost"] else ""
    out.info(f"{d['done']} items, {d['generated_tokens']} tokens in {d['wall_s']:.1f} s = {d['tokens_per_s'] or 0:.1f} tok/s "
             f"on {sum(d['slots'].values())} slots{lost}")


def _generate_on_server(url, slot_id, prompt, n_predict, as_json, out, **sampling) -> None:
    """One completion on a llama-server with the same sampling settings, stop strings and grammar."""
    from llmkit.llama.server import LlamaServer

    stream = stdout_stream(not as_json)
    with server_errors():
        r = LlamaServer(url).completion(prompt, n_predict, slot_id, on_text=stream, **sampling)
    t = r.get("timings", {})
    stats = {"prompt_tokens": t.get("prompt_n"), "cached_tokens": r.get("tokens_cached"), "prefill_ms": t.get("prompt_ms"),
             "generated_tokens": t.get("predicted_n"), "tokens_per_s": t.get("predicted_per_second"), "slot": r.get("id_slot")}
    if as_json:
        out.json({"server": url, "text": r["content"], "stats": stats})
        return
    sys.stdout.write("\n")
    out.info(f"server slot {stats['slot']}: evaluated {stats['prompt_tokens']} prompt tokens "
             f"({stats['cached_tokens']} cached in total), {stats['generated_tokens']} generated")
