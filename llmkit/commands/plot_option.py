"""`--plot FILE`, declared the same way by every command that draws a chart (llmkit.plot draws it)."""

from __future__ import annotations

import click


def _check(ctx, param, value):
    """Refuse a chart that could not be written while the arguments are parsed, before any work: a
    usage error (exit 2) for the file's extension or folder, MissingDependency without matplotlib."""
    if value is None:
        return None
    from llmkit.errors import OptionError
    from llmkit.plot import check_path

    try:
        check_path(value)
    except OptionError as e:
        raise click.BadParameter(e.spelled({"plot": "--plot"}).removeprefix("--plot "), ctx, param) from None
    return value


def plot_option(what: str):
    """The option `--plot FILE` (the command receives `plot_path`, None when not given); `what` ends
    the help: 'Draw WHAT into FILE ...'."""
    return click.option("--plot", "plot_path", metavar="FILE", type=click.Path(dir_okay=False), callback=_check,
                        help=f"Draw {what} into FILE (.svg, .png or .pdf, by its extension; needs the plot extra).")
