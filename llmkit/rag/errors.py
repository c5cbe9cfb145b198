"""Errors about option values, worded without a front end's spelling of the options.

A message names an option as `{name}` (the library's field name, e.g. `{parent_size}`); `str()` of the
error writes the field name, and `spelled(names)` writes a front end's own spelling (the CLI maps
`parent_size` to `--parent-size`), so the library never names command-line flags itself.

>>> e = OptionError("{parent_size} {value} is smaller than the chunk size", value=300)
>>> str(e), e.spelled({"parent_size": "--parent-size"})
('parent_size 300 is smaller than the chunk size', '--parent-size 300 is smaller than the chunk size')
"""

from __future__ import annotations

import string

from llmkit.errors import BadInput


class _Names(dict):
    """Values by name; a name without a value is an option, written as `spelling` says (or as is)."""

    def __init__(self, values: dict, spelling: dict):
        super().__init__(values)
        self.spelling = spelling

    def __missing__(self, key: str) -> str:
        return self.spelling.get(key, key)


class OptionError(BadInput):
    """A bad option value (exit code 1, like any BadInput)."""

    def __init__(self, template: str, **values):
        self.template, self.values = template, values
        super().__init__(self.spelled({}))

    def spelled(self, spelling: dict[str, str]) -> str:
        """The message with every option written as `spelling[name]` (default: the name itself)."""
        return string.Formatter().vformat(self.template, (), _Names(self.values, spelling))
