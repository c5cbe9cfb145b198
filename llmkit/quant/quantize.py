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
import struct
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from llmkit.errors import BadFileFormat, BadInput
from llmkit.gguf.reader import GGML_TYPES, read_gguf
from llmkit.quant import rules
from llmkit.quant.base import get_format

ALIGN = 32  # GGUF's default general.alignment
READ_AHEAD = 32 << 20  # unwritten input bytes held in memory before the oldest tensor is awaited
QNT_VERSION = 2
_DROP = ("general.quantization_version", "general.file_type", "split.no", "split.count", "split.tensors.count")
TYPE_ID = {v[0]: k for k, v in GGML_TYPES.items()}


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


def tensor_bytes(type_name: str, shape) -> int:
    tid = TYPE_ID[type_name]
    _, bs, ts = GGML_TYPES[tid]
    n = int(np.prod(shape, dtype=np.int64))
    return n // bs * ts


def read_tensor(f, info, data_offset: int, into: np.ndarray | None = None) -> np.ndarray:
    """A tensor's raw bytes, read with one readinto (a plain read from the page cache is ~2x faster
    here than faulting in an mmap page by page), into `into` (uint8, nbytes long) when given."""
    raw = np.empty(info.nbytes, np.uint8) if into is None else into
    f.seek(data_offset + info.offset)
    if f.readinto(memoryview(raw)) != info.nbytes:
        raise BadFileFormat(f"tensor '{info.name}' is cut short: the file ends inside its data.")
    return raw


def to_f32(raw: np.ndarray, info) -> np.ndarray:
    """Raw tensor bytes as float32 rows (n_rows, ne0), dequantizing when needed."""
    from llmkit.quant.base import by_id

    ne0 = info.shape[0]
    n = int(np.prod(info.shape, dtype=np.int64))
    if info.type == 0:
        x = raw.view("<f4")
    else:
        fmt = by_id(info.type)
        if fmt is None:
            raise BadInput(f"tensor '{info.name}' has type {info.type_name}, which llmkit cannot read.")
        x = fmt.dequantize(raw, n)
    return x.reshape(-1, ne0)


def load_f32(f, info, data_offset: int) -> np.ndarray:
    """A tensor of an open GGUF file as float32 rows."""
    return to_f32(read_tensor(f, info, data_offset), info)


def quantize_file(src: str, dst: str, ftype: str, *, pure: bool = False, imatrix: dict | None = None,
                  allow_requantize: bool = False, threads: int | None = None, measure: bool = False,
                  progress: Callable[[int, int, str], None] | None = None,
                  overrides: rules.Overrides | None = None, assign: dict[str, str] | None = None,
                  extra_meta: dict[str, str] | None = None, replace: dict | None = None) -> QuantReport:
    """Quantize `src` into `dst` (written atomically). Returns per-tensor sizes (and errors when `measure`).
    `assign` fixes the type of named tensors (the size-budget allocator's choice); `extra_meta` adds
    string metadata; `replace` maps tensor names to already-quantized bytes (GPTQ) written as they are."""
    t0 = time.perf_counter()
    ftype = rules.resolve_ftype(ftype)
    if os.path.exists(dst) and os.path.exists(src) and os.path.samefile(src, dst):
        raise BadInput("the output path is the input file; write the quantized model to a new path.")
    g = read_gguf(src)
    if not g.tensors:
        raise BadFileFormat(f"'{src}' has no tensors to quantize.")
    plan, chooser = _plan(g, ftype, pure, imatrix is not None, overrides, assign)
    if imatrix is not None and not any(t.name in imatrix for t, _ in plan):
        raise BadInput("the imatrix names none of this model's tensors (it belongs to another model). Collect one "
                       "for this model: llmkit quant imatrix -m MODEL --text TEXT -o imatrix.gguf")
    for t, new in plan:
        name = t.name
        if new != t.type_name and t.type_name not in ("F32", "F16", "BF16") and not allow_requantize:
            raise BadInput(f"tensor '{name}' is already quantized ({t.type_name}); requantizing loses quality. "
                           "Start from an F32/F16/BF16 model, or pass --allow-requantize.")
        if new != t.type_name and imatrix is not None and name in imatrix:
            want = t.shape[0] * (t.shape[2] if len(t.shape) > 2 else 1)
            if len(imatrix[name]) != want and name not in ("token_embd.weight", "per_layer_token_embd.weight"):
                raise BadInput(f"the imatrix entry for '{name}' has {len(imatrix[name])} values, the tensor needs {want}.")
    report = QuantReport(src, dst, ftype, fallbacks=chooser.n_fallback)
    align = int(g.metadata.get("general.alignment", ALIGN))  # the copied key must describe the output too
    header = _header(g, [(t.name, t.shape, new) for t, new in plan], rules.FTYPES[ftype][0], align, extra_meta)
    _tune_malloc()
    pool = Workers(threads or os.cpu_count() or 1)
    from llmkit.quant import jit

    jit.decide_for_run([(int(np.prod(t.shape)), get_format(new)) for t, new in plan  # small jobs skip numba's
                        if new != t.type_name and not (imatrix is not None and t.name in imatrix)])  # start-up
    try:
        _write(src, dst, header, plan, g.data_offset, imatrix, pool, measure, progress, report, align, replace)
    finally:
        pool.close()
        jit.decide_for_run(None)
    report.seconds = time.perf_counter() - t0
    return report


