"""Small files: the whole `llmkit quant` command against llama.cpp's quantizer called in-process (area
quant-startup of quant_sections.py; not a test).

A ~420 MB random-weight F32 llama (tests/ggufmake.py: 2 layers, n_embd 2048, n_ff 6912, GQA 4). The
anchor is `llama_model_quantize` through llama-cpp-python, timed around the call alone inside a
process that has already imported the binding (what a library caller pays); llmkit's figure is the
whole command, clock outside (Python start-up, imports and the write included). Both 2 threads,
alternating, median; check: the two files byte-identical.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Cmd, Row, cmds_of, run_once  # noqa: E402

ME = os.path.abspath(__file__)
TYPES = ("Q4_0", "Q8_0", "Q4_K_M")


def child(argv):
    if argv[0] == "build":
        import numpy as np

        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from ggufmake import write_tiny_llama

        n_embd, n_ff = map(int, argv[2:4])
        write_tiny_llama(argv[1], n_embd=n_embd, n_ff=n_ff, n_layer=2, n_head=16, n_head_kv=4, seed=0,
                         dtype=np.float32, n_ctx=2048)
    elif argv[0] == "inproc":  # SRC DST FTYPE: llama_model_quantize timed around the call
        import ctypes

        import llama_cpp

        from llmkit.llama.runtime import silence_llama_log
        from llmkit.quant.plan import rules

        silence_llama_log()
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype, p.nthread = rules.FTYPES[argv[3]][0], 2
        t0 = time.perf_counter()
        rc = llama_cpp.llama_model_quantize(argv[1].encode(), argv[2].encode(), ctypes.byref(p))
        print(json.dumps({"seconds": time.perf_counter() - t0, "rc": rc}))
    else:
        raise SystemExit(f"unknown child {argv[0]}")


def rows(cfg):
    d = cfg.tmp("quant-startup")
    src, ref, ours = (os.path.join(d, n) for n in ("model-f32.gguf", "ref.gguf", "ours.gguf"))
    n_embd, n_ff = cfg.pick((2048, 6912), (2048, 6912), (256, 512))
    run_once(Cmd("build", [PY, ME, "build", src, str(n_embd), str(n_ff)]))
    size = os.path.getsize(src)
    out = []
    for t in TYPES:
        a = Cmd("llama.cpp in-process", [PY, ME, "inproc", src, ref, t])
        b = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "quant", src, "--type", t, "-o", ours, "-t", "2"])
        ta, tb = [], []
        for _ in range(cfg.pick(5, 3, 1)):
            ta.append(run_once(a).report["seconds"])
            tb.append(run_once(b).wall_s)
        same = open(ref, "rb").read() == open(ours, "rb").read()
        ma, mb = statistics.median(ta), statistics.median(tb)
        out.append(Row(f"quant-startup-{t.lower()}", f"quantize {size / 2**20:.0f} MiB F32 -> {t}, 2 threads: "
                       "llama_model_quantize call vs the whole llmkit command", f"{ma:.2f} s ({min(ta):.2f}–{max(ta):.2f}, "
                       f"n={len(ta)})", f"{mb:.2f} s ({min(tb):.2f}–{max(tb):.2f}, n={len(tb)})",
                       f"speed {ma / mb:.2f}× llama.cpp in-process", "output bytes identical" if same else "FILES DIFFER",
                       cmds_of(a, b)))
    setup = [f"random-weight F32 llama, n_embd {n_embd}, n_ff {n_ff}, 2 layers ({size / 2**20:.0f} MiB), tests/ggufmake.py"]
    return "small files: the whole command vs llama.cpp's quantizer in-process", setup, out


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    child(sys.argv[1:])
