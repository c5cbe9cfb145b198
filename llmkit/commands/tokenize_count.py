"""`llmkit tokenize count`, `truncate` and `split`: token counts of files and trees, and texts cut to a
token budget (registered in the `tokenize` group by llmkit/commands/tokenize.py)."""

from __future__ import annotations

import sys

import click

from llmkit.commands._common import Output, progress_bar, resolve_inputs
from llmkit.commands.tokenize_options import load_tokenizer, thread_count


def _tokenizers(paths: tuple[str, ...]) -> list[tuple[str, object]]:
    """(name, tokenizer) for each -m, each path once."""
    return [(p, load_tokenizer(p)) for p in dict.fromkeys(paths)]


@click.command("count")
@click.argument("inputs", nargs=-1)
@click.option("-m", "--model", "tokenizers", multiple=True, required=True,
              help="Tokenizer: tokenizer.json (llmkit or HF) or .gguf; repeat to count with several side by side.")
@click.option("--max-tokens", type=click.IntRange(min=0), help="Flag files with more tokens than this (under any tokenizer).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: files, directories, skipped, total.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV: a row per directory and file, then the total.")
@click.option("--no-gitignore", is_flag=True, help="Also count files that .gitignore files exclude.")
@click.option("-t", "--threads", type=click.IntRange(min=1), help="Threads across files (default: the idle cores).")
def count_cmd(inputs, tokenizers, max_tokens, as_json, as_csv, no_gitignore, threads):
    """Count the tokens of FILES, directories, globs or '-' (stdin): per file, per directory, in total.

    Directories are walked like `rag index` walks them (.gitignore honoured, hidden and junk
    directories skipped). Binary, non-UTF-8, unreadable and vanished files, and link loops, are
    listed as skipped; the rest is still counted.

    A count is what HF tokenizers' len(encode(text, add_special_tokens=False)) gives for the file's
    whole text (UTF-8, line endings as they are): tokens a tokenizer adds around a text (BOS,
    [CLS] ... [SEP]) are not counted; special tokens written in the text are.

    \b
    llmkit tokenize count -m tok.json src/ README.md
    llmkit tokenize count -m tokenizer.json -m model.gguf --max-tokens 8000 'docs/**/*.md'
    git diff | llmkit tokenize count -m tok.json --json -
    """
    from llmkit.tokenize.corpus.count import count_paths

    if as_json and as_csv:
        raise click.UsageError("--json and --csv cannot be used together. Pick one.")
    out = Output()
    named = _tokenizers(tokenizers)
    n = thread_count(threads, out)
    with progress_bar("counting") as bar:
        report = count_paths(named, resolve_inputs(inputs, "files"), max_tokens=max_tokens, threads=n,
                             gitignore=not no_gitignore, progress=lambda done, total: bar(done, total, "bytes"))
    if as_json:
        out.json(report.to_dict())
    elif as_csv:
        _csv(report)
    else:
        _tree(report, out)
    for note in report.notes:
        out.info(f"Note: {note}.")
    skipped, over = len(report.skipped), sum(map(report.over, report.files))
    if skipped:
        out.info(f"{skipped} file(s) skipped (binary, unreadable, too large or changed while read).")
    if over:
        out.info(f"{over} file(s) over {max_tokens} tokens.")


def _tree(report, out: Output) -> None:
    """The counts as an indented tree, one column per tokenizer."""
    rows = report.rows()
    if sum(r.kind == "file" for r in rows) == 1 and rows[0].kind == "file":
        rows = rows[:1]  # one file: its row is the total
    widths = [max([len(name), 6] + [len(str(r.tokens[i])) for r in rows]) for i, name in enumerate(report.tokenizers)]
    out.data("  ".join(name.rjust(w) for name, w in zip(report.tokenizers, widths)) + "  path")
    for r in rows:
        cells = "  ".join(("-" if r.skipped else str(r.tokens[i])).rjust(w) for i, w in enumerate(widths))
        label = "  " * r.depth + r.name
        if r.kind == "total":
            label = f"total ({r.files} files, {r.bytes} bytes)"
        elif r.skipped:
            label += f"  (skipped: {r.skipped})"
        elif r.over:
            label += f"  (over {report.max_tokens})"
        out.data(f"{cells}  {label}")


