"""Charts for the commands' `--plot FILE`: a chart is data (`Panel`s of `Series`), drawn headless with
matplotlib's Agg canvas (imported only when a chart is drawn) and written atomically in the format
the file's extension names (.svg, .png, .pdf).

`check_path` runs before any work, so a long run never ends on a chart it cannot write. In an SVG,
every series is an element with the id `series-P-S` (panel P, series S; the bars of a bar series are
`series-P-S-J`), every reference line `ref-P-K`, and text is kept as text, so a reader (or a test)
can count series and labels with an XML parser.

One call draws a chart, e.g. memory against context length with the machine's RAM marked:

    draw("kv.svg", [Panel("KV cache", "context (tokens)", "GiB",
                          [Series("model-a", [4096, 8192], [1.1, 1.9])], hlines=[(16.0, "RAM 16 GiB")])])
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field
from typing import Sequence

from llmkit.errors import MissingDependency, OptionError

FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf"}
STYLES = ("line", "points", "bar", "area")
DPI = 100
SIZE = (960, 540)  # pixels of the whole image (PNG), the same inches for SVG/PDF


@dataclass
class Series:
    """One named set of values. `style`: line (points joined), points, bar (x are category names;
    several bar series in a panel stand side by side), area (area series of a panel are stacked).
    `notes`: a short text written beside each point (e.g. a file type); `color`: any matplotlib colour
    (default: the next of the colour cycle)."""

    label: str
    x: Sequence
    y: Sequence[float]
    style: str = "line"
    notes: Sequence[str] = ()
    color: str | None = None

    def __post_init__(self):
        if self.style not in STYLES:  # chart builders choose styles, users never do: a bug in the caller
            raise ValueError(f"Series {self.label!r} has style {self.style!r}, which is not one of "
                             f"{', '.join(STYLES)}. Pass one of those to Series(style=...).")


@dataclass
class Panel:
    """One set of axes: its series, horizontal reference lines (value, label), log scales, limits."""

    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    hlines: list[tuple[float, str]] = field(default_factory=list)
    xlog: bool = False
    ylog: bool = False
    ylim: tuple[float, float] | None = None


def chart_format(path: str) -> str:
    """The format a chart file's extension names ('svg', 'png', 'pdf'); an OptionError otherwise.

    >>> chart_format("front.SVG"), chart_format("out/kv.png")
    ('svg', 'png')
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise OptionError("{plot} {path!r}: " + (f"'{ext}' is not a chart format" if ext else "no extension")
                          + "; name a file ending in .svg, .png or .pdf.", path=path)
    return FORMATS[ext]


def check_path(path: str) -> str:
    """Refuse, before any work starts, a chart that could not be written: an unknown extension or a
    missing folder (OptionError), or no matplotlib (MissingDependency). Returns the format."""
    fmt = chart_format(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OptionError("{plot} {path!r}: the folder {folder!r} does not exist; create it first.",
                          path=path, folder=os.path.dirname(path) or folder)
    _matplotlib()
    return fmt


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise MissingDependency("matplotlib", "plot") from None
    return matplotlib


def draw(path: str, panels: Sequence[Panel], *, title: str = "", columns: int = 1,
         size: tuple[int, int] = SIZE) -> None:
    """Draw the panels (`columns` side by side, rows as needed) into `path`, `size` pixels, in the
    format of its extension; written atomically."""
    fmt = chart_format(path)
    data = render(panels, fmt, title=title, columns=columns, size=size)
    from llmkit.io import atomic_write_bytes

    atomic_write_bytes(path, data)


def render(panels: Sequence[Panel], fmt: str, *, title: str = "", columns: int = 1,
           size: tuple[int, int] = SIZE) -> bytes:
    """The chart file's bytes in `fmt` ('svg', 'png', 'pdf')."""
    mpl = _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = max(1, math.ceil(len(panels) / columns))
    # text stays text in an SVG (searchable, countable); ids and metadata do not change between runs
    with mpl.rc_context({"svg.fonttype": "none", "svg.hashsalt": "llmkit", "font.size": 9}):
        fig = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, columns, squeeze=False)
        for p, (ax, panel) in enumerate(zip(axes.flat, panels)):
            _draw_panel(ax, panel, p)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        buf = io.BytesIO()
        meta = {"svg": {"Date": None}, "pdf": {"CreationDate": None}, "png": {}}[fmt]
        fig.savefig(buf, format=fmt, dpi=DPI, metadata=meta)
    return buf.getvalue()


def _draw_panel(ax, panel: Panel, p: int) -> None:
    """One panel's series, notes, reference lines, scales and legend."""
    bars = [s for s in panel.series if s.style == "bar"]
    categories = list(dict.fromkeys(str(x) for s in bars for x in s.x))
    areas = [s for s in panel.series if s.style == "area"]
    if areas:
        colors = [s.color for s in areas] if all(s.color for s in areas) else None
        polys = ax.stackplot(areas[0].x, *[s.y for s in areas], labels=[s.label for s in areas], colors=colors)
        for poly, s in zip(polys, areas):
            poly.set_gid(f"series-{p}-{panel.series.index(s)}")
    width = 0.8 / max(len(bars), 1)
    for i, s in enumerate(panel.series):
        gid = f"series-{p}-{i}"
        if s.style == "bar":
            b = bars.index(s)
            xs = [categories.index(str(x)) + (b - (len(bars) - 1) / 2) * width for x in s.x]
            for j, rect in enumerate(ax.bar(xs, s.y, width=width, label=s.label, color=s.color)):
                rect.set_gid(f"{gid}-{j}")
        elif s.style == "line":
            xs = list(s.x)
            ax.plot(xs, s.y, marker="o", markersize=4, label=s.label, gid=gid, color=s.color)
        elif s.style == "points":
            xs = list(s.x)
            ax.scatter(xs, s.y, s=18, label=s.label, gid=gid, color=s.color)
        else:
            continue
        bar = s.style == "bar"
        for j, (x, y, note) in enumerate(zip(xs, s.y, s.notes)):
            # every other series writes its notes below its points, so two series' names rarely overlap
            ax.annotate(note, (x, y), xytext=(0, 3) if bar else (4, 4 if i % 2 == 0 else -10),
                        textcoords="offset points", fontsize=7,
                        ha="center" if bar else "left", gid=f"note-{p}-{i}-{j}")
    for k, (value, label) in enumerate(panel.hlines):
        ax.axhline(value, linestyle="--", color="0.35", linewidth=1, label=label, gid=f"ref-{p}-{k}")
    if categories:
        ax.set_xticks(range(len(categories)), categories, rotation=20 if len(categories) > 4 else 0,
                      ha="right" if len(categories) > 4 else "center")
    if panel.xlog:
        from matplotlib.ticker import ScalarFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())  # 1, 10, 100 rather than 10^0, 10^1, 10^2
    if panel.ylog:
        ax.set_yscale("log")
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    ax.set_title(panel.title)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    if len(panel.series) + len(panel.hlines) > 1:
        ax.legend(fontsize=7)
