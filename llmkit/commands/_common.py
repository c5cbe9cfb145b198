"""Shared CLI plumbing: settings, the output object, input resolution, progress bars, option bundles."""

from __future__ import annotations

import functools
import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import click


@dataclass
class Settings:
    quiet: bool = False
    debug: bool = False


def settings() -> Settings:
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_object(Settings) if ctx else None
    return obj or Settings()


class Output:
    """Decides where things go: data to stdout (flushed per record), messages to stderr."""

    def __init__(self, jsonl: bool = False):
        self.jsonl = jsonl
        self.quiet = settings().quiet

    def data(self, text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def record(self, obj) -> None:
        sys.stdout.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    def json(self, obj) -> None:
        sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=2) + "\n")
        sys.stdout.flush()

    def info(self, text: str) -> None:
        """Statistics and notes for humans: stderr, silenced by --quiet."""
        if not self.quiet:
            click.echo(text, err=True)

    def warn(self, text: str) -> None:
        click.echo(f"Warning: {text}", err=True)

    def table(self, table) -> None:
        """Print a rich table to stdout (it is the command's data)."""
        from rich.console import Console

        # a pipe gets the full table (rich would otherwise squeeze it to 80 columns)
        width = None if sys.stdout.isatty() else 200
        Console(file=sys.stdout, width=width).print(table)


def resolve_inputs(inputs: tuple[str, ...] | list[str], what: str = "input") -> list[str]:
    """No inputs + piped stdin means stdin; no inputs + terminal is a usage error (never a hang)."""
    if inputs:
        return list(inputs)
    if sys.stdin is None or sys.stdin.isatty():
        raise click.UsageError(f"no {what} given. Pass file paths, or '-' / a pipe for standard input.")
    return ["-"]


def read_prompt(prompt: str | None, prompt_file: str | None = None) -> str:
    """A whole prompt: from --prompt-file, the argument, or stdin for '-' / no argument with a pipe."""
    if prompt_file:
        from llmkit.io import read_text

        return read_text(prompt_file)
    if prompt is None or prompt == "-":
        if prompt is None and (sys.stdin is None or sys.stdin.isatty()):
            raise click.UsageError("no prompt given. Pass it as an argument, --prompt-file, or '-' / a pipe.")
        return sys.stdin.read()
    return prompt


_INTERRUPTED = False


def _in_c_callback(frame) -> bool:
    """Is Python running inside a ctypes callback that llama.cpp called (its log callback)?"""
    from llmkit.llama.runtime import CALLBACK_CODES

    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code in CALLBACK_CODES or frame.f_code.co_name == "llama_log_callback":
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum, frame) -> None:
    global _INTERRUPTED
    _INTERRUPTED = True
    if not _in_c_callback(frame):  # raised there, ctypes would print and swallow it
        raise KeyboardInterrupt


def _remember_interrupts() -> None:
    """Ctrl-C during generation can land while llama.cpp is inside a Python callback (its log
    callback runs hundreds of times per run); ctypes then swallows the KeyboardInterrupt and
    generation went on (seen once in CI). The handler sets a flag that the token stream checks, and
    raises only outside such callbacks."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def stdout_stream(enabled: bool):
    """A callback that writes streamed text to stdout and flushes (a no-op when not enabled); it
    raises KeyboardInterrupt for a Ctrl-C that a callback swallowed."""
    _remember_interrupts()

    def write(piece: str) -> None:
        if _INTERRUPTED:
            raise KeyboardInterrupt
        if enabled:
            sys.stdout.write(piece)
            sys.stdout.flush()

    return write


def read_text_arg(value: str | None, what: str = "text") -> Iterator[str]:
    """Yield the lines to process: the argument itself, or stdin lines for '-' / no argument."""
    if value is not None and value != "-":
        yield value
        return
    if value is None and (sys.stdin is None or sys.stdin.isatty()):
        raise click.UsageError(f"no {what} given. Pass it as an argument, or '-' / a pipe for standard input.")
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        from llmkit.errors import BadInput

        raise BadInput(f"standard input is not valid UTF-8 (byte {e.start}). Convert it to UTF-8 first.") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # a trailing newline does not make an extra empty record
    for line in lines:
        yield line[:-1] if line.endswith("\r") else line


@contextmanager
def progress_bar(description: str) -> Iterator[Callable[[int, int, str], None]]:
    """Yield a callback `update(done, total, note)`; a rich bar on stderr only when it is a terminal."""
    if settings().quiet or not sys.stderr.isatty():
        yield lambda done, total, note="": None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    ) as prog:
        task = prog.add_task(description, total=None, note="")

        def update(done: int, total: int, note: str = "") -> None:
            prog.update(task, completed=done, total=total or None, note=note)

        yield update


def size_value(text: str, param_hint: str | None = None) -> int:
    """A size option's bytes in the one grammar of `llmkit.config.parse_size` (512M, 1.5G); a bad one is a
    usage error."""
    from llmkit.config import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise click.BadParameter(f"{e}.", param_hint=param_hint) from None


def flag_spelling(command: click.Command, extra: dict | None = None) -> dict[str, str]:
    """Library parameter name -> this command's flag (the long form where there is one)."""
    names = {}
    for p in command.params:
        if isinstance(p, click.Option) and p.name:
            longs = [o for o in p.opts if o.startswith("--")]
            names[p.name] = longs[0] if longs else p.opts[0]
    return {**names, **(extra or {})}


def bundle(name: str, options: list, build, own: tuple[str, ...] = ()):
    """A decorator adding `options` to a command and passing their values as one keyword argument
    `name` = build(**values) instead; the values named in `own` (what the command itself uses, such as
    an output path declared among the options to keep --help's order) go to the command as they are."""
    def probe():
        pass

    for o in options:
        o(probe)
    keys = [p.name for p in probe.__click_params__ if p.name not in own]

    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, **kw):
            kw[name] = build(**{k: kw.pop(k) for k in keys})
            return f(*args, **kw)

        for o in reversed(options):
            wrapper = o(wrapper)
        return wrapper

    return deco
