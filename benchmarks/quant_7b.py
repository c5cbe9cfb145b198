"""A 7-8B model within this machine's memory (area quant-7b of quant_sections.py; not a test).

A random-weight F16 llama with Llama-3-8B's shapes (32 layers, 4096 hidden, 14336 FFN, GQA 8, 128256
vocabulary: 15 GiB), written by tests/ggufmake.write_llama_shaped into the work directory (give
--model-dir a disk with ~60 GB free: the model and two outputs at a time). One run a side (minutes
each), clock outside both, peak RSS of the whole process (GNU time), 2 threads:

- `q7b-<type>`: llama-quantize vs llmkit quant for Q8_0, Q6_K, Q4_K_M; check: files byte-identical.
- `q7b-imatrix`: llama-imatrix vs llmkit quant imatrix, same text, context and chunks; check: same entries.
- `q7b-<type>-imatrix`: IQ4_XS, IQ3_XXS, IQ2_M with llmkit's imatrix file on both sides.
- `q7b-target-size`: --target-size of llama-quantize's Q4_K_M file with the imatrix, against
  llama-quantize's plain Q4_K_M time; check: the file fits.
GPTQ on the same model is its own area, quant-7b-gptq (quant_7b_gptq.py): it takes over an hour.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BASE_ENV, PY, ROOT, Cmd, Row, cmds_of, llama_bin, run_once  # noqa: E402

ME = os.path.abspath(__file__)


def child(argv):
    if argv[0] == "build":  # PATH N_LAYER
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from ggufmake import LLAMA3_8B, write_llama_shaped

        write_llama_shaped(argv[1], **{**LLAMA3_8B, "n_layer": int(argv[2])})
    else:
        raise SystemExit(f"unknown child {argv[0]}")


def same_file(a: str, b: str) -> bool:
    return subprocess.run(["cmp", "-s", a, b]).returncode == 0


def side(r) -> str:
    return f"{r.wall_s:.0f} s, {r.rss_mb / 1024:.2f} GiB peak RSS"


def model_and_text(cfg) -> tuple[str, str, int]:
    """The Llama-3-8B-shaped model (written once into the work directory) and the calibration text."""
    d = cfg.work
    n_layer = cfg.pick(32, 32, 2)
    model = os.path.join(d, f"llama8b-shaped-{n_layer}l-f16.gguf")
    if not os.path.exists(model):
        run_once(Cmd("build", [PY, ME, "build", model, str(n_layer)]), timeout=7200)
    text = os.path.join(d, "calib.txt")
    with gzip.open(os.path.join(ROOT, "tests", "fixtures", "kernel-docs.txt.gz"), "rt", encoding="utf-8") as f:
        open(text, "w", encoding="utf-8").write(f.read()[:200_000])
    return model, text, n_layer


def rows(cfg):
    d = cfg.work
    model, text, n_layer = model_and_text(cfg)
    ref, ours = os.path.join(d, "ref.gguf"), os.path.join(d, "ours.gguf")
    llmkit = [PY, "-m", "llmkit", "-q", "quant"]
    out, times = [], {}

    def clean():
        for p in (ref, ours):
            if os.path.exists(p):
                os.unlink(p)

    def pair(rid, what, ftype, imatrix=None):
        imx = ["--imatrix", imatrix] if imatrix else []
        a = Cmd("llama-quantize", [llama_bin("llama-quantize"), *imx, model, ref, ftype, "2"])
        b = Cmd("llmkit", [*llmkit, model, "--type", ftype, *imx, "-o", ours, "-t", "2"])
        ra, rb = run_once(a, timeout=14400), run_once(b, timeout=14400)
        times[ftype] = ra.wall_s
        same = same_file(ref, ours)
        size = os.path.getsize(ref)
        clean()
        out.append(Row(rid, what, side(ra), side(rb), f"speed {ra.wall_s / rb.wall_s:.2f}× llama-quantize, "
                       f"memory {rb.rss_mb / ra.rss_mb:.2f}×", "output bytes identical" if same else "FILES DIFFER",
                       cmds_of(a, b)))
        return size

    fsize = os.path.getsize(model)
    what = f"{n_layer}-layer Llama-3-8B-shaped F16 ({fsize / 2**30:.1f} GiB)"
    for t in ("Q8_0", "Q6_K"):
        pair(f"q7b-{t.lower()}", f"quantize the {what} to {t}, 2 threads", t)
    q4_size = pair("q7b-q4_k_m", f"quantize the {what} to Q4_K_M, 2 threads", "Q4_K_M")

    chunks, n_ctx = cfg.pick(4, 4, 1), 256
    imx_ref, imx_ours = os.path.join(d, "imatrix-ref.gguf"), os.path.join(d, "imatrix-ours.gguf")
    a = Cmd("llama-imatrix", [llama_bin("llama-imatrix"), "-m", model, "-f", text, "-o", imx_ref, "-c", n_ctx, "-b", n_ctx,
                              "--chunks", chunks, "-t", "2", "--no-ppl"])
    b = Cmd("llmkit", [*llmkit, "imatrix", "-m", model, "--text", text, "-o", imx_ours, "-c", n_ctx,
                       "--chunks", chunks, "-t", "2"])
    ra, rb = run_once(a, timeout=14400), run_once(b, timeout=14400)
    from gguf import GGUFReader

    names = [sorted(t.name for t in GGUFReader(p).tensors) for p in (imx_ref, imx_ours)]
    out.append(Row("q7b-imatrix", f"imatrix of the {what}, {chunks} x {n_ctx} tokens of the kernel docs, 2 threads",
                   side(ra), side(rb), f"speed {ra.wall_s / rb.wall_s:.2f}× llama-imatrix, memory "
                   f"{rb.rss_mb / ra.rss_mb:.2f}×", "same entries" if names[0] == names[1] else "ENTRIES DIFFER",
                   cmds_of(a, b)))

    for t in ("IQ4_XS", "IQ3_XXS", "IQ2_M"):
        pair(f"q7b-{t.lower()}-imatrix", f"quantize the {what} to {t} with the imatrix, 2 threads", t, imx_ours)

    b = Cmd("llmkit", [*llmkit, model, "--target-size", str(q4_size), "--imatrix", imx_ours, "-o", ours, "-t", "2"])
    rb = run_once(b, timeout=14400)
    fits = os.path.getsize(ours) <= q4_size
    clean()
    out.append(Row("q7b-target-size", f"--target-size {q4_size:,} B (llama-quantize's Q4_K_M file) with the imatrix, "
                   f"the {what}, 2 threads", f"plain Q4_K_M: {times['Q4_K_M']:.0f} s", side(rb),
                   f"{rb.wall_s / times['Q4_K_M']:.2f}× llama-quantize's Q4_K_M time",
                   "fits the target" if fits else "OVER THE TARGET", cmds_of(b)))

    setup = [f"model: {what}, tests/ggufmake.write_llama_shaped (random weights, gpt2 vocabulary padded to 128256)",
             "llama.cpp side: the binaries the install built (llmkit.llama.tools), 2 threads",
             "one run a side (each takes minutes); clock outside; peak RSS of the whole process"]
    return "a 7-8B model (Llama-3-8B shapes, F16) within 24 GB", setup, out


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    child(sys.argv[1:])
