"""Exceptions the library raises; the CLI maps them to one clear line on stderr."""

import string


class LlmkitError(Exception):
    """Base class: the message is one sentence saying what is wrong and how to fix it."""

    exit_code = 1


class BadInput(LlmkitError):
    """The user's data or arguments cannot be used (empty corpus, id out of range, ...)."""


class OptionError(BadInput):
    """A bad option value, worded without any front end's spelling of the option.

    The message names an option as `{name}` (the library's parameter name, e.g. `{parent_size}`);
    `str()` writes the name itself, and `spelled(names)` a front end's spelling (the CLI writes the
    flag of the command that ran, `--parent-size`), so the library never names command-line flags.

    >>> e = OptionError("{parent_size} {value} is smaller than the chunk size", value=300)
    >>> str(e), e.spelled({"parent_size": "--parent-size"})
    ('parent_size 300 is smaller than the chunk size', '--parent-size 300 is smaller than the chunk size')
    """

    def __init__(self, template: str, **values):
        self.template, self.values = template, values
        super().__init__(self.spelled({}))

    def spelled(self, spelling: dict) -> str:
        """The message with every option written as `spelling[name]` (default: the name itself)."""
        return string.Formatter().vformat(self.template, (), _Names(self.values, spelling))


class _Names(dict):
    """Values by name; a name without a value is an option, written as `spelling` says (or as is)."""

    def __init__(self, values: dict, spelling: dict):
        super().__init__(values)
        self.spelling = spelling

    def __missing__(self, key: str) -> str:
        return self.spelling.get(key, key)


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
