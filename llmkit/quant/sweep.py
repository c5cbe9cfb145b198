"""A quantization sweep: one base model quantized to several llama.cpp file types and size budgets,
each file measured against the base as `quant ppl --kld` measures it, for the size–KL-divergence
front of a model.

Every point is the library's own two steps, so a point equals running them by hand:
`pipeline.quantize` (the file `llmkit quant BASE --type T -o F` writes) and
`quality.kld.kl_divergence` against the base's log-probabilities, saved once by
`quality.kld.save_base` (`llmkit quant ppl -m BASE --save-logits` then `--kld`).

The folder keeps the state: `sweep.jsonl` (a header with the settings, then one finished point per
line, rewritten atomically after each point), `base.kld`, and the quantized files unless they are
deleted once measured. A run over the same folder skips the points it finds finished (their file still
there when files are kept), so an interrupted sweep goes on where it stopped; a folder whose settings
differ (another base, text, context, imatrix, batch layout) is refused rather than mixed."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from llmkit.errors import BadFileFormat, BadInput, OptionError
from llmkit.quant.options import Progress, QuantOptions
from llmkit.quant.quality.scoring import EvalOptions

FORMAT, VERSION = "llmkit.quant.sweep", 1
STATE, BASE_LOGITS = "sweep.jsonl", "base.kld"
KINDS = {"type": "llama.cpp types", "budget": "llmkit budgets"}  # point kind -> its series in the chart


@dataclass
class SweepOptions:
    """What a sweep measures: llama.cpp file `types` and `target_sizes` (bytes, each a size budget),
    quantized with the importance matrix at `imatrix_path` when given; scored on `n_ctx`-token chunks
    (at most `chunks`, 0 = all) evaluated as `evaluation` says; `keep_files` or delete each file once
    measured. `progress(stage, done, total, note)` and `notice` as in QuantOptions."""

    types: list[str] = field(default_factory=list)
    target_sizes: list[int] = field(default_factory=list)
    imatrix_path: str | None = None
    n_ctx: int = 512
    chunks: int = 0
    evaluation: EvalOptions = field(default_factory=EvalOptions)
    keep_files: bool = True
    progress: Progress | None = None
    notice: Callable[[str], None] | None = None


@dataclass
class SweepPoint:
    """One measured file: its name (the type, or the budget as `size-900M`), kind (type | budget),
    path (None once deleted), size in bytes, bits per weight of its tensors, and the statistics of
    `quant ppl --kld --json` (kld: mean, uncertainty, max, min, p99.9, ...; ppl, ppl_base, same_top_p)."""

    name: str
    kind: str
    file: str | None
    bytes: int
    bpw: float
    kld: dict
    ppl: dict
    ppl_base: dict
    same_top_p: dict
    seconds: dict
    target_size: int | None = None
    resumed: bool = False

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("name", "kind", "file", "bytes", "bpw", "kld", "ppl", "ppl_base",
                                           "same_top_p", "seconds", "resumed")}
        if self.target_size is not None:
            d["target_size"] = self.target_size
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SweepPoint:
        return cls(d["name"], d["kind"], d["file"], d["bytes"], d["bpw"], d["kld"], d["ppl"], d["ppl_base"],
                   d["same_top_p"], d["seconds"], d.get("target_size"))


def size_name(n: int) -> str:
    """A budget's name: its bytes in the largest binary unit that gives them back with at most three
    decimals as `--target-size` reads them (so `1.1G` stays `1.1G`), else the bytes.

    >>> size_name(900 << 20), size_name(3 << 30), size_name(int(1.1 * (1 << 30))), size_name(1000)
    ('900M', '3G', '1.1G', '1000')
    """
    from llmkit.config import parse_size

    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n < 1 << shift:
            continue
        for places in range(4 if n < 1024 << shift else 1):
            text = f"{n / (1 << shift):.{places}f}{unit}"
            if parse_size(text) == n:
                return text
    return str(n)


def plan(base: str, opts: SweepOptions) -> list[tuple[str, str, QuantOptions, str]]:
    """(name, kind, QuantOptions, file name) per point, every option checked before any work."""
    from llmkit.quant.plan.rules import IMATRIX_FTYPES, resolve_ftype

    if not opts.types and not opts.target_sizes:
        raise OptionError("give file types ({types}) or size budgets ({target_sizes}) to sweep.")
    stem = os.path.splitext(os.path.basename(base))[0]
    points, seen = [], set()
    for t in opts.types:
        ftype = resolve_ftype(t)
        if ftype in IMATRIX_FTYPES and not opts.imatrix_path:
            raise OptionError("file type {ftype} needs an importance matrix ({imatrix_path}), as in llama-quantize.",
                              ftype=ftype)
        if ftype not in seen:
            seen.add(ftype)
            points.append((ftype, "type", QuantOptions(ftype=ftype), f"{stem}-{ftype}.gguf"))
    for n in opts.target_sizes:
        name = f"size-{size_name(n)}"
        if n <= 0:
            raise OptionError("a size budget {target_sizes} must be positive bytes (got {n}).", n=n)
        if name not in seen:
            seen.add(name)
            points.append((name, "budget", QuantOptions(target_size=n), f"{stem}-{name}.gguf"))
    for _, _, q, _ in points:
        q.check()
    return points


def sweep(base: str, text: str, out_dir: str, opts: SweepOptions) -> Iterator[SweepPoint]:
    """Quantize `base` to every point of `opts` into `out_dir` and measure each against the base on
    `text`; yields the points in order, finished ones from an earlier run (`resumed`) included."""
    from llmkit.quant.pipeline import quantize
    from llmkit.quant.quality.kld import kl_divergence, save_base

    points = plan(base, opts)
    if not os.path.isfile(base):
        raise BadInput(f"cannot read '{base}': no such file. Give the base GGUF model (F16, BF16 or F32).")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise BadInput(f"cannot create the folder '{out_dir}': {e.strerror}. Give another output folder.") from None
    settings = _settings(base, text, opts)
    state_path = os.path.join(out_dir, STATE)
    # base logits are reused only beside a state of the same settings (one left from another text is not)
    have_base = os.path.exists(state_path) and os.path.exists(os.path.join(out_dir, BASE_LOGITS))
    done = _read_state(state_path, settings)
    imatrix = None
    base_logits = os.path.join(out_dir, BASE_LOGITS)
    stage = _stage(opts.progress)
    for name, kind, qopts, file_name in points:
        dst = os.path.join(out_dir, file_name)
        old = done.get(name)
        if old is not None and (not opts.keep_files or _intact(dst, old.bytes)):
            yield replace(old, file=dst if os.path.isfile(dst) else None, resumed=True)
            continue
        if opts.imatrix_path and imatrix is None:
            from llmkit.quant.calibration.imatrix import load_imatrix

            imatrix = load_imatrix(opts.imatrix_path)
        if not have_base:
            save_base(base, text, base_logits, opts.n_ctx, opts.chunks, progress=stage("base logits"),
                      options=opts.evaluation)
            _write_state(state_path, settings, done)
            have_base = True
        t0 = time.perf_counter()
        run = quantize(base, dst, replace(qopts, imatrix=imatrix, threads=opts.evaluation.threads,
                                          progress=opts.progress, notice=opts.notice))
        t1 = time.perf_counter()
        r = kl_divergence(dst, base_logits, progress=stage(f"kld {name}"), options=opts.evaluation).to_dict()
        point = SweepPoint(name, kind, dst, os.path.getsize(dst), run.report.to_dict()["bpw"], r["kld"], r["ppl"],
                           r["ppl_base"], r["same_top_p"],
                           {"quantize": round(t1 - t0, 3), "kld": round(time.perf_counter() - t1, 3)},
                           qopts.target_size)
        if not opts.keep_files:
            os.remove(dst)
            point.file = None
        done[name] = point
        _write_state(state_path, settings, done)
        yield point


def _intact(path: str, size: int) -> bool:
    """A kept point's file is still there at its measured size (else the point is done again)."""
    return os.path.isfile(path) and os.path.getsize(path) == size


