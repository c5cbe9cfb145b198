"""The `llmkit` root command: registers command groups lazily and maps errors to exit codes."""

from __future__ import annotations

import importlib
import os
import sys

import click

from llmkit import __version__

# name -> (module, attribute, one-line help). Modules are imported only when their group runs,
# so `llmkit --help` stays instant (no numpy/torch/faiss/llama_cpp at start-up).
GROUPS = {
    "tokenize": ("llmkit.commands.tokenize", "group", "Train, apply, inspect and compare subword tokenizers."),
    "generate": ("llmkit.commands.generate", "command", "Stream text from a GGUF model (speculative decoding, lookup)."),
    "constrain": ("llmkit.commands.constrain", "command", "Generate text that follows a GBNF grammar or a JSON schema."),
    "server": ("llmkit.commands.server", "group", "Generate on running llama-servers: one prompt, or a JSONL batch."),
    "kv": ("llmkit.commands.kv", "group", "Plan KV-cache memory; save and restore KV slots."),
    "rag": ("llmkit.commands.rag", "group", "Index documents; BM25 + dense hybrid search, rerank, answer, evaluate."),
    "quant": ("llmkit.commands.quant", "group", "Quantize GGUF models byte-identically to llama.cpp; errors, perplexity."),
    "gguf": ("llmkit.commands.gguf", "group", "Inspect GGUF files (hardened reader)."),
    "doctor": ("llmkit.commands.doctor", "command", "Check the install: extras, llama.cpp tools, models, caches."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx):
        return sorted(GROUPS)

    def get_command(self, ctx, name):
        if name not in GROUPS:
            return None
        module, attr, _ = GROUPS[name]
        mod = importlib.import_module(module)
        return _spell_option_errors(getattr(mod, attr), getattr(mod, "FLAGS", {}))

    def format_commands(self, ctx, formatter):
        rows = [(name, GROUPS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmkit")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or statistics on stderr.")
@click.option("--debug", is_flag=True, help="Show tracebacks (also LLMKIT_DEBUG=1).")
@click.pass_context
def cli(ctx, quiet, debug):
    """Composable tools for running LLMs on your own machine.

    Data goes to stdout, everything else to stderr; '-' reads standard input.
    """
    from llmkit.commands._common import Settings

    ctx.obj = Settings(quiet=quiet, debug=debug or _debug_env())


def _spell_option_errors(command: click.Command, extra: dict) -> click.Command:
    """Wrap every leaf command once so a library OptionError names the flags of the command that ran."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _spell_option_errors(sub, extra)
        return command
    if getattr(command, "_spells_option_errors", False):
        return command
    inner = command.invoke

    def invoke(ctx):
        from llmkit.commands._common import flag_spelling
        from llmkit.errors import BadInput, OptionError

        try:
            return inner(ctx)
        except OptionError as e:
            raise BadInput(e.spelled(flag_spelling(command, extra))) from e

    command.invoke = invoke
    command._spells_option_errors = True
    return command


def _debug_env() -> bool:
    from llmkit import config

    return config.flag("LLMKIT_DEBUG")


def main(argv=None) -> None:
    """Entry point: run the CLI and turn every failure into one line on stderr and an exit code."""
    from llmkit.errors import LlmkitError

    debug = _debug_env() or "--debug" in (argv if argv is not None else sys.argv[1:])
    _terminate_like_interrupt()
    try:
        cli.main(args=argv, prog_name="llmkit", standalone_mode=False)
    except click.exceptions.Exit as e:
        _exit(e.exit_code)
    except click.ClickException as e:  # usage errors: exit 2
        e.show()
        _exit(e.exit_code)
    except click.exceptions.Abort as e:  # click turns KeyboardInterrupt (and Terminated) into Abort
        _exit(128 + getattr(e.__cause__, "signum", 2))
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP (Terminated): 128 + the signal
        _flush_quietly()
        _exit(128 + getattr(e, "signum", 2))
    except BrokenPipeError:
        # `llmkit ... | head`: the reader went away; exit quietly without a traceback.
        _silence_stdout()
        _exit(0)
    except LlmkitError as e:
        if debug:
            raise
        _flush_quietly()
        click.echo(f"Error: {e}", err=True)
        _exit(e.exit_code)
    except Exception as e:  # anything unexpected: still one line, traceback with --debug
        if debug:
            raise
        _flush_quietly()
        click.echo(f"Error: {type(e).__name__}: {e}. Re-run with --debug for the traceback.", err=True)
        _exit(1)
    _flush_quietly()


def _terminate_like_interrupt() -> None:
    """SIGTERM and SIGHUP unwind the stack like Ctrl-C, so temporary files are removed (`kill` during
    `llmkit quant` used to leave a half-written .tmp beside the output); an inherited 'ignore' is kept."""
    import signal
    import threading

    from llmkit.errors import Terminated

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        raise Terminated(signum)

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, handler)


def _flush_quietly() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    except (OSError, ValueError):
        pass


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _exit(code: int) -> None:
    sys.exit(code)


if __name__ == "__main__":
    main()
