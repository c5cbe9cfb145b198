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

Compiled code is cached (llmkit.config.numba_cache_dir, default ~/.cache/llmkit/numba): the first use of a type
after an install compiles its kernel (seconds; a K-quant's two entry points, with and without an
imatrix, share one compiled body so that it compiles once), later runs load it from the cache.
LLMKIT_NO_JIT=1 turns the kernels off (the numpy paths give the same bytes); LLMKIT_JIT=1 uses them
whatever the run-time decision says (tests on small models, which the decision leaves to numpy,
check the compiled path so). Timings: docs/design/quant-kernels.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

F32 = np.float32
_KERNELS = None
START_UP_S = 1.0  # importing numba and loading the first cached kernel (row quant-jit-startup)
# ns per weight a format's compiled kernel saves over its numpy path, 1 thread, in the write
# pipeline's job sizes (benchmarks/quant_formats.py, rows quant-jit-<type>); a type listed here has a kernel
SAVES_NS = {"Q8_0": 1, "Q4_0": 2, "Q4_1": 2, "Q5_0": 2, "Q5_1": 2, "Q2_K": 18, "Q3_K": 27, "Q4_K": 60, "Q5_K": 40,
            "Q6_K": 10, "MXFP4": 25}
_NOTED: set = set()  # (module, kernel) pairs already checked for a cached compilation in this process


@dataclass(frozen=True)
class Kernels:
    """How one run uses the compiled kernels, passed down the run (no module state):

    - `use`: this run's decision; False leaves the formats to their numpy paths (same bytes).
      LLMKIT_JIT=1 overrides a False, LLMKIT_NO_JIT=1 (or no numba) turns the kernels off anyway.
    - `notice`: told in one line before a kernel compiles for the first time (not found in numba's
      cache), since a first run waits seconds per kernel; None says nothing.
    """

    use: bool = True
    notice: Callable[[str], None] | None = None

    def on(self) -> bool:
        """The kernels run: numba is installed and not switched off, and this run allows them."""
        from llmkit import config

        return (self.use or config.flag("LLMKIT_JIT")) and available()

    def quiet(self) -> "Kernels":
        """The same decision without the notice (for worker processes: the callback stays home)."""
        return replace(self, notice=None)

    def note_if_cold(self, module: str, kernel: str) -> None:
        """Tell `notice` when kernel `kernel` of llmkit.quant.formats.<module> has no cached compilation
        yet (numba names its index files <module>.<kernel>-<line>.py<ver>.nbi in its cache directory)."""
        if self.notice is None or (module, kernel) in _NOTED:
            return
        _NOTED.add((module, kernel))
        from llmkit.config import numba_cache_dir

        root = numba_cache_dir()
        if root.is_dir() and any(root.rglob(f"{module}.{kernel}-*.nbi")):
            return
        self.notice(f"compiling llmkit's {kernel} quantization kernel (first use after an install: a few seconds, "
                    f"cached in {root})")


DEFAULT = Kernels()  # a direct call outside a run: the kernels whenever numba is there, silently


def for_run(plan_weights: list[tuple[int, object]], notice: Callable[[str], None] | None = None) -> Kernels:
    """A run's Kernels from [(weights, format)] of what it quantizes with a kernel of jit_kernel's
    module (without an imatrix, or with one where the format has a weighted_kernel): the kernels run
    only when the time they save (SAVES_NS per weight) repays numba's start-up (START_UP_S); those of
    the linked library (native.py) need no start-up and do not count."""
    from llmkit.quant.formats import native

    saved = sum(n * f.jit_saves_ns for n, f in plan_weights if f.jit_kernel and not native.has(f.jit_kernel)) * 1e-9
    return Kernels(use=saved >= START_UP_S, notice=notice)


def available() -> bool:
    """numba is installed and not switched off (LLMKIT_NO_JIT)."""
    from llmkit import config

    if config.flag("LLMKIT_NO_JIT"):
        return False
    return kernels() is not None


def kernels():
    """The compiled kernel module, or None without numba (imported on first use: numba is slow to import)."""
    global _KERNELS
    if _KERNELS is None:
        from llmkit.config import use_numba_cache

        use_numba_cache()
        try:
            from llmkit.quant.formats import _kernels
        except ImportError:
            _KERNELS = False
        else:
            _KERNELS = _kernels
    return _KERNELS or None


def load_kernels(module: str):
    """The compiled kernel module llmkit.quant.formats.<module> (`iquants._kernels_iq2`, ...), imported
    on first use with numba's cache in llmkit's, so numba is never imported with llmkit's CLI; without
    numba, MissingDependency names the extra to install. numpy.ma is imported first: numba's first
    kernel call imports it, and an import must not run in a thread that a fork may copy half done."""
    import importlib

    import numpy.ma  # noqa: F401

    from llmkit.errors import MissingDependency

    kernels()  # points numba at its cache; None without numba
    try:
        return importlib.import_module(f"llmkit.quant.formats.{module}")
    except ImportError:
        raise MissingDependency("numba", "quant") from None


def run_weighted(name: str, x: np.ndarray, qw: np.ndarray, type_size: int, block: int) -> np.ndarray:
    """Quantize (n_rows, n) float32 rows with the imatrix qw (n,) with kernel `name`: each block gets
    its slice of qw -> (n_blocks, type_size) uint8."""
    n_rows, n = x.shape
    wb = np.ascontiguousarray(np.broadcast_to(np.asarray(qw, F32).reshape(1, n), (n_rows, n))).reshape(-1, block)
    return run(name, x, type_size, block, wb)


def run(name: str, x: np.ndarray, type_size: int, block: int, *blocks: np.ndarray) -> np.ndarray:
    """Quantize (n_blocks, block) float32 with kernel `name` of _kernels.py -> (n_blocks, type_size)
    uint8; `blocks`: further (n_blocks, block) inputs the kernel takes after x (run_weighted's imatrix).
    The caller's Kernels.note_if_cold("_kernels", name) says first whether it compiles now."""
    mod = kernels()
    x = np.ascontiguousarray(x, dtype=F32).reshape(-1, block)
    out = np.empty((len(x), type_size), np.uint8)
    getattr(mod, name)(x, *blocks, out)
    return out


def f16_rows(raw: np.ndarray, ne0: int) -> tuple[np.ndarray, int]:
    """F16 tensor bytes as float32 rows (n_rows, ne0), with the count of Inf/NaN values among them
    (the compiled kernels' callers then skip a second pass for the finiteness check)."""
    mod = kernels()
    h = np.ascontiguousarray(raw).view("<u2").reshape(-1)
    out = np.empty(len(h), np.uint32)
    bad = mod.f16_to_f32(h, mod.F16_BITS, out)
    return out.view(F32).reshape(-1, ne0), int(bad)