def _plan(g, ftype: str, pure: bool, has_imatrix: bool, overrides=None, assign=None):
    """[(tensor, output type)] in llama.cpp's tensor order, and the chooser (its fallback count)."""
    info = rules.model_info(g.metadata)
    by_name = {t.name: t for t in g.tensors}
    order = rules.tensor_order(list(by_name))
    chooser = rules.TypeChooser(info, ftype, order, pure, has_imatrix, overrides)
    plan = []
    for name in order:
        t = by_name[name]
        new = chooser.choose(name, t.shape, t.type_name)
        plan.append((t, assign[name] if assign and name in assign else new))
    return plan, chooser


def plan_types(src: str, ftype: str, pure: bool = False, has_imatrix: bool = False, overrides=None,
               assign=None) -> dict[str, str]:
    """{tensor: output type} that quantize_file would use."""
    plan, _ = _plan(read_gguf(src), rules.resolve_ftype(ftype), pure, has_imatrix, overrides, assign)
    return {t.name: new for t, new in plan}


_MALLOC_TUNED = False


def _tune_malloc() -> None:
    """Keep glibc from returning every numpy temporary to the kernel. A job's temporaries are a few
    hundred kB, above glibc's default mmap threshold (128 kB), so each one was a fresh mmap whose pages
    the kernel zeroes on first touch, then unmapped: ~490k page faults for one 520 MB model, which
    made the 32-block formats ~1.6x slower (measured). Allocations up to 64 MB now come from the
    heap and are reused. Process-wide and only a performance setting; skipped where there is no glibc."""
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


def _write(src, dst, header, plan, data_offset, imatrix, pool, measure, progress, report, align: int,
           replace: dict | None = None) -> None:
    from llmkit.io import atomic_file

    with open(src, "rb") as fin, atomic_file(dst) as fout:
        fout.write(header)

        buffers = _Buffers()

        def emit(t, job) -> None:
            parts, tr = job.finish()
            size = 0
            for part in parts:  # written piece by piece: no joined copy of the tensor
                fout.write(part)
                size += memoryview(part).nbytes
            fout.write(b"\0" * (-size % align))
            buffers.put(job.buffer)  # every job of this tensor is done: its input buffer is free again
            report.tensors.append(tr)
            report.bytes_in += t.nbytes
            report.bytes_out += size
            report.n_weights += int(np.prod(t.shape, dtype=np.int64))

        # read ahead: tensor i is read and its jobs queued while earlier tensors are still being
        # quantized; the oldest is written once the unwritten inputs exceed READ_AHEAD bytes (or as
        # soon as it is done), so small tensors (norms) never stall the pipeline
        pending: deque = deque()
        inflight = 0
        for i, (t, new) in enumerate(plan):
            if progress:
                progress(i, len(plan), t.name)
            if replace and t.name in replace:
                pending.append((t, _replaced(fin, data_offset, t, new, replace[t.name], measure, buffers)))
            else:
                pending.append((t, _convert(fin, data_offset, t, new, imatrix, pool, measure, buffers)))
            inflight += t.nbytes
            while len(pending) > 1 and (inflight > READ_AHEAD or pending[0][1].done()):
                t0, job = pending.popleft()
                inflight -= t0.nbytes
                emit(t0, job)
        while pending:
            emit(*pending.popleft())