def _settings(base: str, text: str, opts: SweepOptions) -> dict:
    """What every point's figures depend on besides the point itself."""
    st = os.stat(base)
    imatrix = None
    if opts.imatrix_path:
        h = hashlib.sha256()
        try:
            with open(opts.imatrix_path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError as e:
            raise BadInput(f"cannot read '{opts.imatrix_path}': {e.strerror}. Check the imatrix path.") from None
        imatrix = h.hexdigest()
    ev = opts.evaluation
    return {"base": os.path.abspath(base), "base_bytes": st.st_size, "base_mtime_ns": st.st_mtime_ns,
            "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "n_ctx": opts.n_ctx,
            "chunks": opts.chunks, "imatrix_sha256": imatrix, "n_batch": ev.n_batch, "n_ubatch": ev.n_ubatch,
            "flash_attn": ev.flash_attn}


def _read_state(path: str, settings: dict) -> dict[str, SweepPoint]:
    """The finished points of an earlier run with the same settings (empty for a new folder)."""
    if not os.path.exists(path):
        return {}
    from llmkit.bounded import load_json_line, read_bounded

    lines = read_bounded(path, "LLMKIT_MAX_JSON_BYTES").decode("utf-8", "replace").splitlines()
    try:
        head = load_json_line(lines[0], f"'{path}'") if lines else {}
        if head.get("format") != FORMAT or head.get("version") != VERSION:
            raise BadFileFormat(f"'{path}' is not a version-{VERSION} sweep state ({FORMAT}). Give another output "
                                "folder, or delete the file to start over.")
        points = [SweepPoint.from_dict(load_json_line(x, f"'{path}'")) for x in lines[1:] if x.strip()]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BadFileFormat(f"'{path}' is damaged (not the JSON lines of a sweep state). Delete it to start over.") \
            from None
    differ = [k for k in settings if head.get("settings", {}).get(k) != settings[k]]
    if differ:
        raise BadInput(f"'{os.path.dirname(path) or '.'}' holds a sweep with other settings ({', '.join(differ)} "
                       f"differ). Give another output folder, or delete {path} to start over.")
    return {p.name: p for p in points}


def _write_state(path: str, settings: dict, done: dict[str, SweepPoint]) -> None:
    from llmkit.io import atomic_write_text

    head = {"format": FORMAT, "version": VERSION, "settings": settings}
    atomic_write_text(path, "".join(json.dumps(x, separators=(",", ":")) + "\n"
                                    for x in [head, *(p.to_dict() for p in done.values())]))


def _stage(progress: Progress | None):
    """stage(name) -> a (done, total) callback reporting as `name`, or None."""
    def stage(name: str):
        return None if progress is None else (lambda done, total: progress(name, done, total, ""))

    return stage


def front_chart(points: list[SweepPoint]):
    """The chart of `quant sweep --plot`: mean KL divergence against file size, llama.cpp's types and
    llmkit's budgets as separate series, each point named."""
    from llmkit.plot import Panel, Series

    big = max(p.bytes for p in points) >= 1 << 30
    unit, scale = ("GiB", 1 << 30) if big else ("MiB", 1 << 20)
    series = []
    for kind, label in KINDS.items():
        pts = sorted((p for p in points if p.kind == kind), key=lambda p: p.bytes)
        if pts:
            series.append(Series(label, [p.bytes / scale for p in pts], [p.kld["mean"] for p in pts],
                                 notes=[p.name.removeprefix("size-") for p in pts]))
    klds = [p.kld["mean"] for p in points]
    ylog = min(klds) > 0 and max(klds) > 10 * min(klds)
    return [Panel("size against KL divergence from the base", f"file size ({unit})", "mean KLD", series, ylog=ylog)]
