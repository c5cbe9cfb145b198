"""Quantize a GGUF file the way llama.cpp's llama_model_quantize does, byte for byte.

Output layout (llama.cpp's): the input's metadata entries copied verbatim in order, minus
split keys and `general.quantization_version` / `general.file_type`, which are appended (u32);
tensors sorted by (layer, name); each tensor's data padded to the input's `general.alignment`
(32 by default); GGUF version 3. (llama.cpp pads to 32 whatever the alignment key says, and its
own loader then rejects the file; llmkit keeps the layout valid instead.)
Tensors are processed one at a time (rows in parallel chunks), so memory stays near one tensor;
the file is written to a temp name and renamed when complete.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from llmkit.errors import BadFileFormat, BadInput
from llmkit.gguf.reader import GGUFFile, read_gguf
from llmkit.gguf.tensors import read_tensor, row_slab
from llmkit.gguf.types import ALIGNMENT, tensor_bytes
from llmkit.gguf.writer import derived_header
from llmkit.quant.formats import get_format, jit, to_f32
from llmkit.machine import available_memory
from llmkit.quant.memory import gib
from llmkit.quant.options import QuantOptions
from llmkit.quant.plan import rules
from llmkit.quant.plan.tensors import check_imatrix_covers, plan_tensors
from llmkit.quant.quality.stats import error_stats
from llmkit.quant.write.jobs import (
    Buffers, Workers, check_finite, quantize_checked, read_rows_job, reads_own_rows, rows_job, slab_job, tune_malloc)

READ_AHEAD = 32 << 20  # unwritten input bytes held in memory before the oldest tensor is awaited
QNT_VERSION = 2
DROP = ("general.quantization_version", "general.file_type", "split.no", "split.count", "split.tensors.count")


@dataclass
class TensorReport:
    name: str
    shape: list[int]
    type_in: str
    type_out: str
    bytes_in: int
    bytes_out: int
    bpw: float
    rmse: float | None = None
    max_abs_err: float | None = None
    cosine: float | None = None
    imatrix: bool = False


@dataclass
class QuantReport:
    input: str
    output: str
    ftype: str
    bytes_in: int = 0
    bytes_out: int = 0
    n_weights: int = 0
    seconds: float = 0.0
    fallbacks: int = 0
    tensors: list[TensorReport] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.bytes_in / max(self.bytes_out, 1)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ratio"] = round(self.ratio, 4)
        d["bpw"] = round(8 * sum(t.bytes_out for t in self.tensors) / max(self.n_weights, 1), 4)
        return d


def quantize_file(src: str, dst: str, ftype: str | None = None, *, opts: QuantOptions | None = None,
                  assign: dict[str, str] | None = None, extra_meta: dict[str, str] | None = None,
                  replace: dict | None = None, **options) -> QuantReport:
    """Quantize `src` into `dst` (written atomically) to the file type `ftype`, as `opts` (or the
    QuantOptions fields given as keywords) says; the write layer reads ftype, pure, imatrix,
    allow_requantize, threads, measure, overrides, progress (done, total, tensor) and notice. Returns
    per-tensor sizes (and errors when measuring). `assign` fixes the type of named tensors (the
    size-budget allocator's choice); `extra_meta` adds string metadata; `replace` maps tensor names to
    already-quantized bytes (GPTQ) written as they are."""
    t0 = time.perf_counter()
    opts = opts if opts is not None else QuantOptions(ftype=ftype, **options)
    ftype, imatrix = rules.resolve_ftype(opts.ftype or ""), opts.imatrix
    if os.path.exists(dst) and os.path.exists(src) and os.path.samefile(src, dst):
        raise BadInput("the output path is the input file; write the quantized model to a new path.")
    g = read_gguf(src)
    if not g.tensors:
        raise BadFileFormat(f"'{src}' has no tensors to quantize.")
    plan, chooser = plan_tensors(g, ftype, opts.pure, imatrix is not None, opts.overrides, assign)
    _check_plan(plan, opts)
    check_memory(src, plan, opts)
    report = QuantReport(src, dst, ftype, fallbacks=chooser.n_fallback)
    align = int(g.metadata.get("general.alignment", ALIGNMENT))  # the copied key must describe the output too
    header = output_header(g, [(t.name, t.shape, new) for t, new in plan], rules.FTYPES[ftype][0], align, extra_meta,
                           imatrix)
    tune_malloc()
    pool = Workers(opts.threads or os.cpu_count() or 1)
    kernels = jit.for_run([(int(np.prod(t.shape)), get_format(new)) for t, new in plan  # small jobs skip numba's
                           if new != t.type_name and not (imatrix is not None and t.name in imatrix  # start-up
                                                          and not get_format(new).weighted_kernel)], opts.notice)
    # fork the worker processes now, before any thread runs: a child forked while a pool thread holds
    # an import lock (numba's first kernel call imports numpy.ma) waits for it forever
    if any(new != t.type_name and t.nbytes >= Workers.PROCESS_MIN_BYTES
           and _in_processes(get_format(new), t, imatrix, kernels) for t, new in plan):
        pool.fork_now()
    try:
        _write(_Job(src, dst, opts, plan, g.data_offset, align, pool, kernels, report, replace or {}), header)
    finally:
        pool.close()
    report.seconds = time.perf_counter() - t0
    return report


def _check_plan(plan, opts: QuantOptions) -> None:
    """The refusals llama.cpp makes before writing: an imatrix of another model or missing a tensor
    it is needed for, one of the wrong length, a quantized input without allow_requantize."""
    imatrix = opts.imatrix
    if imatrix is not None and not any(t.name in imatrix for t, _ in plan):
        raise BadInput("the imatrix names none of this model's tensors (it belongs to another model). Collect one "
                       "for this model.")
    if imatrix is not None:
        check_imatrix_covers(imatrix, [t.name for t, new in plan if new != t.type_name and get_format(new).uses_imatrix])
    for t, new in plan:
        name = t.name
        if new != t.type_name and t.type_name not in ("F32", "F16", "BF16") and not opts.allow_requantize:
            raise BadInput(f"tensor '{name}' is already quantized ({t.type_name}); requantizing loses quality. "
                           "Start from an F32/F16/BF16 model, or allow requantizing.")
        if new != t.type_name and imatrix is not None and name in imatrix:
            want = t.shape[0] * (t.shape[2] if len(t.shape) > 2 else 1)
            if len(imatrix[name]) != want and name not in ("token_embd.weight", "per_layer_token_embd.weight"):
                raise BadInput(f"the imatrix entry for '{name}' has {len(imatrix[name])} values, the tensor needs {want}.")


BASE_BYTES = 256 << 20  # Python, numpy and the file's header and plan
JOB_BYTES = 32 << 20  # one worker's job: its rows converted to float32 and the quantizer's temporaries


def memory_needed(plan, opts: QuantOptions) -> tuple[int, str]:
    """(bytes the write needs at its peak, the largest tensor's name): the largest input held whole with
    the spare buffer kept for the next read, its output, the inputs read ahead, each worker's job and,
    when measuring, float32 copies of the largest tensor and of its dequantized output."""
    t_big = max((t for t, _ in plan), key=lambda t: t.nbytes)
    out_big = max(tensor_bytes(new, t.shape) for t, new in plan)
    need = BASE_BYTES + 2 * t_big.nbytes + out_big + READ_AHEAD + (opts.threads or os.cpu_count() or 1) * JOB_BYTES
    if opts.measure:
        need += 8 * int(np.prod(t_big.shape, dtype=np.int64))
    return need, t_big.name


def check_memory(src: str, plan, opts: QuantOptions) -> None:
    """Refuse, before anything is written, a file whose tensors need more memory than is available."""
    need, big = memory_needed(plan, opts)
    avail = available_memory()
    if avail is not None and need > avail:
        raise BadInput(f"quantizing '{src}' needs about {gib(need)} of memory (its largest tensor, '{big}', is held "
                       f"whole), and {gib(avail)} is available; free memory or use a machine with more.")


@dataclass
class _Job:
    """One file being written: its paths and options, the plan, the input's layout, the workers, the
    run's use of the compiled kernels, the report being filled and GPTQ's ready-made tensors."""

    src: str
    dst: str
    opts: QuantOptions
    plan: list
    data_offset: int
    align: int
    pool: Workers
    kernels: jit.Kernels
    report: QuantReport
    replace: dict


def _write(job: _Job, header: bytes) -> None:
    from llmkit.io import atomic_file

    report, progress = job.report, job.opts.progress
    with open(job.src, "rb") as fin, atomic_file(job.dst) as fout:
        fout.write(header)

        buffers = Buffers(max(t.nbytes for t, _ in job.plan))

        def emit(t, queued) -> None:
            parts, tr = queued.finish()
            size = 0
            for part in parts:  # written piece by piece: no joined copy of the tensor
                fout.write(part)
                size += memoryview(part).nbytes
            fout.write(b"\0" * (-size % job.align))
            buffers.put(queued.buffer)  # every job of this tensor is done: its input buffer is free again
            report.tensors.append(tr)
            report.bytes_in += t.nbytes
            report.bytes_out += size
            report.n_weights += int(np.prod(t.shape, dtype=np.int64))

        # read ahead: tensor i is read and its jobs queued while earlier tensors are still being
        # quantized; the oldest is written once the unwritten inputs exceed READ_AHEAD bytes (or as
        # soon as it is done), so small tensors (norms) never stall the pipeline
        pending: deque = deque()
        inflight = 0
        for i, (t, new) in enumerate(job.plan):
            if progress:
                progress(i, len(job.plan), t.name)
            if t.name in job.replace:
                pending.append((t, _replaced(fin, job, t, new, job.replace[t.name], buffers)))
            else:
                pending.append((t, _convert(fin, job, t, new, buffers)))
            inflight += t.nbytes
            while len(pending) > 1 and (inflight > READ_AHEAD or pending[0][1].done()):
                t0, queued = pending.popleft()
                inflight -= t0.nbytes
                emit(t0, queued)
        while pending:
            emit(*pending.popleft())


def _convert(fin, job: _Job, t, new: str, buffers: Buffers):
    """Read one tensor (into a pooled buffer) and queue its quantization along the path chosen for it."""
    n = int(np.prod(t.shape, dtype=np.int64))
    tr = TensorReport(t.name, list(t.shape), t.type_name, new, t.nbytes, tensor_bytes(new, t.shape),
                      8 * tensor_bytes(new, t.shape) / n)
    fmt = get_format(new)
    path, procs = _path(job, t, new, fmt)
    if path == "pread":
        rows = max(1, (1 << 19) // t.shape[0])  # 2 MB of F32 per job: heap memory, reused job after job
        jobs = [job.pool.threads.submit(read_rows_job, fin.fileno(), job.data_offset,
                                        row_slab(t, r0, min(rows, t.n_rows - r0)), fmt, job.kernels)
                for r0 in range(0, t.n_rows, rows)]
        return _Queued(jobs, lambda: ([j.result() for j in jobs], tr), None)
    if path == "processes":
        return _row_jobs(fin, job, t, fmt, tr, None, None, procs)  # the workers read their own rows
    raw = read_tensor(fin, t, job.data_offset, buffers.get(t.nbytes))
    if path == "copy":
        if t.type_name in ("F32", "F16", "BF16"):
            check_finite(to_f32(raw, t), t.name)
        if job.opts.measure:
            tr.rmse, tr.max_abs_err, tr.cosine = 0.0, 0.0, 1.0
        return _Queued([], lambda: ([raw], tr), raw)
    # F32 rows are a view of the buffer; other inputs (F16, BF16, a quantized tensor) are converted
    # job by job in the worker threads, not here: the conversion runs in parallel with the rounding
    # and no float32 copy of the whole tensor is made (a token embedding's can be a gigabyte)
    x = to_f32(raw, t) if t.type == 0 or job.opts.measure else None
    return _row_jobs(fin, job, t, fmt, tr, raw, x, None)


def _path(job: _Job, t, new: str, fmt) -> tuple[str, object]:
    """How tensor `t` becomes type `new` (and the process pool for "processes"):
    - "pread": F32/F16 rows that each worker thread reads itself and quantizes with the linked library;
    - "copy": the type stays, its bytes are written as read;
    - "processes": worker processes read and quantize their own rows (a numpy search holding the GIL);
    - "threads": read here, quantized by worker threads from float32 rows (F32, or to measure the
      error) or from raw slabs that each job converts."""
    imatrix, measure = job.opts.imatrix, job.opts.measure
    weighted = imatrix is not None and fmt.uses_imatrix and t.name in imatrix
    if new != t.type_name and reads_own_rows(fmt, t, weighted, measure):
        return "pread", None
    procs = job.pool.processes(t.nbytes, _in_processes(fmt, t, imatrix, job.kernels))
    if new == t.type_name:
        return "copy", None
    if measure or procs is None:
        return "threads", None
    return "processes", procs


def _row_weights(imatrix, t):
    """The imatrix entry of `t` (column weights, one slice per expert), or None."""
    qw = imatrix.get(t.name) if imatrix is not None else None
    if qw is not None and len(qw) != t.shape[0] * (t.shape[2] if len(t.shape) > 2 else 1):
        qw = None  # llama.cpp ignores a token-embedding entry of the wrong size (others were refused above)
    return qw


def _row_jobs(fin, job: _Job, t, fmt, tr: TensorReport, raw, x, procs):
    """Queue `t`'s quantization in jobs of whole rows within one matrix (an expert's imatrix slice must
    not straddle jobs): in `procs` reading their own rows when given, else in threads from the float32
    rows `x`, or from slabs of `raw` converted job by job."""
    kernels, measure = job.kernels, job.opts.measure
    ne0, n = t.shape[0], int(np.prod(t.shape, dtype=np.int64))
    rows_per_matrix = t.shape[1] if len(t.shape) > 1 else 1
    qw = _row_weights(job.opts.imatrix, t)
    tr.imatrix = qw is not None
    # ~128k weights per job for numpy, whose temporaries then stay in cache; a compiled kernel has no
    # temporaries but the input, so larger jobs only save per-job overhead
    size = 1 << 18 if fmt.compiled(kernels, qw is not None and fmt.uses_imatrix) else 1 << 17
    rows_per_chunk = max(1, min(rows_per_matrix, size // ne0))
    n_rows = n // ne0
    jobs = []
    for m0 in range(0, n_rows, rows_per_matrix):
        w = None
        if qw is not None and fmt.uses_imatrix:
            e = m0 // rows_per_matrix
            w = np.asarray(qw[e * ne0:(e + 1) * ne0], dtype=np.float32)
        for r0 in range(m0, min(m0 + rows_per_matrix, n_rows), rows_per_chunk):
            r1 = min(r0 + rows_per_chunk, m0 + rows_per_matrix, n_rows)
            if raw is None:
                jobs.append(procs.submit(rows_job, fin.name, job.data_offset, row_slab(t, r0, r1 - r0), fmt.name, w,
                                         kernels.quiet()))
            elif x is None:
                jobs.append(job.pool.threads.submit(slab_job, fmt, raw, t, r0, r1, w, kernels))
            else:
                jobs.append(job.pool.threads.submit(quantize_checked, fmt, x[r0:r1], w, t.name, False, kernels))

    def finish():
        parts = [j.result() for j in jobs]
        if measure:
            out = np.concatenate([np.frombuffer(memoryview(p).cast("B"), np.uint8) for p in parts])
            tr.rmse, tr.max_abs_err, tr.cosine = error_stats(x, fmt.dequantize(out, n))
        return parts, tr

    return _Queued(jobs, finish, raw)


def _in_processes(fmt, t, imatrix, kernels: jit.Kernels) -> bool:
    """Is this tensor's path one for worker processes: a search (K-quants, IQ4, any imatrix) that
    runs in numpy? A compiled kernel releases the GIL, so threads scale without the pickling."""
    weighted = imatrix is not None and fmt.uses_imatrix and t.name in imatrix
    return (not fmt.nan_reaches_scale or weighted) and not fmt.compiled(kernels, weighted)


class _Queued:
    """A tensor whose quantization jobs are queued: done() without blocking, finish() -> (output
    pieces, report row); `buffer` holds its input until it is written."""

    def __init__(self, jobs: list, finish: Callable, buffer):
        self.jobs, self.finish, self.buffer = jobs, finish, buffer

    def done(self) -> bool:
        return all(j.done() for j in self.jobs)


def _replaced(fin, job: _Job, t, new: str, data: np.ndarray, buffers):
    """A tensor whose quantized bytes were made elsewhere (GPTQ): checked and written as they are."""
    n = int(np.prod(t.shape, dtype=np.int64))
    data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if data.nbytes != tensor_bytes(new, t.shape):
        raise BadInput(f"tensor '{t.name}': {data.nbytes} bytes of {new} given, {tensor_bytes(new, t.shape)} needed.")
    get_format(new).check(data, t.name)
    tr = TensorReport(t.name, list(t.shape), t.type_name, new, t.nbytes, data.nbytes, 8 * data.nbytes / n)
    if job.opts.measure:
        x = to_f32(read_tensor(fin, t, job.data_offset), t)
        tr.rmse, tr.max_abs_err, tr.cosine = error_stats(x, get_format(new).dequantize(data, n))
    return _Queued([], lambda: ([data], tr), None)


def output_header(g: GGUFFile, tensors: list[tuple[str, tuple, str]], ftype_id: int, align: int,
                  extra_meta: dict[str, str] | None = None, imatrix=None) -> bytes:
    """llama.cpp's header for the output: the input's metadata verbatim (minus split keys and the two
    replaced below), general.quantization_version and general.file_type, the imatrix's keys when
    it came from a file (`imatrix_keys`), `extra_meta` strings."""
    put = [("general.quantization_version", "u32", QNT_VERSION), ("general.file_type", "u32", ftype_id)]
    return derived_header(g, tensors, align, DROP, put + imatrix_keys(imatrix), extra_meta)


def imatrix_keys(imatrix) -> list[tuple[str, str, object]]:
    """The metadata llama-quantize (the tool, not the library call) writes for an imatrix file
    (tools/quantize/quantize.cpp): its path as given and its first dataset, each cut to 127 bytes
    (a 128-byte kv-override string), the number of entries and, when known, of chunks (u32)."""
    source = getattr(imatrix, "source", None)
    if source is None:
        return []
    cut = lambda s: s.encode("utf-8", "surrogateescape")[:127].split(b"\0")[0]  # noqa: E731  (strncpy)
    keys = [("quantize.imatrix.file", "str", cut(source))]
    if imatrix.datasets:
        keys.append(("quantize.imatrix.dataset", "str", cut(imatrix.datasets[0])))
    keys.append(("quantize.imatrix.entries_count", "u32", len(imatrix)))
    if imatrix.chunk_count > 0:
        keys.append(("quantize.imatrix.chunks_count", "u32", imatrix.chunk_count))
    return keys
