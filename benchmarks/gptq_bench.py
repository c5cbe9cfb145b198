"""GPTQ quality rows for run.py (not a test): `--method gptq` against llama.cpp's rounding with the same imatrix.

    python benchmarks/run.py --area quant-gptq --quant-model BASE-F16.gguf --quant-imatrix IMATRIX \
        --quant-calib CALIB.txt

Two kinds of rows, both on the text neither side calibrated on (the first 600k characters of Python's
standard library, as in quant-quality):
- gptq-m-<matrix>, gptq-m-geomean: `benchmarks/gptq_transfer.py --json` as a child process. Per
  weight matrix of layers 3/14/25 (attn_q, ffn_up, ffn_down), the output error tr(D H D^T) of GPTQ's
  Q2_K rounding as a fraction of llama.cpp's (round-to-nearest with the imatrix's weighted scale
  search), with H from 16 x 512 tokens of the calibration text and from 8 x 512 of the other text;
  shrink 0 (the plain algorithm), 3 (the default) and 10.
- gptq-q2_k-kld / gptq-q2_k-time: the whole model. The `llama-quantize` binary writes Q2_K with the
  imatrix; `llmkit quant --type Q2_K --method gptq --imatrix --calib` (16 chunks of 512 tokens, default
  shrinkage) writes llmkit's; both scored by `llmkit quant ppl --kld` against the F16 base on 16 x 256
  tokens of the other text. One run a side (the GPTQ run is ~45 minutes on 2 cores).

Quality figures do not depend on load; the time row does. About 70 minutes on 2 cores; not in --quick.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BENCH, PY, Cmd, Row, cmds_of, llama_bin, rss, run_once, walls  # noqa: E402
from quant_quality_bench import EVAL_CHUNKS, EVAL_CTX, eval_text, kld, kld_cells, kld_command  # noqa: E402

from llmkit.quant.rounding.gptq import SHRINK  # noqa: E402

DEFAULT = f"{SHRINK:g}"  # --method gptq's shrinkage when none is given
SHRINKS = f"0,{DEFAULT},10"
CALIB_CHUNKS = 16


def rows(cfg):
    q = llama_bin("llama-quantize")
    src, imx, calib = cfg.quant_model, cfg.quant_imatrix, cfg.quant_calib
    title = "GPTQ rounding vs llama.cpp's rounding with the same imatrix (quality on other text)"
    if not (q and src and imx and calib):
        why = "llama-quantize not built (scripts/build_llama_server.sh)" if not q else \
            "give --quant-model BASE-F16.gguf, --quant-imatrix IMATRIX and --quant-calib CALIB.txt"
        return title, [why], []
    work = cfg.tmp("quant-gptq")
    text = eval_text(work)
    chunks = cfg.pick(CALIB_CHUNKS, CALIB_CHUNKS, 1)
    out = []

    # per matrix: gptq_transfer.py as a whole process
    per = os.path.join(work, "transfer.json")
    layers = cfg.pick("3,14,25", "3,14,25", "3")
    t = Cmd("gptq_transfer", [PY, os.path.join(BENCH, "gptq_transfer.py"), src, "--imatrix", imx, "--calib", calib,
                              "--other", text, "--layers", layers, "--shrink", SHRINKS,
                              "--calib-chunks", chunks, "--json"], stdout=per)
    run_once(t, timeout=4 * 3600)
    res = json.loads(open(per, encoding="utf-8").read().strip().splitlines()[-1])
    shrinks = list(res["geomean_other"])
    for name, cells in res["matrices"].items():
        short = name.removesuffix(".weight")
        out.append(Row(f"gptq-m-{short}", f"{short} at {res['type']}: output error on calib / other text, "
                       "as a fraction of llama.cpp's (round-to-nearest + imatrix)", "1 / 1",
                       ", ".join(f"shrink {s}: {cells[s][0]:.3f} / {cells[s][1]:.3f}" for s in shrinks),
                       f"other text at the default shrink {DEFAULT}: {cells[DEFAULT][1]:.3f}×",
                       f"H from {res['calib_chunks']} × 512 calibration tokens", cmds_of(t)))
    g = res["geomean_other"]
    out.append(Row("gptq-m-geomean", f"geometric mean over the {len(res['matrices'])} matrices, other text", "1",
                   ", ".join(f"shrink {s}: {g[s]:.3f}" for s in shrinks),
                   f"{g[DEFAULT]:.3f}× at the default shrink {DEFAULT}", "", cmds_of(t)))

    # the whole model: Q2_K + imatrix from llama-quantize vs llmkit's GPTQ Q2_K
    base = os.path.join(work, "base.kld")
    mk_base = Cmd("setup: base log-probabilities", [PY, "-m", "llmkit", "-q", "quant", "ppl", "-m", src, "--save-logits",
                                                    base, text, "-c", EVAL_CTX, "--chunks", EVAL_CHUNKS])
    run_once(mk_base, timeout=4 * 3600)
    ref, ours = os.path.join(work, "llamacpp-Q2_K.gguf"), os.path.join(work, "llmkit-gptq-Q2_K.gguf")
    a = Cmd("llama-quantize", [q, "--imatrix", imx, src, ref, "Q2_K", 2])
    b = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "quant", src, "--type", "Q2_K", "--method", "gptq", "--imatrix", imx,
                       "--calib", calib, "-c", 512, "--chunks", chunks, "-o", ours,
                       "--threads", 2])
    ra, rb = run_once(a, timeout=4 * 3600), run_once(b, timeout=6 * 3600)
    wa, wb = walls([ra]), walls([rb])
    out.append(Row("gptq-q2_k-time", f"Q2_K + imatrix vs --method gptq (H from {chunks} × 512 tokens), "
                   f"{os.path.basename(src)}, 2 threads, whole process (wall, peak RSS), one run a side",
                   f"{wa.fmt()}, {rss([ra]):.0f} MB", f"{wb.fmt()}, {rss([rb]):.0f} MB",
                   f"{wb.median / wa.median:.2f}× llama-quantize's time",
                   f"peak RSS {rss([rb]) / (os.path.getsize(src) / 2**20):.2f}× the input file", cmds_of(a, b)))
    ka, kb = kld(ref, base, work), kld(ours, base, work)
    out.append(Row("gptq-q2_k-kld", f"mean KLD to the F16 base, Q2_K, {EVAL_CHUNKS} × {EVAL_CTX} tokens of Python's stdlib",
                   *kld_cells(ka, kb), f"sizes {os.path.getsize(ref):,} B vs {os.path.getsize(ours):,} B",
                   cmds_of(mk_base, a, b) + [kld_command(base)]))
    os.unlink(ref), os.unlink(ours)
    setup = [f"base: {src}; imatrix: {imx}; calibration text: {calib}; other text: the first 600k characters of "
             f"Python's standard library (*.py)",
             "llama.cpp side: the llama-quantize binary built by scripts/build_llama_server.sh, same imatrix, 2 threads",
             "llmkit side: --method gptq with the same imatrix, default shrinkage, Hessians from the calibration text"]
    return title, setup, out
