"""The workers that convert tensors: a thread pool, a process pool for the searched formats, the
input buffers they reuse, one job's quantize-and-validate, and an allocator setting they need."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from llmkit.errors import BadFileFormat, BadInput
from llmkit.gguf.reader import TensorInfo
from llmkit.gguf.tensors import read_tensor, row_slab
from llmkit.quant.formats import get_format, jit, native, to_f32

_MALLOC_TUNED = False


def tune_malloc() -> None:
    """Keep glibc from returning every numpy temporary to the kernel. A job's temporaries are a few
    hundred kB, above glibc's default mmap threshold (128 kB), so each one would be a fresh mmap whose
    pages the kernel zeroes on first touch, then unmapped; the 32-block formats spent much of their
    time in those page faults (docs/design/quant-kernels.md). Allocations up to the threshold set
    below come from the heap and are reused. Process-wide and only a performance setting; skipped
    where there is no glibc."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 4 << 20)  # M_MMAP_THRESHOLD: job temporaries from the heap, tensor buffers mmapped
        libc.mallopt(-1, 32 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass




class Buffers:
    """Reuses the input buffers of written tensors for the next reads: a fresh buffer costs a page fault
    per page (the kernel zeroes every page) before the read can fill it. Every buffer is allocated at
    the largest tensor's size, so any spare fits any tensor; only the pages a read fills become
    resident, so memory stays at what is in flight plus at most `KEEP` spares. Tensors under 1 MB get
    plain new arrays."""

    MIN = 1 << 20
    KEEP = 2

    def __init__(self, largest: int):
        self.largest = largest
        self.spares: list[np.ndarray] = []

    def get(self, n: int) -> np.ndarray | None:
        if n < self.MIN:
            return None
        b = self.spares.pop() if self.spares else np.empty(max(n, self.largest), np.uint8)
        return b[:n]

    def put(self, view: np.ndarray | None) -> None:
        if (view is not None and isinstance(view.base, np.ndarray) and len(view) >= self.MIN
                and len(self.spares) < self.KEEP and len(view.base) >= self.largest):
            self.spares.append(view.base)


class Workers:
    """Threads for small tensors; for large ones with several workers, processes (the scale searches
    of K-quants, IQ4 and imatrix runs are many small numpy calls that hold the GIL, so threads scale
    poorly)."""

    PROCESS_MIN_BYTES = 2 << 20  # smaller tensors in threads of this process would compete with the workers

    def __init__(self, n: int):
        self.n = max(1, n)
        self.threads = ThreadPoolExecutor(max_workers=self.n)
        self._procs = None

    def processes(self, nbytes: int, searched: bool):
        """A process pool for this tensor, or None: only searched formats gain (the plain 32-block
        formats are mostly large numpy passes that release the GIL, and would lose to the pickling)."""
        import multiprocessing

        if (self.n < 2 or nbytes < self.PROCESS_MIN_BYTES or not searched
                or "fork" not in multiprocessing.get_all_start_methods()):
            return None
        return self.fork_now()

    def fork_now(self):
        """Start the worker processes (forked from this process, all at once) unless they run already;
        the pool, or None where processes cannot help (one worker, no fork)."""
        import multiprocessing

        if self.n < 2 or "fork" not in multiprocessing.get_all_start_methods():
            return None
        if self._procs is None:
            from concurrent.futures import ProcessPoolExecutor

            self._procs = ProcessPoolExecutor(max_workers=self.n, mp_context=multiprocessing.get_context("fork"))
            self._procs.submit(int).result()  # a fork context launches every worker at the first submit
        return self._procs

    def close(self) -> None:
        self.threads.shutdown()
        if self._procs is not None:
            self._procs.shutdown()


def rows_job(path: str, data_offset: int, rows: TensorInfo, fmt_name: str, w, kernels: jit.Kernels) -> bytes:
    """Worker process: read a slab of rows of a tensor (gguf.tensors.row_slab) from the file and quantize them."""
    with open(path, "rb") as f:
        raw = read_tensor(f, rows, data_offset)
    return quantize_checked(get_format(fmt_name), to_f32(raw, rows), w, rows.name, False, kernels).tobytes()


def read_rows_job(fd: int, data_offset: int, rows: TensorInfo, fmt, kernels: jit.Kernels) -> np.ndarray:
    """Worker thread: read a slab of F32 or F16 rows (gguf.tensors.row_slab) with pread and quantize it
    with the linked library's kernel, so that reading runs on every worker instead of in one reader
    thread competing with them for the cores."""
    raw = np.empty(rows.nbytes, np.uint8)
    if os.preadv(fd, [raw], data_offset + rows.offset) != rows.nbytes:
        raise BadFileFormat(f"tensor '{rows.name}' is cut short: the file ends inside its data.")
    finite = False
    if rows.type_name == "F16":
        x, bad = native.f16_rows(raw, rows.shape[0], native.f16_table())
        if bad:
            check_finite(x, rows.name)
        finite = True
    else:
        x = raw.view(np.float32).reshape(-1, rows.shape[0])
    return quantize_checked(fmt, x, None, rows.name, finite, kernels)


def reads_own_rows(fmt, t: TensorInfo, weighted: bool, measure: bool) -> bool:
    """Does this tensor go through read_rows_job: F32 or F16 into a format of the linked library,
    without an imatrix or an error report, where the OS has pread?"""
    return (t.type_name in ("F32", "F16") and not weighted and not measure and hasattr(os, "preadv")
            and bool(fmt.jit_kernel) and native.has(fmt.jit_kernel) and native.has("f16_to_f32"))


def slab_job(fmt, raw: np.ndarray, t: TensorInfo, r0: int, r1: int, w, kernels: jit.Kernels) -> np.ndarray:
    """Worker thread: rows [r0, r1) of a tensor's raw bytes (not F32) converted to float32 here, then
    quantized. F16 goes through the compiled conversion when this run uses the kernels: it counts the
    Inf/NaN halves on the way, so the input needs no second pass for the check."""
    row = t.nbytes // t.n_rows
    part = raw[r0 * row:r1 * row]
    if t.type_name == "F16" and (native.has("f16_to_f32") or kernels.on()):
        if native.has("f16_to_f32"):
            x, bad = native.f16_rows(part, t.shape[0], native.f16_table())
        else:
            kernels.note_if_cold("_kernels", "f16_to_f32")
            x, bad = jit.f16_rows(part, t.shape[0])
        if bad:
            check_finite(x, t.name)
        return quantize_checked(fmt, x, w, t.name, True, kernels)
    return quantize_checked(fmt, to_f32(part, row_slab(t, r0, r1 - r0)), w, t.name, False, kernels)


def quantize_checked(fmt, x: np.ndarray, w, name: str, finite: bool = False,
                     kernels: jit.Kernels = jit.DEFAULT) -> np.ndarray:
    """One job: quantize, then validate like ggml_validate_row_data. For the plain 32-block and
    float formats a NaN/Inf weight always reaches a block scale (it is the block's max), so the check
    of the output catches it; searched formats (K-quants, IQ4, any imatrix) check the input first
    (unless `finite`: the caller has checked it); so do compiled kernels, where a NaN need not reach a scale."""
    if not finite and (not fmt.nan_reaches_scale or w is not None or fmt.compiled(kernels)):
        with np.errstate(over="ignore", invalid="ignore"):
            total = np.add.reduce(x, axis=None)  # NaN/Inf propagate; a finite overflow is re-checked exactly
        if not np.isfinite(total):
            check_finite(x, name)
    with np.errstate(all="ignore"):  # overflowing scales are caught by fmt.check with a clear message
        out = np.ascontiguousarray(fmt.quantize(x, w, kernels))
    try:
        fmt.check(out, name)
    except BadInput:
        check_finite(x, name)  # the clearer message when the cause is a NaN/Inf weight
        raise
    return out


def check_finite(x: np.ndarray, name: str) -> None:
    if not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).sum())
        raise BadInput(f"tensor '{name}' holds {bad} NaN/Inf value(s); llama.cpp refuses such weights too. "
                       "Fix the model before quantizing.")