def _convert(fin, data_offset, t, new: str, imatrix, pool, measure: bool, buffers: "_Buffers"):
    """Read one tensor (into a pooled buffer) and queue its quantization."""
    n = int(np.prod(t.shape, dtype=np.int64))
    tr = TensorReport(t.name, list(t.shape), t.type_name, new, t.nbytes, tensor_bytes(new, t.shape),
                      8 * tensor_bytes(new, t.shape) / n)
    fmt = get_format(new)
    weighted = imatrix is not None and fmt.uses_imatrix and t.name in imatrix
    searched = not fmt.nan_reaches_scale or weighted
    # a compiled kernel releases the GIL: threads then scale without the processes' pickling
    procs = pool.processes(t.nbytes, searched and not (fmt.compiled() and not weighted))
    if new == t.type_name or measure or procs is None:
        raw = read_tensor(fin, t, data_offset, buffers.get(t.nbytes))
        if new == t.type_name:
            if t.type_name in ("F32", "F16", "BF16"):
                _check_finite(to_f32(raw, t), t.name)
            if measure:
                tr.rmse, tr.max_abs_err, tr.cosine = 0.0, 0.0, 1.0
            return _Queued([], lambda: ([raw], tr), raw)
        x = to_f32(raw, t)
    else:
        raw = x = None  # worker processes read their own rows from the file
    ne0 = t.shape[0]
    rows_per_matrix = t.shape[1] if len(t.shape) > 1 else 1
    qw = imatrix.get(t.name) if imatrix is not None else None
    if qw is not None and len(qw) != ne0 * (t.shape[2] if len(t.shape) > 2 else 1):
        qw = None  # llama.cpp ignores a token-embedding entry of the wrong size (others were refused above)
    tr.imatrix = qw is not None
    # chunks of whole rows within one matrix (an expert's imatrix slice must not straddle chunks)
    # ~128k weights per job: its temporaries stay in cache (measured: 2x faster than 1M-weight jobs)
    rows_per_chunk = max(1, min(rows_per_matrix, (1 << 17) // ne0))
    n_rows = n // ne0
    row_in = t.nbytes // n_rows
    jobs = []
    for m0 in range(0, n_rows, rows_per_matrix):
        w = None
        if qw is not None and fmt.uses_imatrix:
            e = m0 // rows_per_matrix
            w = np.asarray(qw[e * ne0:(e + 1) * ne0], dtype=np.float32)
        for r0 in range(m0, min(m0 + rows_per_matrix, n_rows), rows_per_chunk):
            r1 = min(r0 + rows_per_chunk, m0 + rows_per_matrix, n_rows)
            if x is None:
                jobs.append(procs.submit(_rows_job, fin.name, data_offset + t.offset + r0 * row_in, r1 - r0, ne0,
                                         t.type, new, w, t.name))
            else:
                jobs.append(pool.threads.submit(_quantize_checked, fmt, x[r0:r1], w, t.name))

    def finish():
        parts = [j.result() for j in jobs]
        if measure:
            out = np.concatenate([np.frombuffer(memoryview(p).cast("B"), np.uint8) for p in parts])
            from llmkit.quant.evaluate import error_stats

            tr.rmse, tr.max_abs_err, tr.cosine = error_stats(x, fmt.dequantize(out, n))
        return parts, tr

    return _Queued(jobs, finish, raw)


class _Queued:
    """A tensor whose quantization jobs are queued: done() without blocking, finish() -> (output
    pieces, report row); `buffer` holds its input until it is written."""

    def __init__(self, jobs: list, finish: Callable, buffer):
        self.jobs, self.finish, self.buffer = jobs, finish, buffer

    def done(self) -> bool:
        return all(j.done() for j in self.jobs)


class _Buffers:
    """Reuses the input buffer of the last written tensor for the next read: a fresh 46 MB buffer costs
    ~11k page faults (the kernel zeroes every page) before the read can fill it. Holds at most one
    free buffer, so memory stays at what is in flight; tensors under 1 MB get plain new arrays."""

    MIN = 1 << 20

    def __init__(self):
        self.spare: np.ndarray | None = None

    def get(self, n: int) -> np.ndarray | None:
        if n < self.MIN:
            return None
        b, self.spare = self.spare, None
        if b is None or len(b) < n:
            b = np.empty(n, np.uint8)  # a spare that is too small is dropped here
        return b[:n]

    def put(self, view: np.ndarray | None) -> None:
        if view is not None and isinstance(view.base, np.ndarray) and len(view) >= self.MIN:
            if self.spare is None or len(view.base) > len(self.spare):
                self.spare = view.base


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
        """A process pool for this tensor, or None: only searched formats gain (measured: the plain
        32-block formats are mostly large numpy passes that release the GIL, and lose to the pickling)."""
        import multiprocessing

        if (self.n < 2 or nbytes < self.PROCESS_MIN_BYTES or not searched
                or "fork" not in multiprocessing.get_all_start_methods()):
            return None
        if self._procs is None:
            from concurrent.futures import ProcessPoolExecutor

            self._procs = ProcessPoolExecutor(max_workers=self.n, mp_context=multiprocessing.get_context("fork"))
        return self._procs

    def close(self) -> None:
        self.threads.shutdown()
        if self._procs is not None:
            self._procs.shutdown()


def _rows_job(path: str, start: int, n_rows: int, ne0: int, type_id: int, fmt_name: str, w, name: str) -> bytes:
    """Worker process: read rows [start, start + n_rows) of a tensor from the file and quantize them."""
    from llmkit.gguf.reader import TensorInfo

    info = TensorInfo(name, (ne0, n_rows), type_id, 0, tensor_bytes(GGML_TYPES[type_id][0], (ne0, n_rows)))
    with open(path, "rb") as f:
        raw = read_tensor(f, info, start)
    return _quantize_checked(get_format(fmt_name), to_f32(raw, info), w, name).tobytes()


def _quantize_checked(fmt, x: np.ndarray, w, name: str) -> np.ndarray:
    """One job: quantize, then validate like ggml_validate_row_data. For the plain 32-block and
    float formats a NaN/Inf weight always reaches a block scale (it is the block's max), so the check
    of the output catches it; searched formats (K-quants, IQ4, any imatrix) check the input first."""
    if not fmt.nan_reaches_scale or w is not None or fmt.compiled():  # compiled kernels: NaN need not reach a scale
        with np.errstate(over="ignore", invalid="ignore"):
            total = np.add.reduce(x, axis=None)  # NaN/Inf propagate; a finite overflow is re-checked exactly
        if not np.isfinite(total):
            _check_finite(x, name)
    with np.errstate(all="ignore"):  # overflowing scales are caught by fmt.check with a clear message
        out = np.ascontiguousarray(fmt.quantize(x, w))
    try:
        fmt.check(out, name)
    except BadInput:
        _check_finite(x, name)  # the clearer message when the cause is a NaN/Inf weight
        raise
    return out


def _check_finite(x: np.ndarray, name: str) -> None:
    if not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).sum())
        raise BadInput(f"tensor '{name}' holds {bad} NaN/Inf value(s); llama.cpp refuses such weights too. "
                       "Fix the model before quantizing.")


