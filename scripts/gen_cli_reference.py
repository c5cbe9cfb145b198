"""Write docs/reference/cli.md: every llmkit command's --help, generated so the reference cannot drift.

    python scripts/gen_cli_reference.py            # rewrite docs/reference/cli.md
    python scripts/gen_cli_reference.py --check    # exit 1 if the file differs from the CLI (tests run this)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "reference" / "cli.md"
WIDTH = 100


def commands(cmd: click.Command, ctx: click.Context):
    """(context, command) for `cmd` and every visible subcommand below it, depth first."""
    yield ctx, cmd
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from commands(sub, click.Context(sub, info_name=name, parent=ctx, terminal_width=WIDTH,
                                                   max_content_width=WIDTH))


def render() -> str:
    from llmkit.cli import cli

    root = click.Context(cli, info_name="llmkit", terminal_width=WIDTH, max_content_width=WIDTH)
    parts = ["# Command-line reference", "",
             "Generated from `--help` by `python scripts/gen_cli_reference.py`; a test keeps it equal to the CLI.",
             "Guides with examples: [the docs index](../README.md).", ""]
    toc, sections = [], []
    for ctx, cmd in commands(cli, root):
        path = ctx.command_path
        anchor = path.replace(" ", "-")
        toc.append(f"{'  ' * (path.count(' '))}- [`{path}`](#{anchor})")
        sections += [f'<a id="{anchor}"></a>', "", f"## `{path}`", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(parts + toc + [""] + sections).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    text = render()
    if ap.parse_args().check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python scripts/gen_cli_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
