"""`llmkit tokenize train` (registered in the `tokenize` group by llmkit/commands/tokenize.py)."""

from __future__ import annotations

import json

import click

from llmkit.commands._common import Output, progress_bar, resolve_inputs, size_value


def _size(ctx, param, value):
    """--max-memory as bytes (512M, 2G, ...)."""
    return None if value is None else size_value(value)


@click.command("train")
@click.argument("inputs", nargs=-1)
@click.option("--algo", type=click.Choice(["bpe", "wordpiece", "unigram"]), default="bpe", show_default=True,
              help="Subword algorithm.")
@click.option("--vocab-size", type=click.IntRange(min=1), required=True, help="Target vocabulary size (special tokens included).")
@click.option("--min-frequency", type=click.IntRange(min=0), default=0, show_default=True,
              help="Stop merging below this pair count (Unigram: drop rarer words).")
@click.option("--special", "specials", multiple=True, help="Special token (repeatable). Default: none for BPE, [UNK] for WordPiece, <unk> for Unigram.")
@click.option("--lowercase", is_flag=True, help="Lower-case text first (WordPiece, Unigram).")
@click.option("--limit-alphabet", type=click.IntRange(min=1), metavar="N",
              help="WordPiece: keep only the N most frequent characters (BERT uses 1000); the others are left "
                   "out of the words, as HF's limit_alphabet does. For corpora with many rare characters (code).")
@click.option("--max-memory", callback=_size, metavar="SIZE",
              help="Bound on training memory, e.g. 2G (default: 3/4 of this machine's). When the distinct words "
                   "outgrow it, the rarest are dropped (lossy counting): every count stays exact or at most E low "
                   "and a dropped word occurred at most E times; E and what was dropped are reported.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write tokenizer.json here (default: stdout).")
@click.option("--trace", is_flag=True, help="Print every training step (merges/scores/pruning).")
@click.option("--jsonl", is_flag=True, help="With --trace: one JSON object per step.")
def train_cmd(inputs, algo, vocab_size, min_frequency, specials, lowercase, limit_alphabet, max_memory, output, trace,
              jsonl):
    """Train a tokenizer on text FILES, directories or '-' (stdin).

    Memory follows the corpus's distinct words, not its size: a corpus of any size trains within
    --max-memory, exactly when its words fit (BPE's merges are then HF's), else with its rarest
    words pruned, which is reported on stderr.

    \b
    llmkit tokenize train --algo bpe --vocab-size 8000 -o tok.json corpus/
    llmkit tokenize train --algo bpe --vocab-size 32000 --max-memory 2G -o tok.json big-corpus/
    llmkit tokenize train --algo wordpiece --vocab-size 8000 --limit-alphabet 1000 -o tok.json src/
    cat notes.txt | llmkit tokenize train --algo unigram --vocab-size 500 --trace > tok.json
    """
    from llmkit.io import expand_inputs, iter_lines
    from llmkit.tokenize.training.train import input_bytes, train

    if limit_alphabet is not None and algo != "wordpiece":
        raise click.BadParameter(f"applies to WordPiece only ({algo} keeps its whole alphabet). Drop it or pass "
                                 "--algo wordpiece.", param_hint="--limit-alphabet")
    out = Output(jsonl=jsonl)
    paths = expand_inputs(resolve_inputs(inputs, "corpus"))
    if not paths:
        from llmkit.errors import BadInput

        raise BadInput("no text files found in the given inputs. Pass .txt/.md files or directories containing them.")
    trace_fn = _tracer(out, algo, jsonl, to_stdout=output is not None) if trace else None

    def pruned(report) -> None:
        if report.prunes:
            out.warn(report.text())

    with progress_bar(f"training {algo}") as bar:
        tok = train(iter_lines(paths), algo, vocab_size, min_frequency=min_frequency,
                    special_tokens=list(specials) if specials else None, lowercase=lowercase,
                    progress=bar, trace=trace_fn, work_bytes=input_bytes(paths), max_memory=max_memory,
                    pruned=pruned, limit_alphabet=limit_alphabet)
    if output:
        tok.save(output)
        out.info(f"{algo}: {tok.vocab_size} tokens -> {output}")
    else:
        out.data(json.dumps(tok.to_hf(), ensure_ascii=False))
    if tok.vocab_size < vocab_size:
        out.info(f"Note: {tok.vocab_size} tokens, fewer than --vocab-size {vocab_size}: the corpus has nothing more "
                 "to add (HF stops there too); a larger corpus gives more.")


def _tracer(out: Output, algo: str, jsonl: bool, to_stdout: bool):
    """--trace's callback: each training step as a line (JSON with --jsonl), on stdout when the
    tokenizer goes to a file, else on stderr."""
    from llmkit.tokenize.training.train import step_text

    def trace_fn(step: dict) -> None:
        line = json.dumps(step, ensure_ascii=False) if jsonl else step_text(algo, step)
        if to_stdout:
            out.data(line)
        else:
            click.echo(line, err=True)

    return trace_fn
