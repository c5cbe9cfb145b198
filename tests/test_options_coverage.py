"""Every option any command shows in --help is used by at least one test (a flag no test passes can
break silently). Walks the click command tree from llmkit.cli; the allow-list says why each
exception cannot be tested here."""

import re
from pathlib import Path

import click

from llmkit.cli import cli

TESTS = Path(__file__).parent

ALLOWED: dict[str, str] = {
    # flag -> why no test here can pass it (each entry is a feature shipped untested: keep this empty
    # unless a flag needs hardware or services a test runner cannot have)
}


def walk(command: click.Command, path=("llmkit",)):
    """(command path, click.Option) for every option of every command under `command`."""
    ctx = click.Context(command, info_name=path[-1])
    for p in command.params:
        if isinstance(p, click.Option) and not p.hidden:
            yield " ".join(path), p
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from walk(sub, path + (name,))


def test_every_help_option_is_used_by_a_test():
    sources = "\n".join(p.read_text(encoding="utf-8") for p in TESTS.glob("*.py") if p.name != Path(__file__).name)
    used = set(re.findall(r"""["'](--?[A-Za-z][\w-]*)(?=["'=])""", sources))
    options = list(walk(cli))
    assert len(options) > 100  # the walk reached every group (lazy groups included)
    missing = []
    for where, opt in options:
        names = [n for n in opt.opts + opt.secondary_opts if n not in ("-h", "--help")]
        if names and not any(n in used or n in ALLOWED for n in names):
            missing.append(f"{where} {'/'.join(names)}")
    assert not missing, "options no test passes (add a test, or an ALLOWED entry saying why not):\n" + "\n".join(
        sorted(set(missing)))
    stale = [f for f in ALLOWED if f in used]
    assert not stale, f"allow-listed flags that a test does pass now (drop them from ALLOWED): {stale}"