def _replaced(fin, data_offset, t, new: str, data: np.ndarray, measure: bool, buffers):
    """A tensor whose quantized bytes were made elsewhere (GPTQ): checked and written as they are."""
    n = int(np.prod(t.shape, dtype=np.int64))
    data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if data.nbytes != tensor_bytes(new, t.shape):
        raise BadInput(f"tensor '{t.name}': {data.nbytes} bytes of {new} given, {tensor_bytes(new, t.shape)} needed.")
    get_format(new).check(data, t.name)
    tr = TensorReport(t.name, list(t.shape), t.type_name, new, t.nbytes, data.nbytes, 8 * data.nbytes / n)
    if measure:
        from llmkit.quant.evaluate import error_stats

        x = to_f32(read_tensor(fin, t, data_offset), t)
        tr.rmse, tr.max_abs_err, tr.cosine = error_stats(x, get_format(new).dequantize(data, n))
    return _Queued([], lambda: ([data], tr), None)


def _header(g, tensors, ftype_id: int, align: int, extra_meta: dict[str, str] | None = None) -> bytes:
    """Header, metadata (input entries verbatim + quantization version + file type), tensor infos, padding."""
    with open(g.path, "rb") as f:
        raw = f.read(max(e for _, e, _ in g.kv_spans.values()) if g.kv_spans else 0)
    kvs = [raw[s:e] for key, (s, e, _) in g.kv_spans.items() if key not in _DROP]

    def kv_u32(key: str, v: int) -> bytes:
        k = key.encode()
        return struct.pack("<Q", len(k)) + k + struct.pack("<II", 4, v)

    def kv_str(key: str, v: str) -> bytes:
        k, b = key.encode(), v.encode("utf-8")
        return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(b)) + b

    kvs += [kv_u32("general.quantization_version", QNT_VERSION), kv_u32("general.file_type", ftype_id)]
    kvs += [kv_str(k, v) for k, v in (extra_meta or {}).items() if k not in g.kv_spans]
    infos, offset = [], 0
    for name, shape, type_name in tensors:
        nd = rules.n_dims(shape)
        k = name.encode("utf-8")
        infos.append(struct.pack("<Q", len(k)) + k + struct.pack("<I", nd) + struct.pack(f"<{nd}q", *shape[:nd])
                     + struct.pack("<iQ", TYPE_ID[type_name], offset))
        size = tensor_bytes(type_name, shape)
        offset += size + (-size % align)
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
    return out + b"\0" * (-len(out) % align)
