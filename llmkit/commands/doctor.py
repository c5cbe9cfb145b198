"""`llmkit doctor`: what this install can run, and the command that fixes each thing that is missing."""

from __future__ import annotations

import click

from llmkit.commands._common import Output

_MARK = {"ok": "ok", "missing": "--", "error": "!!"}


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="The report as one JSON object.")
def command(as_json):
    """Check the install: extras, llama.cpp and its tools, packaged models, caches.

    Exits 1 when something installed cannot run; features not installed are listed with the command
    that adds them.
    """
    from llmkit.doctor import check

    report = check()
    out = Output()
    if as_json:
        out.json(report.to_dict())
    else:
        out.data(f"llmkit {report.version} (Python {report.python}, {report.prefix})")
        section = None
        for c in report.checks:
            if c.section != section:
                section = c.section
                out.data(f"\n{section}")
            out.data(f"  {_MARK[c.status]} {c.name:<17} {c.detail}")
            if c.fix and c.status != "ok":
                out.data(f"  {'':<20} fix: {c.fix}")
        errors = sum(c.status == "error" for c in report.checks)
        out.data("\n" + ("everything installed can run" if not errors else f"{errors} problem(s): see the fix lines"))
    if not report.ok:
        raise SystemExit(1)
