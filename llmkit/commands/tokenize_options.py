"""What the `tokenize` commands share: loading a tokenizer named by -m, and the -t thread count
(used by llmkit/commands/tokenize.py and tokenize_count.py)."""

from __future__ import annotations

from llmkit.commands._common import Output

THREADS_HELP = "Threads for large inputs (default: the idle cores; more than the cores is clamped)."


def load_tokenizer(path: str):
    """The tokenizer in a tokenizer.json or a GGUF model (imported here so `--help` stays quick)."""
    from llmkit import tokenize

    return tokenize.load(path)


def thread_count(threads: int | None, out: Output) -> int:
    """The thread count to use: the idle cores by default, at most the machine's cores."""
    import os

    from llmkit.llama.runtime import default_threads

    cores = os.cpu_count() or 1
    if threads is None:
        return default_threads(sample=False)
    if threads > cores:
        out.info(f"Note: --threads {threads} is more than the {cores} cores; using {cores}.")
        return cores
    return threads
