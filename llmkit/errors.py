"""Exceptions the library raises; the CLI maps them to one clear line on stderr."""


class LlmkitError(Exception):
    """Base class: the message is one sentence saying what is wrong and how to fix it."""

    exit_code = 1


class BadInput(LlmkitError):
    """The user's data or arguments cannot be used (empty corpus, id out of range, ...)."""


class BadFileFormat(LlmkitError):
    """A file is not in the expected format (truncated JSON, not a GGUF, unknown version, ...)."""


class MissingDependency(LlmkitError):
    """An optional package is not installed."""

    def __init__(self, package: str, extra: str):
        super().__init__(
            f"this command needs the Python package '{package}'. "
            f"Install it with: pip install 'llmkit[{extra}]'"
        )


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C (temp files removed), exit 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum
