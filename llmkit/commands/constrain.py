"""`llmkit constrain`: generate text that follows a GBNF grammar or a JSON schema (llama.cpp's grammar sampler)."""

from __future__ import annotations

import sys

import click

from llmkit.commands._common import Output, read_prompt, stdout_stream
from llmkit.commands.llama_options import (chat_options, model_options, open_for_prompt, sampling_options,
                                           stats_line)


def grammar_options(required: bool = True):
    """--grammar, --grammar-file, --json-schema (one of them; none when not `required`): the command
    receives `grammar`, a Grammar or None."""
    import functools

    def decorate(f):
        @functools.wraps(f)
        def run(*args, grammar, grammar_file, json_schema, **kwargs):
            from llmkit.llama.constrained import Grammar

            given = grammar or grammar_file or json_schema
            g = Grammar.from_options(grammar, grammar_file, json_schema) if given or required else None
            return f(*args, grammar=g, **kwargs)

        run = click.option("--json-schema", help="JSON schema the output must match (text, or @FILE).")(run)
        run = click.option("--grammar-file", type=click.Path(dir_okay=False), help="File holding a GBNF grammar.")(run)
        return click.option("--grammar", help="GBNF grammar the output must match.")(run)

    return decorate


@click.command("constrain")
@click.argument("prompt", required=False)
@model_options(loading=True)
@sampling_options(eos=False)
@chat_options
@grammar_options()
@click.option("--json", "as_json", is_flag=True, help="Print text and statistics as one JSON object.")
def command(prompt, model_path, opts, sampling, chat, system, grammar, as_json):
    """Generate text from PROMPT (or stdin) that matches a GBNF grammar or a JSON schema.

    \b
    llmkit constrain -n 8 --grammar 'root ::= [0-9]+' "A number:"
    llmkit constrain --json-schema '{"type":"object","properties":{"ok":{"type":"boolean"}}}' "Answer as JSON:"
    llmkit constrain --chat --json-schema @person.schema.json "Describe Ada Lovelace."
    """
    from llmkit.llama.constrained import generate_constrained

    out = Output()
    prompt = read_prompt(prompt)
    path, model, prompt, tokens = open_for_prompt(model_path, opts, prompt, chat, system)
    text, stats = generate_constrained(model, tokens, sampling.n_predict, sampling.params, grammar,
                                       stop=sampling.stop, on_text=stdout_stream(not as_json))
    if as_json:
        out.json({"model": path, "text": text, "stats": stats.to_dict()})
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    out.info(stats_line(stats.to_dict()))
