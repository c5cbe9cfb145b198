"""Quantization benchmark (not a test): llama.cpp's quantizer vs llmkit on the same F32 model, one run.

    python benchmarks/quant_bench.py                      # builds a ~540 MB random-weight llama in /tmp
    python benchmarks/quant_bench.py --types Q8_0,Q4_K_M --threads 1,2 --repeat 1

Each run is a fresh subprocess (so peak RSS is its own); the two quantizers alternate `--repeat`
times and the fastest run of each counts (on a shared VM single runs vary by +-30 %). Prints wall
time, the llama.cpp/llmkit speed ratio, peak RSS and throughput (input bytes per second) as a
fraction of this machine's measured memory read bandwidth; checks that both outputs are
byte-identical. llmkit's RSS counts
its worker processes (K-quants with 2+ threads) as workers x the largest worker's peak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(__file__), "..")

CHILD = r"""
import ctypes, json, sys, time
sys.path.insert(0, {root!r})
kind, src, dst, ftype, threads = sys.argv[1:6]
t = time.perf_counter()
if kind == "llama.cpp":
    import llama_cpp
    from llmkit.llama.runtime import _silence_llama_log
    from llmkit.quant.plan.rules import FTYPES
    _silence_llama_log()
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread = FTYPES[ftype][0], int(threads)
    assert llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)) == 0
else:
    from llmkit.quant.write.quantize import quantize_file
    quantize_file(src, dst, ftype, threads=int(threads))
import resource
hwm = int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1])  # this process's own peak
child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # largest worker process, if any
# workers run at once: count each at the largest one's peak (an upper bound)
print(json.dumps({{"s": time.perf_counter() - t, "rss_mb": (hwm + (int(threads) * child if child else 0)) / 1024}}))
"""


def build_model(path: str, n_embd: int, n_ff: int, n_layer: int) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import numpy as np

    from ggufmake import write_tiny_llama

    write_tiny_llama(path, n_embd=n_embd, n_ff=n_ff, n_layer=n_layer, n_head=16, n_head_kv=4, seed=0,
                     dtype=np.float32, n_ctx=2048)


def run(kind, src, dst, ftype, threads) -> dict:
    code = CHILD.format(root=os.path.abspath(ROOT))
    out = subprocess.run([sys.executable, "-c", code, kind, src, dst, ftype, str(threads)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q6_K,Q4_K_M,Q5_K_M,Q3_K_M,Q2_K")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each quantizer (alternating); the fastest counts")
    ap.add_argument("--n-embd", type=int, default=2048)
    ap.add_argument("--n-ff", type=int, default=5632)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--model", help="use this F32/F16 GGUF instead of building one")
    ap.add_argument("--build-only", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build_only:
        build_model(args.build_only, args.n_embd, args.n_ff, args.layers)
        return
    sys.path.insert(0, ROOT)
    from llmkit.kv.plan import measured_bandwidth

    tmp = tempfile.mkdtemp(prefix="quantbench-")
    src = args.model or os.path.join(tmp, "model-f32.gguf")
    if not args.model:  # built in a child process so this one stays small
        subprocess.run([sys.executable, __file__, "--build-only", src, "--n-embd", str(args.n_embd), "--n-ff",
                        str(args.n_ff), "--layers", str(args.layers)], check=True)
    size = os.path.getsize(src)
    bw = measured_bandwidth()
    bw *= 1e9  # measured_bandwidth() returns GB/s
    print(f"model: {src} ({size / 2**20:.0f} MiB); memory read bandwidth {bw / 1e9:.1f} GB/s")
    print(f"{'type':8} {'thr':>3} {'llama.cpp s':>11} {'llmkit s':>9} {'speed':>6} {'RSS llama.cpp':>13} {'RSS llmkit':>10} "
          f"{'llmkit GB/s':>11} {'of bw':>6} same")
    for ftype in args.types.split(","):
        for th in [int(t) for t in args.threads.split(",")]:
            a, b = os.path.join(tmp, "ref.gguf"), os.path.join(tmp, "ours.gguf")
            refs, ourss = [], []
            for _ in range(max(1, args.repeat)):
                refs.append(run("llama.cpp", src, a, ftype, th))
                ourss.append(run("llmkit", src, b, ftype, th))
            ref = {"s": min(r["s"] for r in refs), "rss_mb": max(r["rss_mb"] for r in refs)}
            ours = {"s": min(r["s"] for r in ourss), "rss_mb": max(r["rss_mb"] for r in ourss)}
            same = open(a, "rb").read() == open(b, "rb").read()
            gbs = size / ours["s"] / 1e9
            print(f"{ftype:8} {th:>3} {ref['s']:>11.2f} {ours['s']:>9.2f} {ref['s'] / ours['s']:>5.2f}x "
                  f"{ref['rss_mb']:>10.0f} MB {ours['rss_mb']:>7.0f} MB {gbs:>11.2f} {gbs * 1e9 / bw:>5.0%} {same}")
            os.unlink(a), os.unlink(b)
    if not args.model:
        os.unlink(src)
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
