"""Quantization rows for run.py (not a test): llama.cpp's own tools against `llmkit quant`, whole processes.

    python benchmarks/run.py --area quant [--quick]

- Quantize: the `llama-quantize` binary (built by scripts/build_llama_server.sh) and
  `llmkit quant quantize` on the same random-weight F32 llama built here, each a whole process
  timed from outside (start-up, imports and the write included), alternating, median of >= 3
  (>= 5 under a second), 1 and 2 threads. Check: output bytes identical (if the files differ,
  whether every tensor's data is identical).
- imatrix: `llama-imatrix` vs `llmkit quant imatrix` (if the binary was built), same model, text,
  context and chunks; time, and the entry names/counts of both files.
- Perplexity: `llama-perplexity` vs `llmkit quant ppl`, same model, text, context and chunks; time
  and both PPL values.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Cmd, Row, cmds_of, compare, llama_bin, rss, run_once, speed, walls  # noqa: E402

ME = os.path.abspath(__file__)
ALL_TYPES = "Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q6_K,Q4_K_M,Q5_K_M,Q3_K_M,Q2_K,IQ4_NL,IQ4_XS"
# the file types quantized with an imatrix (the lattice i-quants need one; the same file for both sides)
IMATRIX_TYPES = "IQ1_S,IQ1_M,IQ2_XXS,IQ2_XS,IQ2_M,IQ3_XXS,IQ3_XS,IQ3_S,IQ3_M,Q2_K_S,TQ1_0,TQ2_0"


def child(argv):
    if argv[0] == "build":  # a random-weight F32 llama (tests/ggufmake.py), built once, not timed
        import numpy as np

        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from ggufmake import write_tiny_llama

        n_embd, n_ff, n_layer = map(int, argv[2:5])
        write_tiny_llama(argv[1], n_embd=n_embd, n_ff=n_ff, n_layer=n_layer, n_head=16, n_head_kv=4, seed=0,
                         dtype=np.float32, n_ctx=2048)
    elif argv[0] == "imatrix-dat":  # a synthetic imatrix (.dat) for every blk.* matrix, not timed
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from imatrixmake import write_imatrix_dat

        write_imatrix_dat(argv[2], argv[1], seed=0)
    elif argv[0] == "imatrix-entries":  # names and counts of an imatrix GGUF
        from gguf import GGUFReader

        r = GGUFReader(argv[1])
        names = sorted(t.name for t in r.tensors)
        print(json.dumps({"n": len(names), "names": names}))
    else:
        raise SystemExit(f"unknown child {argv[0]}")


def same_tensors(a: str, b: str) -> str:
    """'identical bytes', or whether the tensor data agree when the files differ (metadata only)."""
    if open(a, "rb").read() == open(b, "rb").read():
        return "output bytes identical"
    from gguf import GGUFReader

    ra, rb = GGUFReader(a), GGUFReader(b)
    ta = {t.name: bytes(t.data.tobytes()) for t in ra.tensors}
    tb = {t.name: bytes(t.data.tobytes()) for t in rb.tensors}
    bad = [n for n in ta if ta[n] != tb.get(n)]
    return "files differ; tensor data identical (metadata differs)" if not bad and ta.keys() == tb.keys() else \
        f"DIFFERENT tensor data: {len(bad)} tensors ({', '.join(bad[:3])})"


def quantize_rows(cfg, q: str) -> tuple[list[Row], str]:
    work = cfg.tmp("quant")
    dims = cfg.pick((2048, 5632, 3), (1024, 2816, 2), (256, 512, 1))
    src = os.path.join(work, "model-f32.gguf")
    build = Cmd("setup: random-weight F32 llama", [PY, ME, "build", src, *dims])
    run_once(build)
    size = os.path.getsize(src) / 2**20
    types = cfg.pick(ALL_TYPES, "Q8_0,Q4_0,Q6_K,Q4_K_M,IQ4_XS", "Q8_0,Q4_K_M").split(",")
    rows = []
    for t in types:
        for th in (1, 2):
            a, b = os.path.join(work, "ref.gguf"), os.path.join(work, "ours.gguf")
            ref = Cmd("llama-quantize", [q, src, a, t, th])
            ours = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "quant", "quantize", src, "--type", t, "-o", b, "--threads", th])
            # warm-up round only where runs are short (page cache); IQ4 runs take many seconds
            runs = compare([ref, ours], cfg, warmup=not t.startswith("IQ"))
            wa, wb = walls(runs[ref.label]), walls(runs[ours.label])
            rows.append(Row(f"quant-{t.lower()}-t{th}", f"quantize {size:.0f} MiB F32 → {t}, {th} thread(s), whole "
                            "process (wall, peak RSS)", f"{wa.fmt()}, {rss(runs[ref.label]):.0f} MB",
                            f"{wb.fmt()}, {rss(runs[ours.label]):.0f} MB", speed(wa.median, wb.median, "llama.cpp"),
                            same_tensors(a, b), cmds_of(build, ref, ours)))
            os.unlink(a), os.unlink(b)
    imx = os.path.join(work, "imatrix.dat")
    mk = Cmd("setup: synthetic imatrix", [PY, ME, "imatrix-dat", src, imx])
    run_once(mk)
    for t in cfg.pick(IMATRIX_TYPES, "IQ1_M,IQ2_XXS,IQ2_M,IQ3_XXS,IQ3_S,TQ2_0", "IQ2_XXS").split(","):
        th = 2
        a, b = os.path.join(work, "ref.gguf"), os.path.join(work, "ours.gguf")
        ref = Cmd("llama-quantize", [q, "--imatrix", imx, src, a, t, th])
        ours = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "quant", "quantize", src, "--type", t, "--imatrix", imx, "-o", b,
                              "--threads", th])
        runs = compare([ref, ours], cfg, warmup=False)
        wa, wb = walls(runs[ref.label]), walls(runs[ours.label])
        rows.append(Row(f"quant-{t.lower()}-imatrix-t{th}", f"quantize {size:.0f} MiB F32 → {t} with an imatrix, "
                        f"{th} threads, whole process (wall, peak RSS)", f"{wa.fmt()}, {rss(runs[ref.label]):.0f} MB",
                        f"{wb.fmt()}, {rss(runs[ours.label]):.0f} MB", speed(wa.median, wb.median, "llama.cpp"),
                        same_tensors(a, b), cmds_of(build, mk, ref, ours)))
        os.unlink(a), os.unlink(b)
    os.unlink(src)
    return rows, (f"model: random-weight F32 llama, n_embd {dims[0]}, n_ff {dims[1]}, {dims[2]} layers, GQA 4 "
                  f"({size:.0f} MiB), built by tests/ggufmake.py; imatrix rows: a synthetic imatrix "
                  "(tests/imatrixmake.py) given to both sides")


def real_rows(cfg, q: str) -> list[Row]:
    """The same whole-process comparison on a real model (run.py --quant-model, --quant-imatrix), 2 threads:
    the sizes users quantize, where throughput and not start-up decides."""
    src, imx = cfg.quant_model, cfg.quant_imatrix
    size = os.path.getsize(src) / 2**30
    work = cfg.tmp("quant-real")
    plain = cfg.pick("Q8_0,Q4_0,Q5_1,Q3_K_S,Q6_K,Q5_K_M,Q4_K_M,TQ2_0,IQ4_XS,IQ3_S",
                     "Q8_0,Q4_0,Q3_K_S,Q6_K,Q4_K_M,TQ2_0", "Q8_0").split(",")
    with_imx = cfg.pick("Q3_K_M,Q2_K,IQ3_XXS,IQ2_M", "Q3_K_M,IQ2_M", "").split(",") if imx else []
    rows = []
    for i, t in enumerate(plain + [t for t in with_imx if t]):
        use = ["--imatrix", imx] if t in with_imx else []
        slow = t.startswith("IQ")  # minutes per run on a 1.5B model: one run per side in --quick
        a, b = os.path.join(work, "ref.gguf"), os.path.join(work, "ours.gguf")
        ref = Cmd("llama-quantize", [q, *use, src, a, t, 2])
        ours = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "quant", "quantize", src, "--type", t, *use, "-o", b,
                              "--threads", 2])
        # one warm-up round before the first row reads the base into the page cache; later rows find it there
        runs = compare([ref, ours], cfg, warmup=i == 0, min_runs=cfg.pick(3, 1 if slow else 3, 1))
        wa, wb = walls(runs[ref.label]), walls(runs[ours.label])
        rows.append(Row(f"quant-real-{t.lower()}{'-imatrix' if use else ''}-t2",
                        f"quantize {os.path.basename(src)} ({size:.1f} GiB) → {t}{' with its imatrix' if use else ''}, "
                        "2 threads, whole process (wall, peak RSS)", f"{wa.fmt()}, {rss(runs[ref.label]):.0f} MB",
                        f"{wb.fmt()}, {rss(runs[ours.label]):.0f} MB", speed(wa.median, wb.median, "llama.cpp"),
                        same_tensors(a, b), cmds_of(ref, ours)))
        os.unlink(a), os.unlink(b)
    return rows


def calib_text(cfg) -> str:
    path = os.path.join(cfg.tmp("quant"), "calib.txt")
    with gzip.open(os.path.join(ROOT, "tests/fixtures/kernel-docs.txt.gz"), "rt", encoding="utf-8") as f:
        open(path, "w", encoding="utf-8").write(f.read(400_000))
    return path


def model_rows(cfg) -> list[Row]:
    from llmkit.llama.runtime import default_model_path

    model = default_model_path()
    text = calib_text(cfg)
    ctx, chunks = 256, cfg.pick(16, 4, 2)
    work = cfg.tmp("quant")
    rows = []
    perp = llama_bin("llama-perplexity")
    if perp:
        err = os.path.join(work, "perplexity.err")
        out = os.path.join(work, "ppl.json")
        ref = Cmd("llama-perplexity", [perp, "-m", model, "-f", text, "-c", ctx, "--chunks", chunks, "-t", 1, "-b", ctx],
                  stderr=err)
        ours = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "quant", "ppl", "-m", model, text, "-c", ctx, "--chunks", chunks,
                              "--threads", 1, "-b", ctx, "--json"], stdout=out)
        runs = compare([ref, ours], cfg, warmup=False)
        m = re.search(r"Final estimate: PPL = ([0-9.]+)", open(err, errors="replace").read())
        for _ in range(5):  # llama.cpp's async logger can lose its last lines at exit: rerun, untimed
            if m:
                break
            run_once(ref)
            m = re.search(r"Final estimate: PPL = ([0-9.]+)", open(err, errors="replace").read())
        ppl_ref = float(m.group(1)) if m else float("nan")
        ppl_ours = json.loads(open(out).read().strip().splitlines()[0]).get("ppl", float("nan"))
        wa, wb = walls(runs[ref.label]), walls(runs[ours.label])
        rows.append(Row("quant-ppl", f"perplexity of {os.path.basename(model)} on {chunks} × {ctx} tokens, 1 thread, "
                        "whole process", f"{wa.fmt()}, PPL {ppl_ref:.4f}", f"{wb.fmt()}, PPL {ppl_ours:.4f}",
                        speed(wa.median, wb.median, "llama.cpp"), f"PPL difference {abs(ppl_ref - ppl_ours):.4f}",
                        cmds_of(ref, ours)))
    else:
        rows.append(Row.skipped("quant-ppl", "perplexity", "llama-perplexity not built (scripts/build_llama_server.sh)"))
    imx = llama_bin("llama-imatrix")
    if imx:
        a, b = os.path.join(work, "imatrix-ref.gguf"), os.path.join(work, "imatrix-ours.gguf")
        ref = Cmd("llama-imatrix", [imx, "-m", model, "-f", text, "-o", a, "-c", ctx, "--chunks", chunks, "-t", 1,
                                    "-b", ctx])
        ours = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "quant", "imatrix", "-m", model, "--text", text, "-o", b, "-c",
                              ctx, "--chunks", chunks, "--threads", 1])
        runs = compare([ref, ours], cfg, warmup=False)
        ea, eb = (run_once(Cmd("entries", [PY, ME, "imatrix-entries", p])).report for p in (a, b))
        check = "same entry names" if ea["names"] == eb["names"] else \
            f"entries differ: {ea['n']} vs {eb['n']} ({len(set(ea['names']) ^ set(eb['names']))} names in one only)"
        wa, wb = walls(runs[ref.label]), walls(runs[ours.label])
        rows.append(Row("quant-imatrix", f"imatrix of {os.path.basename(model)}, {chunks} × {ctx} tokens, 1 thread, "
                        "whole process", wa.fmt(), wb.fmt(), speed(wa.median, wb.median, "llama.cpp"), check,
                        cmds_of(ref, ours)))
    else:
        rows.append(Row.skipped("quant-imatrix", "imatrix", "llama-imatrix not built (scripts/build_llama_server.sh)"))
    return rows


def rows(cfg):
    q = llama_bin("llama-quantize")
    if not q:
        return "llama.cpp tools vs llmkit quant", ["llama-quantize not built: run scripts/build_llama_server.sh"], []
    qrows, desc = quantize_rows(cfg, q)
    setup = [desc, "llama.cpp side: the binaries in ~/.cache/llmkit/llama-server-*/ (not the Python binding)",
             "text for perplexity/imatrix: first 400 kB of tests/fixtures/kernel-docs.txt.gz; model: the packaged "
             "SmolLM2-135M-Instruct Q4_1"]
    real = []
    if cfg.quant_model:
        real = real_rows(cfg, q)
        setup.append(f"quant-real-* rows: {cfg.quant_model}" + (f" with the imatrix {cfg.quant_imatrix}"
                                                                  if cfg.quant_imatrix else "") + " (run.py --quant-model)")
    return "llama.cpp tools vs llmkit quant", setup, qrows + real + model_rows(cfg)


if __name__ == "__main__":
    child(sys.argv[1:])
