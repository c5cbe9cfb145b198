"""`llmkit tokenize`: train, encode, decode, inspect and compare tokenizers."""

from __future__ import annotations

import json

import click

from llmkit.commands._common import Output, read_text_arg, resolve_inputs
from llmkit.commands.deprecated import Renamed, not_a_number, renamed
from llmkit.commands.plot_option import plot_option
from llmkit.commands.tokenize_count import count_cmd, split_cmd, truncate_cmd
from llmkit.commands.tokenize_options import THREADS_HELP, load_tokenizer, thread_count
from llmkit.commands.tokenize_train import train_cmd


@click.group("tokenize")
def group():
    """Train, apply, inspect and compare subword tokenizers (BPE, WordPiece, Unigram).

    TOKENIZER is a tokenizer.json (llmkit or HF) or a GGUF model (its vocabulary).
    """


for _cmd in (train_cmd, count_cmd, truncate_cmd, split_cmd):  # in tokenize_train.py and tokenize_count.py (size)
    group.add_command(_cmd)


def _stdin_size() -> int:
    """Bytes waiting on stdin when it is a file (0 for a pipe): decides whether compiling pays."""
    import os
    import stat
    import sys

    try:
        st = os.fstat(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


@renamed(Renamed("-t", "-m", when=not_a_number), Renamed("--tokenizer", "--model"))
@group.command("encode")
@click.option("-m", "--model", "tokenizer_path", required=True, help="The tokenizer: tokenizer.json or .gguf.")
@click.argument("text", required=False)
@click.option("--tokens", "show_tokens", is_flag=True, help="Print token strings instead of ids.")
@click.option("--jsonl", is_flag=True, help="One JSON object per input line: text, ids, tokens.")
@click.option("-t", "--threads", type=click.IntRange(min=1), help=THREADS_HELP)
def encode_cmd(tokenizer_path, text, show_tokens, jsonl, threads):
    """Encode TEXT (or each line of stdin) into token ids.

    \b
    llmkit tokenize encode -m tok.json "Hello world"
    cat lines.txt | llmkit tokenize encode -m model.gguf --jsonl
    llmkit tokenize encode -m tok.json -t 2 < corpus.txt > ids.txt
    """
    import sys

    tok = load_tokenizer(tokenizer_path)
    out = Output(jsonl=jsonl)
    if text is None or text == "-":
        if text is None and (sys.stdin is None or sys.stdin.isatty()):
            raise click.UsageError("no text given. Pass it as an argument, or '-' / a pipe for standard input.")
        if not (jsonl or show_tokens):
            from llmkit.tokenize.corpus.stream import encode_ids, read_chunks

            n = thread_count(threads, out)
            sys.stdout.flush()
            for block in encode_ids(tok, read_chunks(sys.stdin.buffer), n, _stdin_size()):
                sys.stdout.buffer.write(block)
            sys.stdout.buffer.flush()
            return
    for line in read_text_arg(text):
        ids = tok.encode(line)
        if jsonl:
            out.record({"text": line, "ids": ids, "tokens": tok.tokens(ids)})
        elif show_tokens:
            out.data(" ".join(tok.tokens(ids)))
        else:
            out.data(" ".join(map(str, ids)))


@renamed(Renamed("-t", "-m", when=not_a_number), Renamed("--tokenizer", "--model"))
@group.command("decode")
@click.option("-m", "--model", "tokenizer_path", required=True, help="The tokenizer: tokenizer.json or .gguf.")
@click.argument("ids", required=False)
@click.option("--skip-special", is_flag=True, help="Drop special tokens from the text.")
@click.option("--jsonl", is_flag=True, help="One JSON object per input line: ids, text.")
def decode_cmd(tokenizer_path, ids, skip_special, jsonl):
    """Decode IDS ("1 2 3", "1,2,3", a JSON list, or JSONL with "ids") back to text, one line each."""
    from llmkit.errors import BadInput

    tok = load_tokenizer(tokenizer_path)
    out = Output(jsonl=jsonl)
    for line in read_text_arg(ids, "ids"):
        s = line.strip()
        if not s:
            out.data("")
            continue
        try:
            if s.startswith("{"):
                seq = json.loads(s)["ids"]
            elif s.startswith("["):
                seq = json.loads(s)
            else:
                seq = [int(x) for x in s.replace(",", " ").split()]
            if not all(isinstance(x, int) for x in seq):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            raise BadInput(f"cannot read token ids from {s[:60]!r}. Give integers separated by spaces or commas, or a JSON list.") from None
        text = tok.decode(seq, skip_special=skip_special)
        if jsonl:
            out.record({"ids": seq, "text": text})
        else:
            out.data(text)


@renamed(Renamed("-n", "--sample"))
@group.command("inspect")
@click.argument("tokenizer_path", metavar="TOKENIZER")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--sample", default=10, show_default=True, help="How many merges/pieces to show.")
def inspect_cmd(tokenizer_path, as_json, sample):
    """Show a tokenizer's algorithm, vocabulary size, special tokens and sample merges/pieces."""
    from llmkit.tokenize.corpus.stats import describe

    d = describe(load_tokenizer(tokenizer_path), sample)
    out = Output()
    if as_json:
        out.json(d)
        return
    for k, v in d.items():
        out.data(f"{k}: {v if not isinstance(v, list) else json.dumps(v, ensure_ascii=False)}")


@renamed(Renamed("-t", "-m", when=not_a_number), Renamed("--tokenizer", "--model"))
@group.command("stats")
@click.option("-m", "--model", "tokenizers", multiple=True, required=True, help="Tokenizer: tokenizer.json or .gguf (repeat to compare).")
@click.argument("inputs", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
@click.option("-t", "--threads", type=click.IntRange(min=1), help=THREADS_HELP)
@plot_option("tokens per word per tokenizer")
def stats_cmd(tokenizers, inputs, as_json, threads, plot_path):
    """Tokens per word/character, bytes per token and unknown rate of tokenizers on a corpus.

    \b
    llmkit tokenize stats -m bpe.json -m unigram.json -m model.gguf corpus.txt
    llmkit tokenize stats -m tok.json -t 2 big-corpus/
    llmkit tokenize stats -m bpe.json -m unigram.json corpus.txt --plot fertility.svg
    """
    from llmkit.io import expand_inputs
    from llmkit.tokenize.corpus.stats import corpus_stats

    out = Output()
    n = thread_count(threads, out)
    paths = expand_inputs(resolve_inputs(inputs, "corpus"))
    rows = [corpus_stats(t, load_tokenizer(t), paths, threads=n) for t in tokenizers]
    if plot_path:
        from llmkit.plot import draw
        from llmkit.tokenize.corpus.stats import stats_chart

        draw(plot_path, stats_chart(rows))
    if as_json:
        out.json([r.to_dict() for r in rows])
        return
    from rich.table import Table

    table = Table(title=f"{rows[0].lines} lines, {rows[0].words} words, {rows[0].bytes} bytes")
    for col in ("tokenizer", "algo", "vocab", "tokens", "tok/word", "tok/char", "bytes/tok", "unk %"):
        table.add_column(col, justify="left" if col in ("tokenizer", "algo") else "right")
    for r in rows:
        table.add_row(r.tokenizer, r.algorithm, str(r.vocab_size), str(r.tokens), f"{r.tokens_per_word:.3f}",
                      f"{r.tokens_per_char:.3f}", f"{r.bytes_per_token:.2f}", f"{100 * r.unknown_rate:.2f}")
    out.table(table)
