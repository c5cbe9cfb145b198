"""Per-format figures the quantizers' code relies on (area quant-formats of quant_sections.py; not a test).

- `quant-jit-<type>`: ns per weight the compiled (numba) kernel saves over the format's numpy path,
  1 thread, jobs of the write pipeline's sizes (128k weights for numpy, 256k for the kernel), rows of
  4096 Gaussian weights; the figures behind llmkit/quant/formats/jit.py's SAVES_NS.
- `quant-jit-startup`: importing numba and running the first (cached) kernel once, in a fresh process;
  the figure behind jit.START_UP_S.
- `quant-types-err-<type>`: the imatrix-weighted relative squared error of each low-bit type on one
  fixed synthetic matrix (Student-t rows, gamma column weights): why Q1_0/Q2_0/TQ2_0 are not
  --target-size candidates (a smaller type has a smaller error).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Cmd, Row, cmds_of, run_once  # noqa: E402

ME = os.path.abspath(__file__)
ERR_TYPES = ("Q1_0", "IQ1_S", "IQ1_M", "IQ2_XXS", "TQ2_0", "Q2_0", "IQ2_XS", "Q2_K", "Q3_K")


def child(argv):
    import numpy as np

    from llmkit.quant.formats import get_format
    from llmkit.quant.formats.jit import Kernels

    if argv[0] == "saves":  # TYPE WEIGHTS REPEATS -> ns per weight, both paths
        fmt, n, reps = get_format(argv[1]), int(argv[2]), int(argv[3])
        x = np.random.default_rng(0).standard_normal((n // 4096, 4096)).astype(np.float32)

        def timed(kernels, job):
            rows = max(1, job // 4096)
            fmt.quantize(x[:rows], None, kernels)  # compile/load and warm up outside the clock
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                for r in range(0, len(x), rows):
                    fmt.quantize(x[r:r + rows], None, kernels)
                best = min(best, time.perf_counter() - t0)
            return best * 1e9 / x.size

        plain, compiled = timed(Kernels(use=False), 1 << 17), timed(Kernels(use=True), 1 << 18)
        print(json.dumps({"numpy_ns": plain, "jit_ns": compiled, "saved_ns": plain - compiled}))
    elif argv[0] == "startup":  # numba's import and the first cached kernel, in this fresh process
        t0 = time.perf_counter()
        # a K-quant: the plain formats run from the linked library and never import numba
        get_format("Q4_K").quantize(np.zeros((1, 256), np.float32), None, Kernels(use=True))
        print(json.dumps({"seconds": time.perf_counter() - t0}))
    elif argv[0] == "errors":  # relative weighted error per type on one fixed matrix
        rng = np.random.default_rng(0)
        x = (rng.standard_t(5, (64, 4096)) * 0.02).astype(np.float32)
        w = (rng.gamma(0.5, 1.0, 4096) + 1e-3).astype(np.float32)
        out = {}
        for t in ERR_TYPES:
            f = get_format(t)
            d = f.dequantize(f.quantize(x, w if f.uses_imatrix else None).reshape(-1), x.size).reshape(x.shape)
            out[t] = {"bpw": 8 * f.type_size / f.block, "err": float(((x - d) ** 2 * w).sum() / (x ** 2 * w).sum())}
        print(json.dumps(out))
    else:
        raise SystemExit(f"unknown child {argv[0]}")


def rows(cfg):
    from llmkit.quant.formats.jit import SAVES_NS

    n = cfg.pick(1 << 24, 1 << 22, 1 << 18)
    reps = cfg.pick(5, 3, 1)
    out = []
    env = {"LLMKIT_JIT": "", "LLMKIT_NO_JIT": ""}
    for t, table in SAVES_NS.items():
        c = Cmd("llmkit", [PY, ME, "saves", t, str(n), str(reps)], env=env)
        r = run_once(c).report
        out.append(Row(f"quant-jit-{t.lower()}", f"{t}: ns per weight, numpy path vs compiled kernel, 1 thread, "
                       f"{n / 2**20:g}M weights", f"{r['numpy_ns']:.1f} ns", f"{r['jit_ns']:.1f} ns",
                       f"saves {r['saved_ns']:.1f} ns/weight", f"jit.SAVES_NS says {table}", cmds_of(c)))
    c = Cmd("llmkit", [PY, ME, "startup"], env=env)
    s = sorted(run_once(c).report["seconds"] for _ in range(3))[1]
    out.append(Row("quant-jit-startup", "import numba + first cached kernel call, fresh process (median of 3)", "–",
                   f"{s:.2f} s", "–", "jit.START_UP_S is 1.0", cmds_of(c)))
    c = Cmd("llmkit", [PY, ME, "errors"])
    errs = run_once(c).report
    for t, e in errs.items():
        out.append(Row(f"quant-types-err-{t.lower()}", f"{t} ({e['bpw']:.4g} bpw): imatrix-weighted relative squared "
                       "error, 64 x 4096 Student-t weights", "–", f"{e['err']:.4f}", "–", "", cmds_of(c)))
    setup = ["in-process timings, best of the repeats; the kernels' numba cache warm (first compilation not timed)",
             "errors: numpy only, deterministic (seed 0)"]
    return "quantization formats: compiled kernels, numba's start-up, low-bit errors", setup, out


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    child(sys.argv[1:])
