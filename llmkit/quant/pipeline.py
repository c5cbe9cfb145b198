"""One quantization run, every stage in order: GPTQ's Hessians (collected from calibration text when
no saved file is given) -> per-tensor types under a budget -> GPTQ rounding -> the output file.
Without a budget or GPTQ it is quantize_file, the same bytes as llama.cpp's quantizer."""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from typing import Callable

from llmkit.errors import BadInput
from llmkit.quant.budget.allocate import RECIPE_KEY, Allocation, allocate, file_type_for, recipe
from llmkit.quant.calibration.hessians import check_gptq_fits, collect_hessians
from llmkit.quant.formats.jit import Kernels
from llmkit.quant.plan import rules
from llmkit.quant.plan.rules import Overrides
from llmkit.quant.plan.tensors import plan_types
from llmkit.quant.rounding.gptq import SHRINK, gptq_replacements
from llmkit.quant.write.quantize import QuantReport, quantize_file

METHODS = ("rtn", "gptq")
Progress = Callable[[str, int, int, str], None]  # (stage, done, total, note)


@dataclass
class QuantRun:
    """What a run did: the file's report, the budget's allocation (if any), what GPTQ changed."""

    report: QuantReport
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


def quantize(src: str, dst: str, ftype: str | None = None, *, pure: bool = False, imatrix: dict | None = None,
             allow_requantize: bool = False, threads: int | None = None, measure: bool = False,
             overrides: Overrides | None = None, target_bpw: float | None = None, target_size: int | None = None,
             calib_text: str | None = None, n_ctx: int | None = None, chunks: int | None = None, method: str = "rtn",
             hessian_path: str | None = None, damp: float = 0.01, refit: bool = True,
             shrink: float | None = None, progress: Progress | None = None,
             notice: Callable[[str], None] | None = None) -> QuantRun:
    """Quantize `src` into `dst` to the file type `ftype`, or under a budget (`target_bpw` bits per
    weight or `target_size` bytes for the whole file; the budget chooses every tensor's type), with
    llama.cpp's rounding (`method="rtn"`) or GPTQ's. GPTQ reads its Hessians from `hessian_path`, or
    collects them from `calib_text` (saved at `hessian_path` when given, else in a temporary folder
    that is removed); a budget probes each tensor kind's effect on the output, on `calib_text` or on
    text the model writes itself. `chunks` x `n_ctx` tokens: 16 x 256 for the Hessians, 4 x 32 for the
    probes unless given. `shrink`: GPTQ's shrinkage of H toward its diagonal (default
    rounding.gptq.SHRINK). `notice` hears, in one line, of a compiled kernel's first compilation."""
    budgeted = target_bpw is not None or target_size is not None
    if budgeted == (ftype is not None):
        raise BadInput("give either a file type or a size budget (target_bpw or target_size): a budget chooses "
                       "the types itself.")
    if method not in METHODS:
        raise BadInput(f"unknown rounding method {method!r}; use one of {', '.join(METHODS)}.")
    if method == "gptq" and calib_text is None and not (hessian_path and os.path.exists(hessian_path)):
        raise BadInput("GPTQ needs calibration text or a saved Hessian file.")

    def stage(name: str, note: str | None = None):
        if progress is None:
            return None
        return lambda done, total, what="": progress(name, done, total, what if note is None else note)

    allocation, raised, n_gptq, skipped = None, {}, 0, {}
    assign = extra = replace = None
    group_bytes = workers = None
    if method == "gptq":  # before anything runs: a run that cannot fit says so in one line
        if not budgeted:
            _check_gptq_types(plan_types(src, ftype, pure, imatrix is not None, overrides, None), ftype)
        group_bytes, workers = check_gptq_fits(src, threads or os.cpu_count() or 1)
    with contextlib.ExitStack() as cleanup:
        hpath = hessian_path
        if method == "gptq" and not (hpath and os.path.exists(hpath)):
            if not hpath:  # nowhere to keep them: a temporary folder, removed at the end of the run
                hpath = os.path.join(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="llmkit-gptq-")),
                                     "hessians.gguf")
            collect_hessians(src, calib_text, hpath, n_ctx or 256, chunks or 16, threads,
                             progress=stage("hessians", "calibration"), group_bytes=group_bytes)
        if budgeted:
            allocation = allocate(src, target_bpw=target_bpw, target_size=target_size, imatrix=imatrix,
                                  calib_text=calib_text, threads=threads, progress=stage("measuring"), n_ctx=n_ctx,
                                  chunks=chunks, hessian_path=hpath, kernels=Kernels(notice=notice))
            assign, ftype = allocation.assign, file_type_for(allocation)
            extra = {RECIPE_KEY: recipe(allocation, target_bpw, target_size, imatrix is not None, method)}
            allow_requantize = True  # a budget may keep already-quantized tensors at (or near) their type
        if method == "gptq":
            types = plan_types(src, ftype, pure, imatrix is not None, overrides, assign)
            replace, raised = gptq_replacements(src, types, hpath, imatrix, damp, refit, threads,
                                                progress=stage("gptq"), workers=workers,
                                                shrink=SHRINK if shrink is None else shrink)
            n_gptq = len(replace)
            skipped = _not_gptq(src, types)
            assign = types
            extra = {**(extra or {}), "llmkit.quantize.method": "gptq"}
        report = quantize_file(src, dst, ftype, pure=pure, imatrix=imatrix, allow_requantize=allow_requantize,
                               threads=threads, measure=measure, progress=stage("quantizing"), overrides=overrides,
                               assign=assign, extra_meta=extra, replace=replace, notice=notice)
    return QuantRun(report, allocation, method, n_gptq, raised, skipped)


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
        raise BadInput(f"GPTQ writes {', '.join(SUPPORTED)}; file type {ftype} uses {', '.join(used) or 'none of them'} "
                       "(the i-quants' grid searches and the ternary/FP4 types take no per-weight error feedback). "
                       "Use --method rtn (with --imatrix) for it.")

