"""One quantization run, every stage in order: GPTQ's Hessians (collected from calibration text when
no saved file is given) -> per-tensor types under a budget -> GPTQ rounding -> the output file.
Without a budget or GPTQ it is quantize_file, the same bytes as llama.cpp's quantizer."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field, replace

from typing import TYPE_CHECKING

from llmkit.errors import OptionError
from llmkit.io import scratch_dir
from llmkit.quant.formats.jit import Kernels
from llmkit.quant.options import METHODS, Progress, QuantOptions
from llmkit.quant.plan import rules
from llmkit.quant.plan.tensors import plan_types
from llmkit.quant.write.quantize import QuantReport, quantize_file

if TYPE_CHECKING:  # the budget and GPTQ stages are imported by the runs that use them
    from llmkit.quant.budget.allocate import Allocation

__all__ = ["METHODS", "QuantOptions", "QuantRun", "quantize"]


@dataclass
class QuantRun:
    """What a run did: the file's report, the budget's allocation (if any), what GPTQ changed."""

    report: QuantReport | None
    allocation: Allocation | None = None
    method: str = "rtn"
    gptq_matrices: int = 0
    damp_raised: dict = field(default_factory=dict)  # matrix -> the dampening GPTQ had to use
    gptq_skipped: dict = field(default_factory=dict)  # type -> matrices in types GPTQ does not write (rounded)

    def to_dict(self) -> dict:
        d = self.report.to_dict()
        if self.allocation is not None:
            d["allocation"] = self.allocation.to_dict()
        if self.method == "gptq":
            d["gptq"] = {"matrices": self.gptq_matrices, "damp_raised": self.damp_raised, "not_gptq": self.gptq_skipped}
        return d


def quantize(src: str, dst: str, opts: QuantOptions) -> QuantRun:
    """Quantize `src` into `dst` as `opts` says (checked first): to a file type, or under a size budget
    that chooses every tensor's type (probing each tensor kind's effect on the output, on the
    calibration text or on text the model writes itself), with llama.cpp's rounding or GPTQ's. GPTQ's
    Hessians are read from opts.hessian_path, or collected from the calibration text (saved at
    hessian_path when given, else in a temporary folder that is removed)."""
    opts.check()
    if opts.method == "rtn" and not opts.budgeted:  # llama.cpp's quantizer: nothing else to import or run
        return QuantRun(quantize_file(src, dst, opts=replace(opts, progress=_stages(opts.progress)("quantizing"))))
    stage = _stages(opts.progress)
    fits = _gptq_fits(src, opts)
    run = QuantRun(None, method=opts.method)
    with contextlib.ExitStack() as cleanup:
        hpath = _hessian_file(src, opts, cleanup, stage("hessians", "calibration"), fits[0])
        ftype, assign, extra, write = opts.ftype, None, {}, opts
        if opts.budgeted:
            ftype, assign, extra = _allocate(src, opts, run, hpath, stage("measuring"))
            write = replace(opts, allow_requantize=True)  # a budget may keep already-quantized tensors at (or near) their type
        replacements = None
        if opts.method == "gptq":
            assign = plan_types(src, ftype, opts.pure, opts.imatrix is not None, opts.overrides, assign)
            replacements = _gptq(src, opts, run, assign, hpath, cleanup, stage, fits)
            extra["llmkit.quantize.method"] = "gptq"
        write = replace(write, ftype=ftype, target_bpw=None, target_size=None, progress=stage("quantizing"))
        run.report = quantize_file(src, dst, opts=write, assign=assign, extra_meta=extra or None,
                                   replace=replacements)
    return run


def _streamed(opts: QuantOptions) -> bool:
    """Nothing to save and no budget to measure: each group of layers is collected, rounded and dropped
    in turn, so a 7B model's Hessians (~33 GB) never sit on disk together."""
    return opts.method == "gptq" and not opts.saved_hessians and not opts.hessian_path and not opts.budgeted


def _gptq_fits(src: str, opts: QuantOptions) -> tuple[int | None, int | None]:
    """GPTQ's (bytes of Hessians per collecting pass, memory for its jobs), checked before anything runs
    so that a run that cannot fit says so in one line; (None, None) without GPTQ."""
    if opts.method != "gptq":
        return None, None
    from llmkit.quant.calibration.hessians import check_gptq_fits

    if not opts.budgeted:
        _check_gptq_types(plan_types(src, opts.ftype, opts.pure, opts.imatrix is not None, opts.overrides, None),
                          opts.ftype)
    return check_gptq_fits(src, opts.threads or os.cpu_count() or 1)