def _csv(report) -> None:
    import csv

    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["path", "kind", "files", "bytes", *report.tokenizers, "over_budget", "skipped"])
    for r in report.rows():
        tokens = [""] * len(r.tokens) if r.skipped else r.tokens
        w.writerow([r.path, r.kind, r.files, r.bytes, *tokens, int(r.over), r.skipped])
    sys.stdout.flush()


BUDGET_HELP = "The token budget (special tokens such as BOS not counted)."


@click.command("truncate")
@click.argument("file", required=False)
@click.option("-m", "--model", "tokenizer_path", required=True, help="The tokenizer: tokenizer.json or .gguf.")
@click.option("--max-tokens", type=click.IntRange(min=0), required=True, help=BUDGET_HELP)
@click.option("--keep", type=click.Choice(["head", "tail", "both"]), default="head", show_default=True,
              help="Which end to keep; both: half each, the marker between.")
@click.option("--marker", default="\n[...]\n", show_default=repr("\n[...]\n"),
              help="Text put where text was removed (counted in the budget; '' for none).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: tokens, input_tokens, cut, text.")
def truncate_cmd(file, tokenizer_path, max_tokens, keep, marker, as_json):
    """Cut FILE (or '-' / stdin) to at most --max-tokens tokens at token boundaries; a text that fits
    is printed unchanged.

    \b
    llmkit tokenize truncate -m tok.json --max-tokens 4000 --keep both log.txt
    git diff | llmkit tokenize truncate -m model.gguf --max-tokens 8000 --marker '' | llmkit generate ...
    """
    from llmkit.io import read_text
    from llmkit.tokenize.corpus.budget import truncate

    tok = load_tokenizer(tokenizer_path)
    r = truncate(tok, read_text(resolve_inputs([file] if file else [], "text")[0]), max_tokens, keep, marker)
    out = Output()
    if as_json:
        out.json(r.to_dict())
    else:
        sys.stdout.write(r.text)
        sys.stdout.flush()
    if r.cut:
        out.info(f"kept {r.tokens} of {r.input_tokens} tokens ({keep}).")


@click.command("split")
@click.argument("file", required=False)
@click.option("-m", "--model", "tokenizer_path", required=True, help="The tokenizer: tokenizer.json or .gguf.")
@click.option("--max-tokens", type=click.IntRange(min=1), required=True, help=BUDGET_HELP)
@click.option("--jsonl", is_flag=True, help="One JSON object per piece: index, tokens, text.")
@click.option("--separator", default="\0", show_default="NUL, as xargs -0 reads",
              help="Written between pieces in text output.")
def split_cmd(file, tokenizer_path, max_tokens, jsonl, separator):
    """Split FILE (or '-' / stdin) into pieces of at most --max-tokens tokens, cut at line ends where
    possible, then at sentence ends, then at token boundaries; the pieces joined give the input back
    exactly.

    \b
    llmkit tokenize split -m tok.json --max-tokens 512 --jsonl book.txt > pieces.jsonl
    llmkit tokenize split -m model.gguf --max-tokens 2000 notes.md | xargs -0 -n1 echo
    """
    from llmkit.io import iter_lines
    from llmkit.tokenize.corpus.budget import split

    tok = load_tokenizer(tokenizer_path)
    path = resolve_inputs([file] if file else [], "text")[0]
    out = Output(jsonl=jsonl)
    for i, (text, n) in enumerate(split(tok, iter_lines([path]), max_tokens)):
        if jsonl:
            out.record({"index": i, "tokens": n, "text": text})
        else:
            sys.stdout.write((separator if i else "") + text)
            sys.stdout.flush()
