"""Old flag spellings that keep working until the next minor version, each with a one-line note.

A command lists its renames; before click parses, an old spelling in the arguments is rewritten to the
new one and stderr says so once per process. A rename may apply only to some values: `quant -t` used to
take the quantization type and now takes threads, so `-t Q4_K_M` is rewritten to `--type Q4_K_M` while
`-t 2` stays.

>>> r = [Renamed("-t", "--type", when=not_a_number)]
>>> rewrite(["in.gguf", "-t", "Q4_K_M", "-t", "2"], r, "quant", notes=[])
['in.gguf', '--type', 'Q4_K_M', '-t', '2']
>>> rewrite(["-tQ8_0", "--", "-t", "x"], r, "quant", notes=[])
['--type', 'Q8_0', '--', '-t', 'x']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import click

REMOVED_IN = "0.3"  # the version whose release drops these spellings


@dataclass(frozen=True)
class Renamed:
    """`old` (a flag taking a value, or a flag alone with `flag=True`) is now spelled `new`."""

    old: str
    new: str
    when: Callable[[str], bool] | None = None  # the rename applies only to values for which this holds
    flag: bool = False


def not_a_number(value: str) -> bool:
    """True for values that cannot be a count (a type name, a path), so a rename by value applies."""
    return not value.strip().lstrip("-").isdigit()


def rewrite(args: list[str], renames: list[Renamed], where: str, notes: list[str] | None = None) -> list[str]:
    """`args` with every old spelling replaced by its new one; the first use of each adds a note to
    `notes` (stderr when None)."""
    out, i, seen = [], 0, set()
    while i < len(args):
        a = args[i]
        if a == "--":
            out += args[i:]
            break
        hit = _match(a, args[i + 1] if i + 1 < len(args) else None, renames)
        if hit is None:
            out.append(a)
            i += 1
            continue
        r, value, used = hit
        if r.old not in seen:
            seen.add(r.old)
            _note(r, where, notes)
        out += [r.new] + ([] if value is None else [value])
        i += used
    return out


def _match(a: str, following: str | None, renames: list[Renamed]):
    """(rename, its value or None, arguments consumed) when `a` is an old spelling, else None."""
    for r in renames:
        if r.flag:
            if a == r.old:
                return r, None, 1
            continue
        if a == r.old and following is not None:
            value, used = following, 2
        elif r.old.startswith("--") and a.startswith(r.old + "="):
            value, used = a[len(r.old) + 1:], 1
        elif not r.old.startswith("--") and len(r.old) == 2 and a.startswith(r.old) and len(a) > 2 and a[2] != "-":
            value, used = a[2:].removeprefix("="), 1
        else:
            continue
        if r.when is None or r.when(value):
            return r, value, used
    return None


def _note(r: Renamed, where: str, notes: list[str] | None) -> None:
    text = (f"Note: `{where} {r.old}` is now `{r.new}`; the old spelling works until llmkit {REMOVED_IN}.")
    if notes is not None:
        notes.append(text)
    else:
        click.echo(text, err=True)


def renamed(*renames: Renamed):
    """Decorator for a click command (outermost): old spellings are rewritten before parsing."""

    def decorate(cmd: click.Command) -> click.Command:
        inner = cmd.parse_args

        def parse_args(ctx: click.Context, args: list[str]) -> list[str]:
            return inner(ctx, rewrite(list(args), list(renames), ctx.command_path))

        cmd.parse_args = parse_args
        cmd.renamed = list(renames)  # read by the docs' changelog test
        return cmd

    return decorate

