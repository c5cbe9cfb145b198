"""Compiled (numba) kernels for the quantizers' hot loops, in C's float32 operation order.

The numpy modules (q4_0.py, kquant.py, ...) stay the readable definition of every format; these
kernels are the same loops as ggml-quants.c, compiled, for the formats and paths where numpy's
per-call overhead dominated (a K-quant scale search is ~16 small passes per candidate scale).
Byte identity with llama.cpp is kept by construction and checked by the tests:

- every value is float32 and every constant is made float32 first (numba, like numpy, would
  promote float32 * python-float to float64);
- no fastmath: LLVM then neither contracts a*b+c into an FMA nor reorders sums, so the C order of
  operations (ggml-quants.c is built without FMA) is what runs;
- nearest_int is round-half-to-even (ggml's 12582912.f trick), C's (int) casts truncate, roundf
  rounds half away from zero, and GGML_FP32_TO_FP16 rounds to nearest even (done in float64, exact).

Compiled code is cached (NUMBA_CACHE_DIR, default ~/.cache/llmkit/numba): the first use of a type
after an install compiles its kernel, 4-30 s here (the ten K-quant entry points: 73 s in all; a
K-quant's two entry points, with and without an imatrix, share one compiled body whose imatrix flag
is read at run time, instead of each inlining its own copy: 242 s before), later runs load them in
~0.5 s. LLMKIT_NO_JIT=1 turns the kernels off (the numpy paths give the same bytes); LLMKIT_JIT=1
uses them whatever the run-time decision says (tests on small models, which the decision leaves to
numpy, check the compiled path so).
"""

from __future__ import annotations

import os

import numpy as np

F32 = np.float32
_KERNELS = None
_RUN: bool | None = None  # this quantization run's decision (None: no run, e.g. a direct call)
START_UP_S = 1.0  # importing numba (0.5 s) and loading the first cached kernel (0.5 s), measured


def decide_for_run(plan_weights: list[tuple[int, object]] | None) -> None:
    """Use the kernels in this run or not, from [(weights, format)] of what it quantizes with a
    kernel of jit_kernel's module (without an imatrix, or with one where the format has a
    weighted_kernel; None: forget the decision): only when the time they save (Format.jit_saves_ns per
    weight, measured against the numpy path: 30-60 ns for Q4_K/Q5_K, 1-2 ns for the memory-bound
    32-block formats) repays numba's start-up. Same bytes either way."""
    global _RUN
    if plan_weights is None:
        _RUN = None
        return
    _RUN = sum(n * f.jit_saves_ns for n, f in plan_weights if f.jit_kernel) * 1e-9 >= START_UP_S


def run_allows() -> bool:
    """This run's decision (or LLMKIT_JIT=1, which forces the kernels) lets the kernels run."""
    from llmkit import config

    return _RUN is None or _RUN or config.flag("LLMKIT_JIT")


def active() -> bool:
    """The kernels run now: numba is installed and not switched off, and this run's decision allows them."""
    return run_allows() and enabled()


def enabled() -> bool:
    """numba is installed and not switched off."""
    from llmkit import config

    if config.flag("LLMKIT_NO_JIT"):
        return False
    return kernels() is not None


def kernels():
    """The compiled kernel module, or None without numba (imported on first use: numba is slow to import)."""
    global _KERNELS
    if _KERNELS is None:
        if "NUMBA_CACHE_DIR" not in os.environ:
            from llmkit.config import cache_dir

            os.environ["NUMBA_CACHE_DIR"] = str(cache_dir("numba"))
        try:
            from llmkit.quant.formats import _kernels
        except ImportError:
            _KERNELS = False
        else:
            _KERNELS = _kernels
    return _KERNELS or None


# Called with one line before a kernel compiles for the first time (not found in numba's cache):
# the CLI shows it on stderr, since a first run waits seconds per kernel. None: say nothing.
NOTICE = None
_NOTED: set = set()


def note_if_cold(module: str, kernel: str) -> None:
    """Tell NOTICE when kernel `kernel` of llmkit.quant.formats.<module> has no cached compilation yet
    (numba names its index files <module>.<kernel>-<line>.py<ver>.nbi under NUMBA_CACHE_DIR)."""
    if NOTICE is None or (module, kernel) in _NOTED:
        return
    _NOTED.add((module, kernel))
    from pathlib import Path

    root = Path(os.environ.get("NUMBA_CACHE_DIR", ""))
    if root.name and any(root.rglob(f"{module}.{kernel}-*.nbi")):
        return
    NOTICE(f"compiling llmkit's {kernel} quantization kernel (first use after an install: a few seconds, "
           f"cached in {root})")


def run_weighted(name: str, x: np.ndarray, qw: np.ndarray, type_size: int, block: int) -> np.ndarray:
    """Quantize (n_rows, n) float32 rows with the imatrix qw (n,) with kernel `name`: each block gets
    its slice of qw -> (n_blocks, type_size) uint8."""
    n_rows, n = x.shape
    wb = np.ascontiguousarray(np.broadcast_to(np.asarray(qw, F32).reshape(1, n), (n_rows, n))).reshape(-1, block)
    return run(name, x, type_size, block, wb)


def run(name: str, x: np.ndarray, type_size: int, block: int, *blocks: np.ndarray) -> np.ndarray:
    """Quantize (n_blocks, block) float32 with kernel `name` -> (n_blocks, type_size) uint8; `blocks`:
    further (n_blocks, block) inputs the kernel takes after x (run_weighted's imatrix)."""
    k = kernels()
    note_if_cold("_kernels", name)
    x = np.ascontiguousarray(x, dtype=F32).reshape(-1, block)
    out = np.empty((len(x), type_size), np.uint8)
    getattr(k, name)(x, *blocks, out)
    return out


def f16_rows(raw: np.ndarray, ne0: int) -> tuple[np.ndarray, int]:
    """F16 tensor bytes as float32 rows (n_rows, ne0), with the count of Inf/NaN values among them
    (the compiled kernels' callers then skip a second pass for the finiteness check)."""
    k = kernels()
    note_if_cold("_kernels", "f16_to_f32")
    h = np.ascontiguousarray(raw).view("<u2").reshape(-1)
    out = np.empty(len(h), np.uint32)
    bad = k.f16_to_f32(h, k.F16_BITS, out)
    return out.view(F32).reshape(-1, ne0), int(bad)