def _hessian_file(src: str, opts: QuantOptions, cleanup: contextlib.ExitStack, progress, group_bytes) -> str | None:
    """The Hessian file GPTQ (and a budget's measurement) reads: opts.hessian_path, collected from the
    calibration text first unless it exists, or (when there is nowhere to keep it) a file in a
    temporary folder removed by `cleanup`. Streamed Hessians have no file."""
    hpath = opts.hessian_path
    if opts.method == "gptq" and not opts.saved_hessians and not _streamed(opts):
        from llmkit.quant.calibration.hessians import collect_hessians

        if not hpath:
            hpath = os.path.join(cleanup.enter_context(scratch_dir("llmkit-gptq-")), "hessians.gguf")
        n_ctx, chunks = opts.hessian_calibration
        collect_hessians(src, opts.calib_text, hpath, n_ctx, chunks, opts.threads, progress=progress,
                         group_bytes=group_bytes)
    return hpath


def _allocate(src: str, opts: QuantOptions, run: QuantRun, hpath: str | None, progress):
    """The budget's choice of every tensor's type (kept in run.allocation): (file type, tensor -> type,
    the recipe's metadata)."""
    from llmkit.quant.budget.allocate import RECIPE_KEY, allocate, file_type_for, recipe

    run.allocation = allocate(src, target_bpw=opts.target_bpw, target_size=opts.target_size, imatrix=opts.imatrix,
                              calib_text=opts.calib_text, threads=opts.threads, progress=progress, n_ctx=opts.n_ctx,
                              chunks=opts.chunks, hessian_path=hpath, kernels=Kernels(notice=opts.notice))
    extra = {RECIPE_KEY: recipe(run.allocation, opts.target_bpw, opts.target_size, opts.imatrix is not None,
                                opts.method)}
    return file_type_for(run.allocation), run.allocation.assign, extra


def _gptq(src: str, opts: QuantOptions, run: QuantRun, types: dict, hpath: str | None,
          cleanup: contextlib.ExitStack, stage, fits: tuple) -> dict:
    """GPTQ's rounding of the plan's matrices (`types`: tensor -> type) from the Hessian file, or from
    Hessians streamed a group of layers at a time: tensor -> its bytes; run's GPTQ counts filled in."""
    from llmkit.quant.calibration.hessians import stream_hessians
    from llmkit.quant.rounding.gptq import SHRINK, gptq_by_groups, gptq_bytes, gptq_replacements

    group_bytes, jobs_memory = fits
    shrink = SHRINK if opts.shrink is None else opts.shrink
    if _streamed(opts):
        folder = cleanup.enter_context(scratch_dir("llmkit-gptq-"))
        n_ctx, chunks = opts.hessian_calibration
        files = stream_hessians(src, opts.calib_text, folder, n_ctx, chunks, opts.threads,
                                progress=stage("hessians", "calibration"), group_bytes=group_bytes,
                                keep_free=gptq_bytes(src, types))
        replacements, run.damp_raised = gptq_by_groups(
            src, types, files, os.path.join(folder, "rounded.bin"), opts.imatrix, opts.damp, opts.refit,
            opts.threads, progress=stage("gptq"), memory=jobs_memory, shrink=shrink)
    else:
        replacements, run.damp_raised = gptq_replacements(
            src, types, hpath, opts.imatrix, opts.damp, opts.refit, opts.threads, progress=stage("gptq"),
            memory=jobs_memory, shrink=shrink)
    run.gptq_matrices = len(replacements)
    run.gptq_skipped = _not_gptq(src, types)
    return replacements


def _stages(progress: Progress | None):
    """stage(name, note) -> the write layer's (done, total, what) callback reporting as `name`, or None."""

    def stage(name: str, note: str | None = None):
        if progress is None:
            return None
        return lambda done, total, what="": progress(name, done, total, what if note is None else note)

    return stage


def _not_gptq(src: str, types: dict) -> dict:
    """type -> how many quantized matrices of the plan are in a type GPTQ does not write."""
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.rounding.gptq import SUPPORTED

    cur = {t.name: t.type_name for t in read_gguf(src).tensors}
    out: dict[str, int] = {}
    for name, t in types.items():
        if t not in SUPPORTED and t != cur.get(name) and rules.BLOCK.get(t, 1) > 1:
            out[t] = out.get(t, 0) + 1
    return out


def _check_gptq_types(types: dict, ftype: str) -> None:
    """A file type none of whose matrices GPTQ can write is refused (it would be plain rounding)."""
    from llmkit.quant.rounding.gptq import SUPPORTED

    if not any(t in SUPPORTED for t in types.values()):
        used = sorted(set(types.values()) - {"F32", "F16", "BF16"})
        raise OptionError("GPTQ writes {writes}; file type {file_type} uses {uses} (the i-quants' grid searches and the "
                          "ternary/FP4 types take no per-weight error feedback). Use {method} rtn (with {imatrix}) for "
                          "it.", writes=", ".join(SUPPORTED), file_type=ftype, uses=", ".join(used) or "none of them")

